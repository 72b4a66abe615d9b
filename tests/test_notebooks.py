"""The lesson notebooks run top to bottom on CPU, and the committed copies show a clean run.

Committed notebooks keep their outputs (so readers see the plots on GitHub). The run test executes
a copy in memory, with ``lessons/`` as the working directory, and never writes the file back.
To refresh the committed outputs after editing a lesson, run it top to bottom and save, e.g.::

    jupyter nbconvert --to notebook --execute --inplace lessons/06_radix_cache.ipynb

Where a browser is available (``browser_lab.py``), a lesson with an explorer runs in JupyterLab
instead of nbclient, once for this file and ``test_browser.py`` together: the outputs checked here are
that run's, read back from a copy that JupyterLab saved.
"""

from __future__ import annotations

import ast
import re
import time
from pathlib import Path

import browser_lab
import pytest

LESSONS = Path(__file__).resolve().parent.parent / "lessons"
NOTEBOOKS = sorted(LESSONS.glob("[0-9][0-9]_*.ipynb"))
# per notebook, all cells together (kernel start-up excluded): the README promises under two minutes on a
# 2-core CPU, and this leaves a margin below it (CI's run prints each lesson's time in its summary)
TIMEOUT_S = 100
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colours in IPython tracebacks

pytestmark = pytest.mark.skipif(not NOTEBOOKS, reason="no lesson notebooks")


def _read(path: Path):
    nbformat = pytest.importorskip("nbformat")
    return nbformat.read(path, as_version=4)


def _cell_error(nb) -> str | None:
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return f"cell {i} ({cell.source.splitlines()[0][:60]!r}): {out.get('ename')}: {out.get('evalue')}"
    return None


def _exercises_agreeing(nb) -> list[str]:
    """The exercise checks (``course.check``) in the outputs that report agreement with the engine.
    With the exercise cells as committed (open), none may: one that does is checking the engine's
    own function (against itself, or through a wrapper), and would tell a student "done"."""
    found = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text = out.get("text", "") if out.get("output_type") == "stream" else ""
            found += [line for line in text.splitlines() if line.startswith("✓ ")]
            found += [line for line in text.splitlines() if re.match(r"[1-9]\d* of \d+ exercises agree", line)]
    return found


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S + 120)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path: Path, record_property):
    nb = _read(path)
    if browser_lab.unavailable() is None and browser_lab.has_explorer(nb):
        run = browser_lab.run(path, TIMEOUT_S)  # shared with test_browser.py: one execution
        print(f"{path.name}: {run.seconds:.1f} s (JupyterLab)")
        record_property("lesson_seconds", (round(run.seconds, 1), "JupyterLab"))
        # the shared run may have been started by test_browser.py with its own, longer cap: the limit is this
        if run.timed_out or run.seconds > TIMEOUT_S:
            pytest.fail(f"{path.name} did not finish within {TIMEOUT_S} s (in JupyterLab)", pytrace=False)
        error = browser_lab.first_error(run.nb)
        assert error is None, f"{path.name}: in JupyterLab, {error}"
        agreeing = _exercises_agreeing(run.nb)
        assert not agreeing, f"{path.name}: with its exercises open, these checks report agreement: {agreeing}"
        return
    nbclient = pytest.importorskip("nbclient")
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    deadline = time.monotonic() + TIMEOUT_S
    client = nbclient.NotebookClient(
        nb,
        kernel_name="python3",
        # every cell gets what is left of the notebook's budget
        timeout_func=lambda cell: max(1, int(deadline - time.monotonic())),
        record_timing=False,
        resources={"metadata": {"path": str(LESSONS)}},
    )
    start = time.monotonic()
    try:
        client.execute()
    except CellTimeoutError:
        pytest.fail(f"{path.name} did not finish within {TIMEOUT_S} s", pytrace=False)
    except CellExecutionError as e:  # its message holds the failing cell's source and traceback
        pytest.fail(f"{path.name}: a cell failed\n{_ANSI.sub('', str(e))}", pytrace=False)
    print(f"{path.name}: {time.monotonic() - start:.1f} s")
    record_property("lesson_seconds", (round(time.monotonic() - start, 1), "nbclient"))
    agreeing = _exercises_agreeing(nb)
    assert not agreeing, f"{path.name}: with its exercises open, these checks report agreement: {agreeing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_outputs_are_one_clean_run(path: Path):
    """Readers see the outputs on GitHub: they must come from one top-to-bottom run, without errors."""
    nb = _read(path)
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1)), (
        f"{path.name}: code cells were not run once each, in order (execution counts {counts}); run the "
        f"notebook top to bottom and save it: jupyter nbconvert --to notebook --execute --inplace {path}"
    )
    err = _cell_error(nb)
    assert err is None, f"{path.name}: the committed outputs show an error in {err}"
    agreeing = _exercises_agreeing(nb)
    assert not agreeing, f"{path.name}: the committed run (exercises open) shows checks agreeing: {agreeing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_lesson_shape(path: Path):
    """STYLE.md: a lesson opens with its numbered title and ends by pointing at the lab ("Your turn")."""
    nb = _read(path)
    first = nb.cells[0]
    number = path.name[:2]
    assert first.cell_type == "markdown" and re.match(rf"# Lesson {number}\b", first.source), (
        f"{path.name}: the first cell should be the title '# Lesson {number} — ...' followed by the promise"
    )
    assert any(c.cell_type == "markdown" and re.search(r"^## Your turn", c.source, re.M) for c in nb.cells), (
        f"{path.name}: no '## Your turn' section (the lab, the grading command and what the tests check)"
    )


def _text(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        out.append(o.get("text", "") if o.get("output_type") == "stream" else o.get("data", {}).get("text/plain", ""))
    return "".join(out)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_exercises_are_committed_open_and_checked(path: Path):
    """A lesson with exercise cells states the rule at the top; each exercise is committed unfilled (its
    functions only raise NotImplementedError: no answer on GitHub) and a check reports it open."""
    nb = _read(path)
    exercises = [c for c in nb.cells if c.cell_type == "code" and re.match(r"# Exercise\b", c.source)]
    if not exercises:
        return
    assert "Exercise cells: fill in; the check below tells you" in nb.cells[0].source, (
        f"{path.name}: the first cell should state the rule for exercise cells"
    )
    open_lines = [line for c in nb.cells if c.cell_type == "code" for line in _text(c).splitlines()]
    open_lines = [line.split(":")[0] for line in open_lines if line.startswith("○ ")]
    for cell in exercises:
        for fn in (n for n in ast.parse(cell.source).body if isinstance(n, ast.FunctionDef)):
            body = [n for n in fn.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
            raises = len(body) == 1 and isinstance(body[0], ast.Raise)
            assert raises and "NotImplementedError" in ast.unparse(body[0]), (
                f"{path.name}: exercise {fn.name}() is committed filled in; commit it open (a docstring and a raise)"
            )
            assert any(re.search(rf"\b{fn.name}\b", line) for line in open_lines), (
                f"{path.name}: no check reports exercise {fn.name}() open in the committed outputs"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_widgets_leave_a_static_picture(path: Path):
    """Readers on GitHub (and CI) have no live kernel: every explorer cell shows its static picture."""
    nb = _read(path)
    for cell in nb.cells:
        if cell.cell_type == "code" and re.search(r"(^|=\s*)explorer\(", cell.source, re.M):
            kinds = [o.get("data", {}) for o in cell.get("outputs", [])]
            assert "Static picture" in _text(cell) and any("image/png" in d for d in kinds), (
                f"{path.name}: the explorer cell {cell.source.splitlines()[0][:50]!r} shows no static picture"
            )
