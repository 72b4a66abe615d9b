"""The autograder's pytest hooks (wired in by ``autograder/conftest.py``); each concern lives in
its own module:

* ``points.py``: ``@points(n)`` / ``@engine`` and the per-test metadata (points, visibility); a
  lab's visible tests and its hidden ones (``autograder/hidden/``) must total 90 and 10, or a graded
  run (``--ag-results``) refuses to start.
* ``pace.py``: how much slower than the course's reference machine this one runs; every time limit
  is scaled by it.
* ``runner.py``: with ``--ag-isolate`` (what ``python -m autograder`` uses; needs ``-s``) each test
  runs in a forked child, so a hang, a crash or a flood of prints fails only that test; a test that
  timed out while starved of CPU is retried once.
* ``explain.py``: each failure gets a short explanation for the student (``ag_message``).
* ``results.py``: ``--ag-results PATH`` writes one JSON record per test (lab, name, points,
  outcome, message, output, duration), which ``python -m autograder`` turns into scores.

Without ``--ag-isolate`` (a student running ``pytest autograder -k lab06``) tests run in-process
as usual, each under pytest-timeout with its declared timeout, and a score summary is printed.
"""

from __future__ import annotations

import os

import pytest

from autograder.explain import explain
from autograder.points import check_points, item_timeout, lab_of
from autograder.results import Results
from autograder.runner import MEMORY_LIMIT_GIB, OUTPUT_LIMIT, failed_report, run_forked

ENGINE_SKIPPED = (
    "not implemented yet: the engine runs your component once the lab's functions are written (every unit "
    "test of this lab still raises NotImplementedError, so the engine was not started)"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("autograder")
    group.addoption("--impl", default=None, help="folder of lab files to grade (default labs/, or any path)")
    group.addoption("--ag-isolate", action="store_true", help="run each test in a forked process (needs -s)")
    group.addoption("--ag-results", default=None, help="write per-test results (JSON) to this file")
    group.addoption("--ag-timeout", type=float, default=None, help="cap every test's time limit (seconds)")
    group.addoption("--ag-output-limit", type=int, default=OUTPUT_LIMIT, help="bytes a test may print")
    group.addoption(
        "--ag-memory-limit",
        type=float,
        default=float(os.environ.get("MINISGL_AG_MEMORY_GIB") or MEMORY_LIMIT_GIB),
        help="GiB a test's processes may hold together (default: $MINISGL_AG_MEMORY_GIB, else 8)",
    )
    group.addoption("--ag-progress", default=None, help="append a line per graded test to this file")


def pytest_configure(config: pytest.Config) -> None:
    from autograder import impl

    config.addinivalue_line("markers", "points(n, timeout=60): what an autograder test is worth, and its time limit")
    config.addinivalue_line("markers", "engine: the test runs the engine (minisgl.LLM)")
    os.environ[impl.ENV] = str(impl.resolve_folder(config.getoption("impl") or os.environ.get(impl.ENV)))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from autograder import pace

    torch.set_num_threads(1)
    pace.measure()  # every limit of this run scales with it (a retry measures again)
    if config.getoption("ag_isolate"):
        if config.getoption("capture") != "no":
            raise pytest.UsageError("--ag-isolate captures output itself: pass -s as well")
        if not hasattr(os, "fork"):
            raise pytest.UsageError("--ag-isolate forks a process per test: it needs Linux, macOS or WSL")
    config.pluginmanager.register(Results(config), "autograder-results")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    from autograder import impl, originality

    check_points(items, whole_labs=bool(config.getoption("ag_results")))
    # the engine tests of a lab last: they are skipped while its unit tests all raise NotImplementedError
    items.sort(key=lambda item: lab_of(item) is not None and item.get_closest_marker("engine") is not None)
    for stem in sorted({lab_of(item)[1] for item in items if lab_of(item) is not None}):
        originality.install(stem, impl.impl_folder())  # before any test imports the lab file
    if not config.getoption("ag_isolate") and config.pluginmanager.hasplugin("timeout"):
        for item in items:
            if lab_of(item) is not None:
                item.add_marker(pytest.mark.timeout(item_timeout(item)))


def pytest_runtest_setup(item: pytest.Item) -> None:

    from autograder import originality

    originality.FOUND.clear()
    # refusals in the processes this test starts (a TP rank, a server) are written here; a forked test's
    # file is named by the runner, which watches it (runner._attempt)
    if not item.config.getoption("ag_isolate"):
        originality.name_found_file()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    from autograder import originality

    report = yield
    if lab_of(item) is None:
        return report
    found = (originality.FOUND + originality.found_elsewhere()) if call.when == "call" else []
    if call.when == "teardown":
        try:
            os.remove(os.environ.get(originality.FOUND_ENV, ""))
        except OSError:
            pass
    if found:  # even if the student's code caught the exception, in this process or another
        report.outcome, report.longrepr = "failed", found[0]
        report.user_properties += [("ag_message", found[0]), ("ag_engine_reference", found[0])]
    elif report.failed and call.excinfo is not None:
        from autograder import impl

        report.user_properties.append(("ag_message", explain(call.excinfo, impl.impl_folder())))
    return report


def _warm_before_fork(item: pytest.Item) -> None:
    """Run the test module's ``warm_before_fork()``, if it has one, once in this process: what each of
    its tests would otherwise load again in its own forked child (a tokenizer and transformers' import:
    ~3 s a test). It touches no student code; if it fails, each child meets the error itself."""
    module = getattr(item, "module", None)
    warm = getattr(module, "warm_before_fork", None)
    if warm is None or getattr(module, "_ag_warmed", False):
        return
    module._ag_warmed = True
    try:
        warm()
    except Exception:
        pass


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if lab_of(item) is None:
        return None
    results = item.config.pluginmanager.get_plugin("autograder-results")
    if item.get_closest_marker("engine") is not None and results.lab_unimplemented(lab_of(item)[1]):
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        report = failed_report(item, ENGINE_SKIPPED, 0.0)
        item.ihook.pytest_runtest_logreport(report=report)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True
    if not item.config.getoption("ag_isolate"):
        return None
    _warm_before_fork(item)
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in run_forked(item):
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
