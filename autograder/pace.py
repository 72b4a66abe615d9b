"""Time limits that follow the machine.

Every limit a lab test declares (``@points(n, timeout=60)``, a server's start-up wait, a rank's
check) is set for the course's **reference machine**: the 2-core CI machine, quiet. A student's
laptop, a shared grader or a machine busy with other work runs the same code several times slower,
and a correct lab must not lose points for that. So the grader measures this machine first:

* **The calibration** is a fixed piece of the kind of work the tests do (Python loops over dicts
  and lists, small torch ops, a memory-bound sweep), timed here, best of three, and divided by the
  time it took on the reference machine (``REFERENCE_SECONDS``). That ratio, at least 1, is the
  **pace** of this machine: every limit is multiplied by it (``scaled``). Each grading process
  measures it once at start-up (~0.5 s); ``MINISGL_AG_PACE=10`` sets it instead (a test uses that
  to check that every limit scales).
* **A test that runs out of time is retried once**, unless it had the CPU for most of that time
  (then it was computing, not waiting for a busy machine: an infinite loop is not retried and
  fails at its limit). Before the retry the pace is measured again, since the load may have
  changed, and the retry gets twice the larger of the two scaled limits.
* **The message says what was measured**: the limit here, the pace behind it, how much CPU time
  the test had, and (where ``timings.json`` records it) how long the reference solution takes on
  the reference machine. It never guesses how fast a correct solution "should" be.
"""

from __future__ import annotations

import json
import os
import time
from functools import cache
from pathlib import Path

ENV = "MINISGL_AG_PACE"  # a number: use it as the pace instead of measuring
# the calibration's best-of-three time on the reference machine (the 2-core CI machine, quiet,
# one torch thread): measured there with `python -c "from autograder import pace; print(pace.calibrate())"`
REFERENCE_SECONDS = 0.105
TIMINGS = Path(__file__).resolve().parent / "timings.json"
_current: float | None = None


def calibrate(rounds: int = 3) -> float:
    """Seconds this machine takes for the calibration workload now (the fastest of ``rounds``:
    other processes only ever add time, so the fastest round is the least disturbed)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in every grading process
    try:
        best = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            _workload(torch)
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return best


def _workload(torch) -> None:
    table: dict[int, int] = {}
    for i in range(300_000):  # the schedulers, caches and simulators the tests drive are Python loops
        table[i % 977] = table.get(i % 613, 0) + i
    x = torch.full((48, 48), 0.01)
    for _ in range(4_000):  # small tensor ops: per-call overhead, as in the engine's steps on tiny models
        x = torch.tanh(x @ x)
    sweep = torch.ones(1 << 23)
    for _ in range(40):  # memory-bound passes over 32 MB, as a decode step reads its weights
        sweep.mul_(1.0)


def measure() -> float:
    """This machine's pace now: how many times slower than the reference machine it runs the
    calibration (at least 1), or the value of ``$MINISGL_AG_PACE``. Also becomes ``current()``."""
    global _current
    forced = os.environ.get(ENV)
    if forced:
        try:
            value = float(forced)
        except ValueError:
            raise ValueError(
                f"${ENV} must be a number (how many times slower this machine is), got {forced!r}"
            ) from None
        if not value > 0:
            raise ValueError(f"${ENV} must be positive, got {forced!r}")
    else:
        value = calibrate() / REFERENCE_SECONDS
    _current = max(1.0, value)
    return _current


def current() -> float:
    """The pace last measured in this process (measured now if never)."""
    return _current if _current is not None else measure()


def scaled(seconds: float) -> float:
    """A limit set for the reference machine, on this machine."""
    return seconds * current()


def describe(pace: float | None = None) -> str:
    """``"this machine's pace: 3.1 (the calibration ran 3.1x slower here...)"`` for a message."""
    pace = current() if pace is None else pace
    if os.environ.get(ENV):
        return f"limits here are {pace:.1f}x those (${ENV}={os.environ[ENV]})"
    if pace <= 1.0:
        return "this machine ran the grader's calibration at least as fast, so the same limits"
    return f"this machine ran the grader's calibration {pace:.1f}x slower, so limits {pace:.1f}x longer"


@cache
def reference_times() -> dict[str, float]:
    """``{"lab06: insert_then_match": 0.4, ...}``: how long each test took the reference solution
    on the reference machine (``python -m autograder.timings`` records them); empty if unrecorded."""
    try:
        return {k: float(v) for k, v in json.loads(TIMINGS.read_text())["tests"].items()}
    except (OSError, ValueError, KeyError):
        return {}
