"""The autograder's pytest plugin (wired in by ``autograder/conftest.py``).

* **Points.** ``@points(10)`` next to a test declares what it is worth; the tests of one lab file
  (``test_labNN_*.py``) must total 100, or a graded run (``--ag-results``) refuses to start.
  Partial credit is per test.
* **Isolation** (``--ag-isolate``, what ``python -m autograder`` uses; needs ``-s``). Each test runs
  in a forked child: the pytest process itself never imports student code, so an infinite loop
  (killed at the test's timeout), a crash (``os._exit``, a segfault) or megabytes of prints
  (killed past ``--ag-output-limit``) fail that one test with a readable message and grading
  goes on. The child sends its pytest reports back as JSON through a pipe; its stdout/stderr go
  through another pipe the parent reads while it waits.
* **Messages.** Each failure gets a short explanation for the student (``ag_message``): the
  assertion text, "not implemented yet" for a stub, or the exception and the line of the lab
  file that raised it.
* **Results.** ``--ag-results PATH`` writes one JSON record per test (lab, name, points, outcome,
  message, output, duration), which ``python -m autograder`` turns into scores.

Without ``--ag-isolate`` (a student running ``pytest autograder -k lab06``) tests run in-process
as usual, each under pytest-timeout with its declared timeout, and a score summary is printed.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import sys
import time
from pathlib import Path

import pytest

DEFAULT_TIMEOUT = 60.0  # seconds per test
OUTPUT_LIMIT = 1 << 20  # bytes a test may print before it is stopped
OUTPUT_KEEP = 4000  # bytes of a test's output kept for the report
MESSAGE_LINES = 14

_TEST_FILE = re.compile(r"^test_(lab(\d\d)_[a-z0-9_]+)\.py$")


def points(value: float, *, timeout: float = DEFAULT_TIMEOUT) -> pytest.MarkDecorator:
    """Declare what a test is worth (and its time limit in seconds)."""
    return pytest.mark.points(value, timeout=timeout)


# marks a test that builds a minisgl.LLM: before forking it the parent imports transformers (the
# tokenizer) once, so each such test does not pay seconds of imports; stub-only runs never do
engine = pytest.mark.engine


# ---- per-test metadata ------------------------------------------------------------------------
def lab_of(item: pytest.Item) -> tuple[str, str] | None:
    """``("lab06", "lab06_radix_cache")`` for a test in ``test_lab06_radix_cache.py``."""
    m = _TEST_FILE.match(Path(str(item.fspath)).name)
    return (f"lab{m.group(2)}", m.group(1)) if m else None


def item_points(item: pytest.Item) -> tuple[float, float]:
    mark = item.get_closest_marker("points")
    if mark is None:
        return 0.0, DEFAULT_TIMEOUT
    return float(mark.args[0]), float(mark.kwargs.get("timeout", DEFAULT_TIMEOUT))


def item_timeout(item: pytest.Item) -> float:
    override = item.config.getoption("ag_timeout")
    _, timeout = item_points(item)
    return min(timeout, override) if override else timeout


def short_name(item: pytest.Item) -> str:
    return item.name.removeprefix("test_")


def item_doc(item: pytest.Item) -> str:
    doc = getattr(getattr(item, "function", None), "__doc__", None) or ""
    return doc.strip().split("\n")[0].strip()


# ---- options and configuration ----------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("autograder")
    group.addoption("--impl", default=None, help="folder of lab files to grade: labs (default), solutions or a path")
    group.addoption("--ag-isolate", action="store_true", help="run each test in a forked process (needs -s)")
    group.addoption("--ag-results", default=None, help="write per-test results (JSON) to this file")
    group.addoption("--ag-timeout", type=float, default=None, help="cap every test's time limit (seconds)")
    group.addoption("--ag-output-limit", type=int, default=OUTPUT_LIMIT, help="bytes a test may print")


def pytest_configure(config: pytest.Config) -> None:
    from autograder import impl

    config.addinivalue_line("markers", "points(n, timeout=60): what an autograder test is worth, and its time limit")
    config.addinivalue_line("markers", "engine: the test runs the engine (minisgl.LLM)")
    os.environ[impl.ENV] = str(impl.resolve_folder(config.getoption("impl") or os.environ.get(impl.ENV)))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(1)
    if config.getoption("ag_isolate"):
        if config.getoption("capture") != "no":
            raise pytest.UsageError("--ag-isolate captures output itself: pass -s as well")
        if not hasattr(os, "fork"):
            raise pytest.UsageError("--ag-isolate forks a process per test: it needs Linux, macOS or WSL")
    config.pluginmanager.register(Results(config), "autograder-results")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    totals: dict[str, float] = {}
    for item in items:
        lab = lab_of(item)
        if lab is None:
            continue
        if item.get_closest_marker("points") is None:
            raise pytest.UsageError(f"{item.nodeid} has no @points(n): every autograder test declares its points")
        totals[lab[1]] = totals.get(lab[1], 0.0) + item_points(item)[0]
    # the grader always collects whole files; a student may run a single test by its node id
    for stem, total in totals.items() if config.getoption("ag_results") else ():
        if abs(total - 100) > 1e-9:
            raise pytest.UsageError(f"the tests of {stem} total {total:g} points; a lab totals 100")
    if not config.getoption("ag_isolate") and config.pluginmanager.hasplugin("timeout"):
        for item in items:
            if lab_of(item) is not None:
                item.add_marker(pytest.mark.timeout(item_timeout(item)))


# ---- failure messages -------------------------------------------------------------------------
def _trim(text: str, lines: int = MESSAGE_LINES) -> str:
    out = text.strip().split("\n")
    if len(out) > lines:
        out = out[:lines] + ["..."]
    return "\n".join(line if len(line) <= 300 else line[:300] + "..." for line in out)


def explain(excinfo: pytest.ExceptionInfo, impl_folder: Path) -> str:
    """A few lines that tell a student what went wrong (not a traceback)."""
    exc = excinfo.value
    notes = [n for n in getattr(exc, "__notes__", []) if n.strip()]
    if isinstance(exc, NotImplementedError):
        text = f"not implemented yet: {exc}" if str(exc) else "not implemented yet (NotImplementedError)"
    elif isinstance(exc, AssertionError):
        lines = str(exc).split("\n")
        # keep our message; drop pytest's rewritten "assert ..." explanation when a message exists
        if len(lines) > 1 and not lines[0].startswith("assert "):
            cut = next((i for i, line in enumerate(lines) if line.startswith("assert ")), len(lines))
            lines = lines[:cut]
        text = "\n".join(lines) or "assertion failed"
    elif isinstance(exc, pytest.fail.Exception):
        text = exc.msg or "failed"
    elif isinstance(exc, SystemExit):
        text = f"your code called sys.exit({exc.code!r}); lab code must return or raise, never exit"
    else:
        text = f"{type(exc).__name__}: {exc}"
    where = _student_frame(excinfo, impl_folder)
    if where and not isinstance(exc, (AssertionError, NotImplementedError)):
        text += f"\n  raised at {where}"
    if notes:
        text += "\n" + "\n".join(notes)
    return _trim(text)


def _student_frame(excinfo: pytest.ExceptionInfo, impl_folder: Path) -> str | None:
    """``file:line in func: source`` of the deepest traceback entry in the graded folder."""
    for entry in reversed(excinfo.traceback):
        path = Path(str(entry.path))
        try:
            path.relative_to(impl_folder)
        except ValueError:
            continue
        try:
            source = str(entry.statement).strip()
        except Exception:
            source = ""
        return f"{path.name}:{entry.lineno + 1} in {entry.name}(): {source}"
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if lab_of(item) is not None and report.failed and call.excinfo is not None:
        from autograder import impl

        report.user_properties.append(("ag_message", explain(call.excinfo, impl.impl_folder())))
    return report


# ---- running a test in a forked child ---------------------------------------------------------
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if not item.config.getoption("ag_isolate") or lab_of(item) is None:
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in run_forked(item):
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


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


# ---- results ----------------------------------------------------------------------------------
class Results:
    """Collects one record per test from the reports (registered as a plugin by pytest_configure)."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.collected: list[dict] = []  # metadata of every collected lab test, in order
        self.records: dict[str, dict] = {}  # nodeid -> outcome, message, output, duration
        self.errors: list[str] = []  # collection errors: the grader itself is broken

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            lab = lab_of(item)
            if lab is not None:
                meta = dict(lab=lab[0], stem=lab[1], name=short_name(item), doc=item_doc(item))
                self.collected.append(dict(nodeid=item.nodeid, **meta, points=item_points(item)[0]))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.errors.append(f"{report.nodeid}: {report.longreprtext[-3000:]}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        rec = self.records.setdefault(report.nodeid, dict(outcome="passed", message="", output="", duration=0.0))
        rec.setdefault("phases", []).append(report.when)
        props = {k: v for k, v in report.user_properties}
        rec["duration"] += report.duration
        if props.get("ag_output"):
            rec["output"] = props["ag_output"]
        if report.failed and rec["outcome"] != "failed":
            rec["outcome"] = "failed"
            rec["message"] = props.get("ag_message") or _trim(report.longreprtext or "failed")
        elif report.skipped and rec["outcome"] == "passed":
            rec["outcome"] = "skipped"
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            rec["message"] = f"skipped: {reason}"

    def tests(self) -> list[dict]:
        """One record per collected test, in collection order; a test that did not run fails."""
        out = []
        for meta in self.collected:
            rec = dict(self.records.get(meta["nodeid"]) or dict(outcome="failed", message="not run", output=""))
            phases = rec.pop("phases", [])
            if rec["outcome"] == "passed" and "call" not in phases:
                rec.update(outcome="failed", message="the test did not run to its end")
            rec.setdefault("duration", 0.0)
            out.append({**meta, **rec, "score": meta["points"] if rec["outcome"] == "passed" else 0.0})
        return out

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        path = self.config.getoption("ag_results")
        if path:
            from autograder import impl

            data = dict(impl=str(impl.impl_folder()), tests=self.tests(), errors=self.errors)
            Path(path).write_text(json.dumps(data, indent=1))

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int, config: pytest.Config) -> None:
        if config.getoption("ag_results") or not self.collected:
            return  # the grader prints its own table
        from autograder.report import format_lab_table, group_by_lab

        for stem, tests in group_by_lab(self.tests()).items():
            terminalreporter.write_line("")
            terminalreporter.write_line(format_lab_table(stem, tests))
