"""A correct lab keeps every point on a machine that is busy with other work (instructor-only: it
grades solutions/). Two labs are graded side by side, engine tests included, while memory-bound
loops hold every core twice over: the grader's limits follow the machine's measured pace, and a
test starved of CPU is retried, so nothing here may fail for lack of time."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from grading import grade

pytestmark = [pytest.mark.instructor, pytest.mark.slow, pytest.mark.timeout(1800)]

# streams 64 MB again and again: the cache and memory bandwidth the tests need, taken away
LOOP = "import numpy as np\na = np.ones(1 << 23)\nwhile True:\n    a *= 1.0000001\n"
LABS = ["lab04", "lab07"]  # lab 04's solution lost 20 points at load 10-17 before limits followed the machine


def test_solutions_keep_every_point_under_heavy_load(grading_env, tmp_path):
    loops = [subprocess.Popen([sys.executable, "-c", LOOP]) for _ in range(2 * (os.cpu_count() or 2))]
    try:
        time.sleep(1.0)
        start = time.monotonic()
        run = grade([*LABS, "--impl", "solutions", "-j", "2"], grading_env, tmp_path, "loaded")
        seconds = time.monotonic() - start
    finally:
        for p in loops:
            p.kill()
            p.wait()
    assert run.results is not None, run.explain()
    failed = {t["name"]: t["output"][:600] for t in run.results["tests"] if t["status"] != "passed"}
    assert not failed, f"correct labs lost points under load ({seconds:.0f} s): {failed}\n{run.explain()}"
    assert run.results["score"] == 100 * len(LABS)
    print(f"graded {', '.join(LABS)} side by side under {len(loops)} memory-bound loops in {seconds:.0f} s")
