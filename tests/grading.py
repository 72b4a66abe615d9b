"""Running the grader the way students, instructors and Gradescope do, for the autograder's own tests
(test_grading.py, test_autograder.py, test_gradescope.py, test_release.py): a command in a
subprocess, its exit code, output, time and the results.json it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    results: dict | None  # the --json file
    cpu_seconds: float = 0.0  # of the finished child processes; right only when no other run overlaps

    def tests(self) -> dict[str, dict]:
        return {t["name"]: t for t in self.results["tests"]}

    def explain(self) -> str:
        out, err = self.stdout[-6000:], self.stderr[-3000:]
        return f"exit code {self.returncode}\n--- stdout ---\n{out}\n--- stderr ---\n{err}"


def run(cmd: list[str], env: dict, json_path: Path | None = None, cwd: Path = REPO) -> Run:
    start, cpu = time.monotonic(), os.times()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    results = json.loads(json_path.read_text()) if json_path is not None and json_path.exists() else None
    end = os.times()
    used = end.children_user + end.children_system - cpu.children_user - cpu.children_system
    return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start, results, used)


def grade(args: list[str], env: dict, tmp: Path, key: str) -> Run:
    """``python -m autograder ARGS --json <tmp>/<key>.json``."""
    path = tmp / f"{key.replace(':', '_')}.json"
    return run([sys.executable, "-m", "autograder", *args, "--json", str(path)], env, path)
