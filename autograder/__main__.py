"""``python -m autograder [LAB ...] [--impl labs|PATH] [--json PATH] [--no-hidden]``

Grades each lab by running its pytest files (``autograder/test_labNN_*.py``, and the hidden tests in
``autograder/hidden/`` where that folder exists: the instructor's edition) in a subprocess with the
autograder plugin (every test forked, under a time limit), then prints one summary line per lab
(score, and which tests still fail) followed by a table per lab.

Exit code: 0 every test passed, 1 some test failed, 2 the grader could not run (unknown lab,
missing folder, broken test files).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from autograder import impl, pace, report
from autograder.points import HIDDEN_DIR

HERE = Path(__file__).resolve().parent
_TEST = re.compile(r"^test_(lab(\d\d)_[a-z0-9_]+)\.py$")


class GraderError(Exception):
    """The grader itself cannot run (exit code 2)."""


def note(line: str) -> None:
    """A line for the person waiting (stderr: stdout is the report)."""
    print(line, file=sys.stderr, flush=True)


def known_labs() -> dict[str, str]:
    """``{"lab06": "lab06_radix_cache", ...}`` for every lab that has tests."""
    out = {}
    for p in sorted(HERE.glob("test_lab*.py")):
        m = _TEST.match(p.name)
        if m:
            out[f"lab{m.group(2)}"] = m.group(1)
    return out


def pick_labs(names: list[str], folder: Path) -> list[str]:
    """Lab stems to grade: the named ones (``lab06``, ``06``, ``6``, ``lab06_radix_cache``), or
    every lab with tests whose file is in ``folder``."""
    labs = known_labs()
    if not names:
        found = [stem for stem in labs.values() if (folder / f"{stem}.py").exists()]
        if not found:
            raise GraderError(f"no lab files in {folder} (expected e.g. {', '.join(f'{s}.py' for s in labs.values())})")
        return found
    out = []
    for name in names:
        key = name.removesuffix(".py")
        m = re.fullmatch(r"(?:lab)?(\d{1,2})(?:_[a-z0-9_]+)?", key)
        stem = labs.get(f"lab{int(m.group(1)):02d}") if m else None
        if stem is None or (key.startswith("lab") and "_" in key and key != stem):
            raise GraderError(f"unknown lab {name!r}; labs with tests: {', '.join(labs)}")
        out.append(stem)
    return list(dict.fromkeys(out))


def lab_test_files(stem: str, hidden: bool) -> list[Path]:
    """The lab's visible test file, and with ``hidden`` its hidden one. In the instructor's edition
    (``autograder/hidden/`` exists) every lab must have one: its points complete the lab's 100."""
    files = [HERE / f"test_{stem}.py"]
    if hidden and HIDDEN_DIR.is_dir():
        extra = HIDDEN_DIR / f"test_{stem}.py"
        if not extra.exists():
            where = extra.relative_to(HERE.parent)
            raise GraderError(f"{stem} has no hidden tests: write {where} (see autograder/README.md)")
        files.append(extra)
    return files


PROGRESS_EVERY = 20.0  # seconds between two progress lines of a lab still being graded
STARTUP_S = 6.0  # a lab's grading process: Python, torch, the test files, the pace (reference machine)


def grade_lab(
    stem: str,
    folder: Path,
    timeout: float | None,
    verbose: bool,
    select: str | None = None,
    hidden: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run one lab's tests in a pytest subprocess; return its results file as a dict. While it runs,
    ``progress`` gets a line now and then ("lab01: 7 of 19 tests graded, 41 s")."""
    run = LabRun(stem, folder, timeout, verbose, select, hidden, progress)
    while (data := run.poll()) is None:
        time.sleep(0.05)
    return data


class LabRun:
    """One lab's pytest, started at once (a fork of this process where ``_FORK_PYTEST`` says so, else a
    fresh interpreter); ``poll()`` gives None while it runs, then its results as a dict (once)."""

    def __init__(self, stem: str, folder: Path, timeout: float | None, verbose: bool, select: str | None = None,
                 hidden: bool = True, progress: Callable[[str], None] | None = None):  # fmt: skip
        self.stem, self.verbose, self.select, self.progress = stem, verbose, select, progress
        self._tmp = tempfile.TemporaryDirectory(prefix="autograder-")
        self.results, self.ticks = Path(self._tmp.name) / "results.json", Path(self._tmp.name) / "progress"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            *map(str, lab_test_files(stem, hidden)),
            "-s",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(HERE.parent),
            "--impl",
            str(folder),
            "--ag-results",
            str(self.results),
            "--ag-progress",
            str(self.ticks),
        ]
        if hasattr(os, "fork"):  # elsewhere (Windows) tests run in-process under pytest-timeout
            cmd += ["--ag-isolate"]
        if timeout:
            cmd += ["--ag-timeout", str(timeout)]
        if select:
            cmd += ["-k", select]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", impl.ENV: str(folder)}
        # files, not pipes: nobody reads a pipe while the lab runs; what a test printed may not be UTF-8
        self._out = tempfile.TemporaryFile("w+", errors="replace")  # noqa: SIM115 (closed in poll)
        self._err = tempfile.TemporaryFile("w+", errors="replace")  # noqa: SIM115
        if _FORK_PYTEST[0]:
            self.proc = _ForkedPytest(cmd[3:], env, self._out, self._err)
        else:
            self.proc = subprocess.Popen(
                cmd, cwd=HERE.parent, env=env, stdin=subprocess.DEVNULL, stdout=self._out, stderr=self._err
            )
        self.start = self._last = time.monotonic()

    def poll(self) -> dict | None:
        if self.proc.poll() is None:
            if self.progress is not None and time.monotonic() - self._last >= PROGRESS_EVERY:
                self._last = time.monotonic()
                took = self._last - self.start
                self.progress(f"{self.stem.split('_')[0]}: {_progress(self.ticks)}, {took:.0f} s so far")
            return None
        try:
            for f in (self._out, self._err):
                f.seek(0)
            stdout, stderr = self._out.read(), self._err.read()
            if self.verbose:
                print(stdout[-20000:], stderr[-5000:], sep="\n")
            # pytest's exit codes 2..4: interrupted, internal error, usage error (bad @points totals...)
            if not self.results.exists() or self.proc.returncode in (2, 3, 4):
                tail = "\n".join((stdout + stderr).strip().split("\n")[-25:])
                raise GraderError(
                    f"pytest could not run the tests of {self.stem} (exit code {self.proc.returncode}):\n{tail}"
                )
            data = json.loads(self.results.read_text())
        finally:
            self.close()
        if data["errors"]:
            raise GraderError(f"the tests of {self.stem} could not be collected:\n" + "\n".join(data["errors"]))
        if not data["tests"] and not self.select:
            raise GraderError(f"no tests were collected for {self.stem}")
        return data

    def close(self) -> None:
        """Stop the run if it still runs; remove its files."""
        if self.proc.poll() is None:
            self.proc.kill()
        for f in (self._out, self._err):
            f.close()
        self._tmp.cleanup()


# Whether a LabRun's pytest is a forked child of this process rather than a fresh interpreter. main()
# turns it on where fork exists: the child starts with torch imported (this process imports it to
# measure the pace), which is most of a fresh pytest's start-up (~2 s a lab on the reference machine).
# The labs graded side by side (-j) are all started and polled from this one thread: fork and threads
# do not mix. What the child imports and runs is the same as in a fresh interpreter.
_FORK_PYTEST = [False]


class _ForkedPytest:
    """``pytest ARGS`` in a forked child, with ``subprocess.Popen``'s ``poll`` / ``returncode``: the
    child moves to the repository, takes ``env``, writes to ``out`` / ``err`` and reads nothing."""

    def __init__(self, args: list[str], env: dict[str, str], out, err):
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # or the child would write this process's pending output again
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid == 0:
            code = 3
            try:
                os.chdir(HERE.parent)
                os.environ.clear()
                os.environ.update(env)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the child never returns)
                sys.stdout = open(1, "w", closefd=False, buffering=1, errors="replace")  # noqa: SIM115
                sys.stderr = open(2, "w", closefd=False, buffering=1, errors="replace")  # noqa: SIM115
                import pytest

                code = int(pytest.main(args))
            except BaseException:  # noqa: BLE001  (reported through the exit code and stderr)
                import traceback

                traceback.print_exc()
            finally:
                for stream in (sys.stdout, sys.stderr):
                    stream.flush()
                os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        os.kill(self.pid, 9)
        self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])


def _progress(ticks: Path) -> str:
    """``"7 of 19 tests graded"`` from the plugin's progress file (a line per event)."""
    try:
        lines = ticks.read_text().split("\n")
    except OSError:
        return "starting"
    total = next((int(x.split()[1]) for x in lines if x.startswith("collected ")), None)
    done = sum(x.startswith("done ") for x in lines)
    return "collecting its tests" if total is None else f"{done} of {total} tests graded"


def estimate(stems: list[str], jobs: int, at_pace: float) -> str:
    """How long grading ``stems`` takes here at most (every test run to its end, as for a finished
    lab): the reference solution's recorded times (``timings.json``), at this machine's pace."""
    times = pace.reference_times()
    if not times:
        return ""
    per_lab = [
        STARTUP_S + sum(v for k, v in times.items() if k.startswith(stem.split("_")[0] + ": ")) for stem in stems
    ]
    seconds = sum(per_lab) * at_pace / max(1, min(jobs, len(stems)))
    shown = f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
    return f"at most about {shown} here (a lab whose functions still raise NotImplementedError takes seconds)"


def _graded(stems: list[str], jobs: int, start: Callable[[str], LabRun]):
    """``(stem, results)`` for every lab, each as soon as it is graded, ``jobs`` of them running at a
    time, each lab's pytest a fork of this process where fork exists (``_FORK_PYTEST``). A GraderError
    stops the others."""
    _FORK_PYTEST[0] = hasattr(os, "fork")
    if _FORK_PYTEST[0]:
        import torch  # noqa: F401  (once here, not in every lab's child; measuring the pace did already)

        # What is alive now (torch, pytest, hypothesis: no engine object) leaves the collector's scans, in
        # the children too: pytest's closing collections in each lab's process took ~0.8 s a lab of them
        gc.freeze()
    waiting, running = list(stems), []
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                running.append(start(waiting.pop(0)))
            for run in list(running):
                if (data := run.poll()) is not None:
                    running.remove(run)
                    yield run.stem, data
            time.sleep(0.05)
    finally:
        for run in running:
            run.close()


def print_hints(stems: list[str] | None) -> int:
    """The hints of ``stems`` (every lab: None), one block per lab: what each stub asks for, then how."""
    hints = json.loads((HERE / "hints.json").read_text()) if (HERE / "hints.json").exists() else {}
    for stem in stems or sorted(known_labs().values()):
        rows = hints.get(stem, [])
        print(
            f"{stem}: " + ("no hints (the docstring and the failing tests' messages are the guide)" if not rows else "")
        )
        for row in rows:
            print(f"  {row['where']}: {row['what']}\n    hint: {row['hint']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autograder", description="Grade the course labs.")
    ap.add_argument("labs", nargs="*", help="labs to grade (lab01, 06, lab06_radix_cache); default: all found")
    ap.add_argument("--impl", default="labs", help="folder of lab files to grade (default labs/, or any path)")
    ap.add_argument("--json", metavar="PATH", help="also write Gradescope's results.json here")
    ap.add_argument(
        "--no-hidden", dest="hidden", action="store_false", help="leave out autograder/hidden/ (what students run)"
    )
    ap.add_argument("--timeout", type=float, help="cap every test's time limit (seconds)")
    ap.add_argument("--memory-limit", type=float, help="GiB a test's processes may hold together (default 8)")
    ap.add_argument(
        "-k", dest="select", metavar="EXPR", help="only tests matching EXPR (pytest -k); scores count those"
    )
    ap.add_argument("-j", "--jobs", type=int, default=1, help="labs graded in parallel (default 1)")
    ap.add_argument("-v", "--verbose", action="store_true", help="show pytest's own output")
    ap.add_argument("--hint", action="store_true", help="print the labs' hints (how, in words) instead of grading")
    args = ap.parse_args(argv)
    if args.memory_limit:
        os.environ["MINISGL_AG_MEMORY_GIB"] = str(args.memory_limit)  # read by each lab's pytest process
    start = time.monotonic()
    try:
        if args.hint:
            return print_hints(pick_labs(args.labs, impl.resolve_folder(args.impl)) if args.labs else None)
        folder = impl.resolve_folder(args.impl)
        if not folder.is_dir():
            raise GraderError(f"{args.impl!r} is not a folder (looked for {folder})")
        stems = pick_labs(args.labs, folder)
        at_pace = pace.measure()
        how_long = estimate(stems, args.jobs, at_pace) if not args.select else ""
        note(
            f"grading {len(stems)} lab{'s' * (len(stems) != 1)} from {folder}"
            + (f": {how_long}" if how_long else "")
            + (f"; {pace.describe(at_pace)}" if at_pace >= 1.2 else "")
        )
        runs: dict[str, dict] = {}
        start_lab = lambda stem: LabRun(stem, folder, args.timeout, args.verbose, args.select, args.hidden, note)  # noqa: E731
        unprinted = list(stems)  # each lab's line as soon as it and the labs before it are graded
        for stem, data in _graded(stems, max(1, args.jobs), start_lab):  # a GraderError stops the run
            runs[stem] = data
            while unprinted and unprinted[0] in runs:
                tests = runs[unprinted.pop(0)]["tests"]
                if tests:
                    print(report.summary_line(tests), flush=True)
    except GraderError as e:
        print(f"autograder: {e}", file=sys.stderr)
        return 2
    tests = [t for stem in stems for t in runs[stem]["tests"]]
    if not tests:
        print(f"autograder: no test matches -k {args.select!r}", file=sys.stderr)
        return 2
    shown = os.path.relpath(folder) if not os.path.relpath(folder).startswith("..") else str(folder)
    by_lab = report.group_by_lab(tests)
    tables = [report.format_lab_table(stem, ts, shown) for stem, ts in by_lab.items()]
    score, total = report.lab_score(tests)
    print()
    print(*tables, f"total: {score:g} / {total:g}", sep="\n\n")
    if all(t["message"].startswith("not implemented yet") for t in tests):
        print("(every lab starts red: fill in the NotImplementedError parts of the lab file, then grade again)")
    if args.json:
        out = report.gradescope(tests, time.monotonic() - start, shown)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0 if all(t["outcome"] == "passed" for t in tests) else 1


if __name__ == "__main__":
    sys.exit(main())
