"""What every student sees first: the grader on the untouched stubs (0 points, quickly, each test
saying what to implement), one summary line per lab before the details, and the exit codes.

Both editions run this file. Here (the instructor's edition) the hidden tests in autograder/hidden/
are graded too and a lab totals 100; in the student edition (``python -m autograder.release``) that
folder is absent, so a lab shows its 90 visible points and says that 10 more are in hidden tests.
"""

from __future__ import annotations

import os
import re
import sys

import pytest
from grading import Run, grade, run

from autograder.__main__ import known_labs
from autograder.points import HIDDEN_DIR, HIDDEN_POINTS, VISIBLE_POINTS

INSTRUCTOR = HIDDEN_DIR.is_dir()
LABS = sorted(known_labs())


# no tiny models: a stub fails before any model is loaded, and the student edition's run stays cheap
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def stubs(tmp_path_factory) -> Run:
    return grade([], ENV, tmp_path_factory.mktemp("stubs"), "stubs")


def test_stubs_score_zero_and_finish_quickly(stubs):
    run = stubs
    assert run.results is not None, f"the grader wrote no results.json for labs/\n{run.explain()}"
    passing = [n for n, t in run.tests().items() if t["status"] == "passed"]
    assert not passing, f"untouched stubs must score 0, but these tests pass on labs/: {passing}"
    not_stub = {n: t["output"] for n, t in run.tests().items() if "not implemented yet" not in t["output"]}
    assert not not_stub, f"every stub failure should say 'not implemented yet' (the student's hint): {not_stub}"
    assert run.returncode == 1, f"failed tests must give exit code 1\n{run.explain()}"
    # CPU time, not wall time: a busy machine must not fail this (it runs alone, so the count is its own).
    # ~10 s a lab: each lab's isolated run imports torch (~5 s); a stub caught in a hypothesis search or a
    # model load costs far more
    assert run.cpu_seconds < 10 * len(LABS), (
        f"grading the stubs of {len(LABS)} labs took {run.cpu_seconds:.0f} s of CPU; a stub must fail fast "
        "(hypothesis search?)"
    )
    assert "every lab starts red" in run.stdout
    per_lab = 100 if INSTRUCTOR else VISIBLE_POINTS
    assert run.results["score"] == 0 and run.results["max_score"] == per_lab * len(LABS), run.results["max_score"]
    shown = {t["visibility"] for t in run.results["tests"]}
    assert shown == ({"visible", "after_due_date"} if INSTRUCTOR else {"visible"}), shown


def test_one_summary_line_per_lab_then_the_details(stubs):
    """``python -m autograder`` opens with ``lab01    0/100  17 of 17 tests failing: ...``, one line per lab."""
    head, *rest = stubs.stdout.split("\n\n")
    lines = head.split("\n")
    assert [line.split()[0] for line in lines] == LABS, f"one summary line per lab first:\n{head}"
    hidden = "" if INSTRUCTOR else re.escape(f" (+{HIDDEN_POINTS:g} hidden)")
    total = 100 if INSTRUCTOR else VISIBLE_POINTS
    for line, lab in zip(lines, LABS):
        n = sum(t["name"].startswith(f"{lab}:") for t in stubs.results["tests"])
        pattern = rf"{lab}\s+0/{total:g}{hidden}  {n} of {n} tests failing: \w+"
        assert re.match(pattern, line) and len(line) <= 120, f"{line!r} does not match {pattern!r}"
    assert any(block.startswith(f"{known_labs()[LABS[0]]}  (labs)") for block in rest), "the tables follow"
    if not INSTRUCTOR:
        assert f"+{HIDDEN_POINTS:g} points in hidden tests" in stubs.stdout, "say that hidden tests exist"


def test_grader_errors_exit_2(tmp_path):
    unknown = run([sys.executable, "-m", "autograder", "lab99"], ENV)
    assert unknown.returncode == 2 and "unknown lab" in unknown.stderr, unknown.explain()
    missing = run([sys.executable, "-m", "autograder", "--impl", str(tmp_path / "nowhere")], ENV)
    assert missing.returncode == 2 and "not a folder" in missing.stderr, missing.explain()
    empty = run([sys.executable, "-m", "autograder", "--impl", str(tmp_path)], ENV)
    assert empty.returncode == 2 and "no lab files" in empty.stderr, empty.explain()
