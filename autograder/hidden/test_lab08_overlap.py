"""Lab 08, hidden tests: what the loop hands ``wait`` and ``process``, over a longer schedule with idle steps
between batches (the visible tests check it over three steps; in the engine on a CPU the host copy is the
device tensor itself and there is nothing to wait for, so only the recording stand-in tells them apart). On
a GPU, ``process`` must read the host copy of *its* batch, after waiting on *its* copy."""

from __future__ import annotations

from autograder.points import points
from autograder.test_lab08_overlap import NO_WAIT, HostTokens, Ready, play, process_calls

SCRIPT = [True, True, False, True, True, False, False]


def expect_handed(part: int, kind: type, what: str, why: str) -> None:
    """Each process(batch) call got (``part`` 0: as its tokens; 1: in the wait before it) the object of type
    ``kind`` that to_host() returned for that batch."""
    trace = play(SCRIPT)
    for step, waited, j, tokens in process_calls(trace):
        got, want = (tokens, waited)[part], trace.phases.handed[j][part]
        assert got is want and isinstance(got, kind), (
            f"step {step}: {what} got {'nothing' if got is NO_WAIT else repr(got)}, expected what to_host() "
            f"returned for batch {j} ({want!r}): {why}"
        )


@points(5)
def test_waits_on_the_processed_batch():
    """The wait before process(batch) is on the ready that to_host() returned for that batch."""
    expect_handed(
        1,
        Ready,
        "the wait() before process(batch)",
        "waiting on another batch's copy (the one just launched) lets process read a copy that has not landed, "
        "or waits longer than it must",
    )


@points(5)
def test_processes_the_host_copy():
    """process(batch, tokens) gets the host tokens that to_host() returned for that batch, not the device ones."""
    expect_handed(
        0,
        HostTokens,
        "process(batch, tokens)",
        "keep to_host's first result pending, not launch's device tensor (reading that on the host waits for the "
        "device: one sync per step)",
    )
