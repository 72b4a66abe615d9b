"""What every student sees first: the grader on the untouched stubs (0 points, quickly, each test
saying what to implement), one summary line per lab before the details, and the exit codes.

Both editions run this file. Here (the instructor's edition) the hidden tests in autograder/hidden/
are graded too and a lab totals 100; in the student edition (``python -m autograder.release``) that
folder is absent, so a lab shows its 90 visible points and says that 10 more are in hidden tests.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

import pytest
from grading import REPO, Run, grade, run

from autograder.__main__ import known_labs
from autograder.points import HIDDEN_DIR, HIDDEN_POINTS, VISIBLE_POINTS

INSTRUCTOR = HIDDEN_DIR.is_dir()
LABS = sorted(known_labs())


# no tiny models: a stub fails before any model is loaded, and the student edition's run stays cheap
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def stubs(tmp_path_factory) -> Run:
    # The C++ CPU kernels are compiled once per checkout (~35 s of g++; tvm_ffi keys its cache by the
    # include path, so the student edition's copy builds its own): a lab test that builds an engine before
    # it reaches the stub would count that one-time build as the stub's cost. Build it first.
    warm = run([sys.executable, "-c", "from minisgl.kernels import jit; jit.cpu_module()"], ENV, cwd=REPO)
    assert warm.returncode == 0, warm.explain()
    return grade(["-j", "2"], ENV, tmp_path_factory.mktemp("stubs"), "stubs")  # two labs at a time, lines in order


def test_stubs_score_zero_and_finish_quickly(stubs):
    run = stubs
    assert run.results is not None, f"the grader wrote no results.json for labs/\n{run.explain()}"
    passing = [n for n, t in run.tests().items() if t["status"] == "passed"]
    assert not passing, f"untouched stubs must score 0, but these tests pass on labs/: {passing}"
    not_stub = {n: t["output"] for n, t in run.tests().items() if "not implemented yet" not in t["output"]}
    assert not not_stub, f"every stub failure should say 'not implemented yet' (the student's hint): {not_stub}"
    assert run.returncode == 1, f"failed tests must give exit code 1\n{run.explain()}"
    # CPU time, not wall time: a busy machine must not fail this (it runs alone, so the count is its own).
    # 12 s a lab: each lab's isolated run imports torch (~5 s); 14 stubs measured 147 s (10.5 a lab) at load
    # 3. A stub caught in a hypothesis search or a model load costs tens of seconds more
    assert run.cpu_seconds < 12 * len(LABS), (
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


# ---- time limits that follow the machine (autograder/pace.py) -----------------------------------------
def _grade_file(tmp_path, lab_text: str, stem: str, extra: list[str], env: dict) -> list[dict]:
    """One lab's visible tests graded directly by pytest with the grader's plugin; its records."""
    folder = tmp_path / "graded"
    folder.mkdir(exist_ok=True)
    (folder / f"{stem}.py").write_text(lab_text)
    results = tmp_path / "records.json"
    cmd = [sys.executable, "-m", "pytest", f"autograder/test_{stem}.py", "-s", "-q", "-p", "no:cacheprovider"]
    cmd += ["--impl", str(folder), "--ag-isolate", "--ag-results", str(results), *extra]
    done = run(cmd, env)
    assert results.exists(), done.explain()
    return json.loads(results.read_text())["tests"]


def test_every_limit_scales_with_the_pace(tmp_path):
    """A machine ten times slower than the reference machine (forced: MINISGL_AG_PACE=10) gets every
    test's limit ten times longer, the engine tests' and servers' included."""
    # one lab at each pace (a grading run costs ~10 s): lab 11's limits include its servers'
    for lab, stem, pace, want in (("lab07", "lab07_chunking", "10", 10.0), ("lab11", "lab11_detokenizer", "2.5", 2.5)):
        stub = (REPO / "labs" / f"{stem}.py").read_text()
        records = _grade_file(tmp_path, stub, stem, ["-k", "not engine"], {**ENV, "MINISGL_AG_PACE": pace})
        assert records, f"no tests of {stem} were graded"
        scaled = [(r["name"], r["declared_limit"], r["limit"]) for r in records]
        wrong = {name: (declared, limit) for name, declared, limit in scaled if limit != want * declared}
        assert not wrong, f"{lab} at pace {pace}: these limits are not {want} x the declared ones: {wrong}"


def test_a_starved_test_is_retried_a_computing_one_is_not(tmp_path):
    """A test that timed out while waiting (here: sleeping) is retried once with a longer limit and
    then fails saying both tries; one that computed the whole time (an infinite loop) fails at its
    limit, not retried, and says it was computing."""
    stub = (REPO / "labs" / "lab07_chunking.py").read_text()
    raises = [line for line in stub.splitlines() if "raise NotImplementedError" in line]
    budget, extend = raises[0], raises[1]  # budget() first, then extend_end()
    pad = budget[: len(budget) - len(budget.lstrip())]
    text = stub.replace(budget, f"{pad}import time\n{pad}time.sleep(1000)")
    text = text.replace(extend, f"{pad}while True:\n{pad}    pass")
    start = time.monotonic()
    records = _grade_file(
        tmp_path, text, "lab07_chunking", ["--ag-timeout", "2", "-k", "budget_busy or whole_prompt"], ENV
    )
    by_name = {r["name"]: r for r in records}
    sleeper, looper = (
        by_name["budget_busy_while_decoding_idle_when_not"],
        by_name["extend_end_whole_prompt_when_it_fits"],
    )
    assert sleeper["outcome"] == looper["outcome"] == "failed"
    assert "mostly waiting" in sleeper["message"] and "first try stopped at 2 s" in sleeper["message"], sleeper
    assert "computing the whole time" in looper["message"] and "first try" not in looper["message"], looper
    assert "well under a second" not in sleeper["message"] + looper["message"], "never claim an unmeasured speed"
    assert 2 <= looper["duration"] < 10, f"an infinite loop must fail at its limit (2 s), not {looper['duration']} s"
    assert time.monotonic() - start < 90


def test_servers_and_ranks_wait_longer_on_a_slower_machine(monkeypatch, tmp_path):
    """The limits inside tests follow the pace too: lab 11's servers get pace x 150 s to become ready,
    lab 10's ranks pace x their start, check and collective limits."""
    from autograder import pace, tp_ranks
    from autograder.adapters import lab11

    monkeypatch.setenv(pace.ENV, "10")
    pace.measure()
    waited: list[tuple[float, str]] = []

    class FakeServer:
        def __init__(self, model, detokenizer, folder):
            pass

        def wait_ready(self, deadline: float, what: str) -> None:
            waited.append((deadline - time.monotonic(), what))

        def stop(self) -> None:
            pass

    monkeypatch.setattr(lab11, "Server", FakeServer)
    with lab11.servers(tmp_path):
        pass
    assert len(waited) == 2 and all(1490 < left <= 1500 for left, _ in waited), waited
    assert waited[0][1].startswith("1500 s (150 s on the course's reference machine"), waited[0][1]
    spawned = {}

    class FakeProcess:
        exitcode = 0

        def __init__(self, target, args, daemon):
            spawned["at_pace"] = args[-1]

        def start(self):
            pass

        def is_alive(self):
            return False

        def join(self, timeout=None):
            pass

    class FakeContext:
        Process = FakeProcess

    import torch.multiprocessing as mp

    monkeypatch.setattr(mp, "get_context", lambda kind: FakeContext)
    verdicts = tp_ranks._spawn_once(["a check"], 2, tmp_path)
    assert spawned["at_pace"] == 10.0, "the ranks' gloo timeout must be scaled by the pace they are given"
    assert f"did not start within {10 * tp_ranks.START_S:.0f} s" in verdicts["a check"], verdicts
    monkeypatch.delenv(pace.ENV)
    pace.measure()


# ---- lab 13's speed check on a busy machine -------------------------------------------------------------
def _spin(ms: float) -> None:
    """Compute for ``ms`` milliseconds of this process's CPU time."""
    end = time.process_time() + ms / 1e3
    while time.process_time() < end:
        pass


def test_lab13_speed_is_timed_again_after_a_burst_of_load():
    """A correct kernel that another process slowed in the first attempt (here: 3x slower for that
    attempt's calls) passes on the next attempt; a kernel at 0.9x the torch version fails after every
    attempt, each at its own speed-up, and no attempt begins once the budget is spent."""
    from autograder.test_lab13_jit_kernel import speed_attempts

    calls = [0]

    def burst_then_fast():
        calls[0] += 1
        _spin(1.5 if calls[0] <= 5 * 15 else 0.5)  # the first attempt: 5 rounds of 15 calls

    def torch_version():
        _spin(1.0)

    tried = speed_attempts(burst_then_fast, (torch_version,), need=1.25, pause=0)
    speedups = [t / k for k, t in tried]
    assert len(tried) == 2 and speedups[0] < 1 and speedups[1] > 1.6, speedups

    tried = speed_attempts(lambda: _spin(1.1), (torch_version,), need=1.25, attempts=3, pause=0)
    speedups = [t / k for k, t in tried]
    assert len(tried) == 3 and all(0.8 < s < 1.0 for s in speedups), speedups
    tried = speed_attempts(lambda: _spin(1.1), (torch_version,), need=1.25, pause=0, budget_s=0)
    assert len(tried) == 1, "no attempt begins after the budget"


def test_lab13_speed_counts_the_kernels_cpu_time_not_the_wait():
    """Time the process spends off the CPU (another process has the core; here: a sleep) is not the
    kernel's: a kernel that computes 0.5 ms and waits 3 ms is 2x a torch version computing 1 ms."""
    from autograder.test_lab13_jit_kernel import speed_attempt

    def waits():
        time.sleep(0.003)
        _spin(0.5)

    k_ms, t_ms = speed_attempt(waits, (lambda: _spin(1.0),), rounds=3)
    assert 1.6 < t_ms / k_ms < 2.2 and k_ms < 1.0, (k_ms, t_ms)


def test_each_lab_line_comes_as_that_lab_is_graded():
    """``python -m autograder`` prints a lab's summary line when that lab is done, not after every lab:
    the first line arrives while the next lab is still being graded, after a header on stderr that says
    how many labs it grades."""
    import subprocess

    cmd = [sys.executable, "-m", "autograder", "lab07", "lab12", "--no-hidden"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        still_running = proc.poll() is None
        rest, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert first.startswith("lab07 ") and "tests failing" in first, first
    assert still_running, "the first lab's line must come before the grader has finished the next lab"
    assert rest.startswith("lab12 "), rest[:200]
    assert any(line.startswith("grading 2 labs from ") for line in err.splitlines()), err[:300]
