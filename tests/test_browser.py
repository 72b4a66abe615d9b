"""The explorers work where students use them: in JupyterLab, in a real browser (Chromium).

Each lesson with an explorer runs once in JupyterLab (``browser_lab.py``: Run All Cells from the
frontend); then each of its explorers' controls is operated once (a click, a slider step, a dropdown
change) and the picture under the controls must change into one that is not blank (not fully
transparent, not one colour). ``test_notebooks.py::test_notebook_runs`` checks that same run's
outputs, so a lesson is executed once for both.

Needs Debian's Chromium at ``/usr/bin/chromium`` (``apt-get install chromium``; ``.ci/run`` installs
it) and the ``test`` extra (playwright, jupyterlab, ipywidgets); without them these tests skip and
say so. Playwright's own browser download is never used.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import browser_lab
import pytest

EXPLORER_LESSONS = browser_lab.explorer_lessons()
TIMEOUT_S = 300  # per lesson: a cap on the shared run (test_notebooks.py asserts each lesson's time limit)

# CI (.ci/run installs Chromium) must run these: there a missing browser fails instead of skipping
_MISSING = browser_lab.unavailable()
needs_browser = pytest.mark.skipif(_MISSING is not None and not os.environ.get("CI"), reason=f"{_MISSING}")


@pytest.fixture(scope="module", autouse=True)
def _close_the_browser_after_this_file():
    yield  # the runs stay cached for test_notebooks.py; the server and the browser need not
    browser_lab.close()


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def test_blank_pictures_are_recognised():
    """The judge of a redraw: a fully transparent PNG (issue 31's 1052x508) or one colour is blank."""
    plt = pytest.importorskip("matplotlib.pyplot")
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGBA", (1052, 508), (255, 255, 255, 0)).save(buf, format="PNG")
    assert browser_lab.blank_reason(buf.getvalue()) == "a fully transparent 1052x508 image"
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (255, 255, 255)).save(buf, format="PNG")
    assert browser_lab.blank_reason(buf.getvalue()).startswith("a 40x30 image of one colour")
    assert browser_lab.blank_reason(b"not a png").startswith("not a readable image")
    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([0, 1], [0, 1])
    assert browser_lab.blank_reason(_png(fig)) is None
    plt.close(fig)


def _judge(before: list[bytes], after: list[bytes], texts_after: list[str] = ()) -> str | None:
    import base64

    def snap(pics, texts=()):
        return {"pics": [{"data": base64.b64encode(p).decode(), "shown": True} for p in pics], "texts": list(texts)}

    return browser_lab._judge(snap(before), snap(after, texts_after))


def test_a_redraw_must_change_the_picture():
    plt = pytest.importorskip("matplotlib.pyplot")
    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([0, 1], [0, 1])
    one = _png(fig)
    ax.plot([0, 1], [1, 0])
    two = _png(fig)
    plt.close(fig)
    assert _judge([one], [one, two]) is None
    assert _judge([one, two], [one, one]) is None, "back to the first picture is a change too"
    assert _judge([one], [one]) == "the picture did not change"
    assert "error" in _judge([one], [one], ["step: ValueError: no such request"])
    assert _judge([one], [one], ["after 'step':"]) == "the picture did not change", "a status line is no picture"


# A notebook whose explorer has a slider, a dropdown and a button that draws a blank picture: the browser
# check must pass the knobs and catch the button (issue 31's bug, made on purpose).
_SELF_TEST = [
    "import matplotlib.pyplot as plt\nfrom course import Choice, Slider, explorer",
    """state = {"blank": False}


def draw(n, colour):
    fig, ax = plt.subplots(figsize=(3, 2))
    if state["blank"]:
        fig.patch.set_alpha(0)
        ax.set_axis_off()
        return fig
    ax.bar(range(n), range(1, n + 1), color=colour)
    return fig


knobs = {"n": Slider(1, 8, 1, 3), "colour": Choice(("tab:blue", "tab:red"), "tab:blue")}
ex = explorer(draw, {"blank it": lambda: state.update(blank=True)}, knobs=knobs)""",
]


@pytest.mark.slow
@needs_browser
@pytest.mark.timeout(TIMEOUT_S)
def test_the_browser_check_passes_knobs_and_catches_a_blank_redraw(tmp_path: Path):
    assert _MISSING is None, f"CI runs the browser tests: {_MISSING}"
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in _SELF_TEST])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "zz_browser_self_test.ipynb"
    nbformat.write(nb, path)
    run = browser_lab.run(path, TIMEOUT_S)
    assert not run.timed_out and run.explorer_problem is None, run.explorer_problem
    got = {(c.kind, c.label): c.problem for c in run.controls}
    assert got[("slider", "n")] is None and got[("dropdown", "colour")] is None, got
    blank = got[("button", "blank it")] or ""
    assert "of one colour" in blank or "transparent" in blank, f"a blank redraw went unnoticed: {got}"


@pytest.mark.slow
@needs_browser
@pytest.mark.timeout(TIMEOUT_S + 120)
@pytest.mark.parametrize("path", EXPLORER_LESSONS, ids=lambda p: p.stem)
def test_explorers_redraw_in_jupyterlab(path: Path):
    assert _MISSING is None, f"CI runs the browser tests: {_MISSING}"
    run = browser_lab.run(path, TIMEOUT_S)
    print(f"{path.name}: {run.seconds:.1f} s in JupyterLab, {len(run.controls)} controls operated")
    if run.timed_out:
        pytest.fail(f"{path.name} did not finish within {TIMEOUT_S} s in JupyterLab", pytrace=False)
    error = browser_lab.first_error(run.nb)
    if error:
        pytest.fail(f"{path.name}: in JupyterLab, {error}: its explorers were not tried", pytrace=False)
    assert run.explorer_problem is None, f"{path.name}: {run.explorer_problem}"
    broken = [f"cell {c.cell}, {c.kind} {c.label!r}: {c.problem}" for c in run.controls if c.problem]
    assert not broken, f"{path.name}: in JupyterLab these controls did not redraw a real picture: {broken}"
