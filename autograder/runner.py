"""Running one test in a forked child (``--ag-isolate``), so the pytest process itself never
imports student code: an infinite loop (killed at the test's timeout), a crash (``os._exit``, a
segfault), megabytes of prints (killed past ``--ag-output-limit``) or gigabytes of memory (killed past
``--ag-memory-limit``, the test's processes together) fail that one test with a readable message and
grading goes on.

The child runs in its own process group and sends its pytest reports back as JSON through a pipe;
its stdout/stderr go through another pipe the parent reads while it waits. Every report gets the
test's output as ``ag_output``; a test that did not report gets one failed report whose
``ag_message`` says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
from dataclasses import dataclass

import pytest

from autograder import originality, pace
from autograder.points import item_points, item_timeout, lab_of, short_name

OUTPUT_LIMIT = 1 << 20  # bytes a test may print before it is stopped
# resident memory a test's processes may hold together, shared libraries counted in each (a lab 10 or 11
# engine test: the forked test, 2 ranks or a server's 3 processes, each with torch: ~1-2 GiB apiece)
MEMORY_LIMIT_GIB = 8.0
OUTPUT_KEEP = 4000  # bytes of a test's output kept for the report


def _child(item: pytest.Item, result_fd: int, output_fd: int) -> None:
    """Runs in the forked process; never returns."""
    code = 0
    try:
        os.setpgid(0, 0)  # its own process group, so a timeout kills anything it started too
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        from _pytest.runner import runtestprotocol

        reports = runtestprotocol(item, log=False)
        hook = item.config.hook
        data = json.dumps([hook.pytest_report_to_serializable(config=item.config, report=r) for r in reports])
        payload = data.encode()
        view = memoryview(payload)
        while view:
            view = view[os.write(result_fd, view) :]
    except BaseException:
        code = 70
        try:
            import traceback

            traceback.print_exc()  # into the output pipe: shown with the failed test
        except BaseException:
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        os._exit(code)


CPU_BOUND = 0.75  # share of its wall time a timed-out test had the CPU for: computing, not starved


@dataclass
class Attempt:
    """One forked run of a test: its reports, or why it has none (``problem``), and what it used."""

    reports: list[pytest.TestReport]
    problem: str | None
    timed_out: bool
    seconds: float
    cpu_seconds: float | None  # of the test's process and everything it started; None if unknown
    output: str
    refused: bool = False  # ``problem`` is a refusal of originality.py (in any of the test's processes)


def run_forked(item: pytest.Item) -> list[pytest.TestReport]:
    """The test in a forked child under its time limit (``points.item_timeout``: scaled to this
    machine's pace). A test that runs out of time without having had the CPU for most of it (it was
    waiting: for a busy machine, a server, a subprocess) is retried once, after measuring the pace
    again, with twice the larger limit; one that was computing all along is not (an infinite loop
    fails at its limit)."""
    if item.get_closest_marker("engine") is not None:
        from transformers import AutoTokenizer  # noqa: F401

        import minisgl.llm  # noqa: F401  (imported here once: every forked test starts warm)
    first_pace = pace.current()
    limit = item_timeout(item, first_pace)
    attempt = _attempt(item, limit)
    problem = attempt.problem
    if attempt.timed_out:
        problem = _timeout_message(item, limit, first_pace, attempt)
        if attempt.cpu_seconds is None or attempt.cpu_seconds < CPU_BOUND * attempt.seconds:
            first = attempt
            second_pace = pace.measure()  # the load may have changed since the process started
            retry_limit = 2 * max(limit, item_timeout(item, second_pace))
            attempt = _attempt(item, retry_limit)
            problem = attempt.problem
            if attempt.timed_out:
                problem = (
                    f"{_timeout_message(item, retry_limit, second_pace, attempt, retried=True)}\n"
                    f"(its first try stopped at {limit:.0f} s{_cpu_note(first)}; the grader measured the machine "
                    "again and retried once with a longer limit)"
                )
    reports = attempt.reports
    if problem is not None:
        reports = [failed_report(item, problem, attempt.seconds, refused=attempt.refused)]
    for r in reports:
        if attempt.output.strip():
            r.sections.append(("Captured output", attempt.output))
        r.user_properties.append(("ag_output", attempt.output))
    return reports


def _cpu_note(attempt: Attempt) -> str:
    if attempt.cpu_seconds is None:
        return ""
    return f", having had the CPU for {attempt.cpu_seconds:.0f} s of it"


def _timeout_message(item: pytest.Item, limit: float, at_pace: float, attempt: Attempt, retried: bool = False) -> str:
    """What a student reads when a test ran out of time: only what was measured."""
    declared = item_points(item)[1]
    text = f"timed out: stopped at its time limit, {limit:.0f} s on this machine"
    if item.config.getoption("ag_timeout") and limit <= 2 * item.config.getoption("ag_timeout"):
        text += " (the --timeout cap)"
    else:
        text += f" ({declared:g} s on the course's reference machine; {pace.describe(at_pace)}"
        text += ", doubled for a second try)" if retried else ")"
    ref = pace.reference_times().get(f"{lab_of(item)[0]}: {short_name(item)}") if lab_of(item) else None
    if ref is not None:
        text += f"; the reference solution takes {ref:.1f} s for this test on the reference machine"
    if attempt.cpu_seconds is None:
        return text + ". An infinite loop, or a loop whose condition never changes?"
    text += f". It had the CPU for {attempt.cpu_seconds:.0f} s of its {attempt.seconds:.0f} s"
    if attempt.cpu_seconds >= CPU_BOUND * attempt.seconds:
        return text + ": it was computing the whole time. An infinite loop, or a loop whose condition never changes?"
    return text + ": it was mostly waiting (for another process it started, a lock, a sleep, or a busy machine)"


def _attempt(item: pytest.Item, timeout: float) -> Attempt:
    limit = item.config.getoption("ag_output_limit")
    memory_limit = item.config.getoption("ag_memory_limit") * 2**30
    sys.stdout.flush()
    sys.stderr.flush()
    result_r, result_w = os.pipe()
    output_r, output_w = os.pipe()
    # where the test's processes (this child, a server, a TP rank) write a refusal (originality.py): once
    # one is there the test has failed, whatever it does next, so it is stopped (a refused server process
    # would otherwise leave its client waiting for its time limit)
    found = originality.name_found_file()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(result_r)
        os.close(output_r)
        _child(item, result_w, output_w)
    os.close(result_w)
    os.close(output_w)
    result, kept, printed, problem, timed_out, cpu = bytearray(), bytearray(), 0, None, False, None
    engine_reference = False
    open_fds = {result_r, output_r}
    deadline = start + timeout
    status = None
    try:
        while open_fds or status is None:
            left = deadline - time.monotonic()
            if status is not None and left > 1.0:  # it exited; something it started may hold the pipes
                deadline, left = time.monotonic() + 1.0, 1.0
            if left <= 0 and status is not None:
                break
            if left <= 0:
                timed_out, cpu = True, _tree_cpu_seconds(pid)
                break
            if open_fds:
                ready, _, _ = select.select(list(open_fds), [], [], min(left, 0.5))
                for fd in ready:
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        open_fds.discard(fd)
                        os.close(fd)
                    elif fd == result_r:
                        result += chunk
                    else:
                        printed += len(chunk)
                        kept += chunk[: max(0, OUTPUT_KEEP - len(kept))]
                if printed > limit:
                    problem = (
                        f"printed more than {limit // 1024} KiB and was stopped: remove debug prints "
                        "(or print less inside loops)"
                    )
                    break
                refused = originality.found_elsewhere()
                if refused:
                    problem, engine_reference = refused[0], True
                    break
                held = _tree_rss(pid)
                if held is not None and held > memory_limit:
                    problem = (
                        f"held more than {memory_limit / 2**30:g} GiB of memory ({held / 2**30:.1f} GiB) and was "
                        "stopped: a list, dict or tensor that grows without end (a loop whose condition never changes?)"
                    )
                    break
            else:
                time.sleep(0.01)
            if status is None:
                done, st = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = st
                    if not open_fds:
                        break
    finally:
        if status is None:
            _kill_group(pid)
            _, status = os.waitpid(pid, 0)
        else:
            _kill_group(pid, only_others=True)
        for fd in open_fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.remove(found)
    duration = time.monotonic() - start
    output = kept.decode(errors="replace")
    if printed > len(kept):
        output += f"\n... ({printed - len(kept)} more bytes of output not shown)"
    reports: list[pytest.TestReport] = []
    if problem is None and not timed_out and result:
        try:
            reports = [
                item.config.hook.pytest_report_from_serializable(config=item.config, data=d)
                for d in json.loads(result.decode())
            ]
        except (ValueError, KeyError) as e:
            problem = f"the test process sent back an unreadable result ({e})"
    if problem is None and not timed_out and not reports:
        problem = _describe_exit(status)
    return Attempt(reports, problem, timed_out, duration, cpu, output, engine_reference)


def _tree_rss(pid: int) -> int | None:
    """Resident bytes of process ``pid`` and every live process it started (None where psutil cannot tell)."""
    try:
        import psutil

        root = psutil.Process(pid)
        total = 0
        for p in [root, *root.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total
    except Exception:
        return None


def _tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds used so far by process ``pid`` and every live process it started (psutil; None
    where it cannot tell)."""
    try:
        import psutil

        root = psutil.Process(pid)
        total = 0.0
        for p in [root, *root.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
            except psutil.Error:
                pass
        return total
    except Exception:
        return None


def _kill_group(pid: int, only_others: bool = False) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        if not only_others:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _describe_exit(status: int | None) -> str:
    if status is None:
        return "the test process vanished"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        return f"the test process crashed (signal {name}) before the test finished"
    code = os.WEXITSTATUS(status)
    return (
        f"the test process exited with code {code} before the test finished: "
        "does your code call os._exit() or sys.exit(), or close stdout?"
    )


def failed_report(item: pytest.Item, message: str, duration: float, refused: bool = False) -> pytest.TestReport:
    """``refused``: ``message`` is a refusal (the engine's own code was used), which zeroes the lab."""
    return pytest.TestReport(
        nodeid=item.nodeid,
        location=item.location,
        keywords={k: 1 for k in item.keywords},
        outcome="failed",
        longrepr=message,
        when="call",
        sections=[],
        duration=duration,
        start=time.time() - duration,
        stop=time.time(),
        user_properties=[("ag_message", message)] + ([("ag_engine_reference", message)] if refused else []),
    )
