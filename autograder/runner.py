"""Running one test in a forked child (``--ag-isolate``), so the pytest process itself never
imports student code: an infinite loop (killed at the test's timeout), a crash (``os._exit``, a
segfault) or megabytes of prints (killed past ``--ag-output-limit``) fail that one test with a
readable message and grading goes on.

The child runs in its own process group and sends its pytest reports back as JSON through a pipe;
its stdout/stderr go through another pipe the parent reads while it waits. Every report gets the
test's output as ``ag_output``; a test that did not report gets one failed report whose
``ag_message`` says why.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time

import pytest

from autograder.points import item_timeout

OUTPUT_LIMIT = 1 << 20  # bytes a test may print before it is stopped
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


def run_forked(item: pytest.Item) -> list[pytest.TestReport]:
    if item.get_closest_marker("engine") is not None:
        from transformers import AutoTokenizer  # noqa: F401

        import minisgl.llm  # noqa: F401  (imported here once: every forked test starts warm)
    timeout = item_timeout(item)
    limit = item.config.getoption("ag_output_limit")
    sys.stdout.flush()
    sys.stderr.flush()
    result_r, result_w = os.pipe()
    output_r, output_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(result_r)
        os.close(output_r)
        _child(item, result_w, output_w)
    os.close(result_w)
    os.close(output_w)
    result, kept, printed, problem = bytearray(), bytearray(), 0, None
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
                problem = (
                    f"timed out after {timeout:g} s and was stopped: an infinite loop, or a loop whose "
                    "condition never changes? (a correct solution takes well under a second here)"
                )
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
    duration = time.monotonic() - start
    output = kept.decode(errors="replace")
    if printed > len(kept):
        output += f"\n... ({printed - len(kept)} more bytes of output not shown)"
    reports = []
    if problem is None and result:
        try:
            reports = [
                item.config.hook.pytest_report_from_serializable(config=item.config, data=d)
                for d in json.loads(result.decode())
            ]
        except (ValueError, KeyError) as e:
            problem = f"the test process sent back an unreadable result ({e})"
    if problem is None and not reports:
        problem = _describe_exit(status)
    if problem is not None:
        reports = [_failed_report(item, problem, duration)]
    for r in reports:
        if output.strip():
            r.sections.append(("Captured output", output))
        r.user_properties.append(("ag_output", output))
    return reports


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


def _failed_report(item: pytest.Item, message: str, duration: float) -> pytest.TestReport:
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
        user_properties=[("ag_message", message)],
    )
