"""What a lab test is worth and who sees it: the ``@points`` and ``@engine`` marks, and the per-test
metadata read from them and from the test's file.

``@points(10)`` next to a test declares its points (and ``timeout=`` its time limit in seconds).
Partial credit is per test. A lab totals 100: its visible tests (``autograder/test_labNN_*.py``,
shipped to students) total ``VISIBLE_POINTS`` and its hidden tests (``autograder/hidden/
test_labNN_*.py``, never shipped: the release drops the folder) total ``HIDDEN_POINTS``.

Visibility follows the folder, so a test outside ``hidden/`` can never be hidden by accident: hidden
tests are Gradescope's ``after_due_date`` unless they say ``@points(n, visibility="hidden")`` (never
shown) or ``"after_published"``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DEFAULT_TIMEOUT = 60.0  # seconds per test
HIDDEN_DIR = Path(__file__).resolve().parent / "hidden"
HIDDEN_POINTS = 10.0  # of each lab's 100; the student edition says they exist and grades the rest
VISIBLE_POINTS = 100.0 - HIDDEN_POINTS
HIDDEN_VISIBILITIES = ("after_due_date", "after_published", "hidden")  # Gradescope's, minus "visible"

_TEST_FILE = re.compile(r"^test_(lab(\d\d)_[a-z0-9_]+)\.py$")


def points(value: float, *, timeout: float = DEFAULT_TIMEOUT, visibility: str | None = None) -> pytest.MarkDecorator:
    """Declare what a test is worth (and its time limit in seconds; a hidden test may pick its
    Gradescope visibility)."""
    kwargs: dict = dict(timeout=timeout)
    if visibility is not None:
        kwargs["visibility"] = visibility
    return pytest.mark.points(value, **kwargs)


# marks a test that builds a minisgl.LLM: before forking it the parent imports transformers (the
# tokenizer) once, so each such test does not pay seconds of imports; stub-only runs never do
engine = pytest.mark.engine


def lab_of(item: pytest.Item) -> tuple[str, str] | None:
    """``("lab06", "lab06_radix_cache")`` for a test in ``test_lab06_radix_cache.py`` (visible or
    hidden)."""
    m = _TEST_FILE.match(Path(str(item.fspath)).name)
    return (f"lab{m.group(2)}", m.group(1)) if m else None


def is_hidden(item: pytest.Item) -> bool:
    return Path(str(item.fspath)).resolve().parent == HIDDEN_DIR


def item_points(item: pytest.Item) -> tuple[float, float]:
    mark = item.get_closest_marker("points")
    if mark is None:
        return 0.0, DEFAULT_TIMEOUT
    return float(mark.args[0]), float(mark.kwargs.get("timeout", DEFAULT_TIMEOUT))


def item_visibility(item: pytest.Item) -> str:
    """Gradescope's visibility of the test: ``visible`` outside ``hidden/``, else what its
    ``@points`` says (default ``after_due_date``)."""
    if not is_hidden(item):
        return "visible"
    mark = item.get_closest_marker("points")
    return (mark.kwargs.get("visibility") if mark is not None else None) or "after_due_date"


def item_timeout(item: pytest.Item, pace: float | None = None) -> float:
    """The test's time limit on this machine: what it declares for the reference machine times the
    machine's pace (``autograder/pace.py``), capped by ``--ag-timeout`` (an explicit cap in seconds,
    not scaled)."""
    from autograder import pace as machine

    override = item.config.getoption("ag_timeout")
    _, timeout = item_points(item)
    timeout *= machine.current() if pace is None else pace
    return min(timeout, override) if override else timeout


def short_name(item: pytest.Item) -> str:
    return item.name.removeprefix("test_")


def item_doc(item: pytest.Item) -> str:
    doc = getattr(getattr(item, "function", None), "__doc__", None) or ""
    return doc.strip().split("\n")[0].strip()


def check_points(items: list[pytest.Item], whole_labs: bool) -> None:
    """Every lab test declares its points, and only a test in ``hidden/`` a visibility; with
    ``whole_labs`` (a graded run, which always collects whole files) a lab's visible tests total
    ``VISIBLE_POINTS`` and its hidden ones, when collected, ``HIDDEN_POINTS``. A student may run a
    single test by its node id."""
    totals: dict[tuple[str, bool], float] = {}
    for item in items:
        lab = lab_of(item)
        if lab is None:
            continue
        mark = item.get_closest_marker("points")
        if mark is None:
            raise pytest.UsageError(f"{item.nodeid} has no @points(n): every autograder test declares its points")
        visibility = mark.kwargs.get("visibility")
        if visibility is not None and (not is_hidden(item) or visibility not in HIDDEN_VISIBILITIES):
            raise pytest.UsageError(
                f"{item.nodeid}: visibility={visibility!r}; only a test in autograder/hidden/ has one, and it is "
                f"one of {', '.join(HIDDEN_VISIBILITIES)} (the release drops that folder, nothing else)"
            )
        key = (lab[1], is_hidden(item))
        totals[key] = totals.get(key, 0.0) + item_points(item)[0]
    for (stem, hidden), total in totals.items() if whole_labs else ():
        want, where = (HIDDEN_POINTS, "hidden/") if hidden else (VISIBLE_POINTS, "")
        if abs(total - want) > 1e-9:
            raise pytest.UsageError(
                f"the tests of autograder/{where}test_{stem}.py total {total:g} points; they must total {want:g} "
                f"(a lab totals 100: {VISIBLE_POINTS:g} visible + {HIDDEN_POINTS:g} hidden)"
            )
