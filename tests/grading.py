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


# A process that has imported what every grading run imports first (torch, hypothesis, pytest, numpy:
# ~3 s of a mutant's run on the reference machine, most of a run that grades a few tests) and forks a
# child per run, which runs ``python -m autograder``'s main() as that command would. Only third-party
# modules are imported ahead: minisgl and the autograder read the environment of the run when imported.
_SERVER = r"""
import json, os, signal, sys, time, traceback
import hypothesis, numpy, pytest, torch  # noqa: F401
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(900)  # as run()'s timeout: a run that hangs is killed
            os.chdir(job["cwd"])
            os.environ.clear()
            os.environ.update(job["env"])
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            sys.stdin = open(0, closefd=False)
            sys.stdout = open(1, "w", closefd=False, buffering=1, errors="replace")
            sys.stderr = open(2, "w", closefd=False, buffering=1, errors="replace")
            sys.argv = [sys.executable, "-m", "autograder", *job["args"]]
            from autograder.__main__ import main
            code = main(job["args"])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status, usage = os.wait4(pid, 0)
    reply = {"returncode": os.waitstatus_to_exitcode(status), "cpu": usage.ru_utime + usage.ru_stime}
    print(json.dumps(reply), flush=True)
"""


class ForkServer:
    """``grade()`` through a warm process (``_SERVER``): the same command, run by a fork of it."""

    def __init__(self, env: dict):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER], cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def grade(self, args: list[str], env: dict, tmp: Path, key: str) -> Run:
        stem = tmp / key.replace(":", "_")
        path, out, err = (Path(f"{stem}{suffix}") for suffix in (".json", ".out", ".err"))
        args = [*args, "--json", str(path)]
        job = {"args": args, "env": env, "cwd": str(REPO), "stdout": str(out), "stderr": str(err)}
        start = time.monotonic()
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the grading fork server died (exit code {self.proc.wait()}) while grading {key}")
        reply = json.loads(line)
        results = json.loads(path.read_text()) if path.exists() else None
        text = lambda p: p.read_text(errors="replace") if p.exists() else ""  # noqa: E731
        return Run(reply["returncode"], text(out), text(err), time.monotonic() - start, results, reply["cpu"])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
