"""What a lab test is worth: the ``@points`` and ``@engine`` marks, and the per-test metadata read
from them and from the test's file name.

``@points(10)`` next to a test declares its points (and ``timeout=`` its time limit in seconds);
the tests of one lab file (``test_labNN_*.py``) must total 100. Partial credit is per test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DEFAULT_TIMEOUT = 60.0  # seconds per test

_TEST_FILE = re.compile(r"^test_(lab(\d\d)_[a-z0-9_]+)\.py$")


def points(value: float, *, timeout: float = DEFAULT_TIMEOUT) -> pytest.MarkDecorator:
    """Declare what a test is worth (and its time limit in seconds)."""
    return pytest.mark.points(value, timeout=timeout)


# marks a test that builds a minisgl.LLM: before forking it the parent imports transformers (the
# tokenizer) once, so each such test does not pay seconds of imports; stub-only runs never do
engine = pytest.mark.engine


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


def check_points(items: list[pytest.Item], whole_labs: bool) -> None:
    """Every lab test declares its points; with ``whole_labs`` (a graded run, which always collects
    whole files) each lab's tests total 100. A student may run a single test by its node id."""
    totals: dict[str, float] = {}
    for item in items:
        lab = lab_of(item)
        if lab is None:
            continue
        if item.get_closest_marker("points") is None:
            raise pytest.UsageError(f"{item.nodeid} has no @points(n): every autograder test declares its points")
        totals[lab[1]] = totals.get(lab[1], 0.0) + item_points(item)[0]
    for stem, total in totals.items() if whole_labs else ():
        if abs(total - 100) > 1e-9:
            raise pytest.UsageError(f"the tests of {stem} total {total:g} points; a lab totals 100")
