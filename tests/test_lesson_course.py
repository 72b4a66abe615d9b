"""The lessons' helper module (``lessons/course.py``): exercise checks and the headless explorer."""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import pytest
import torch

_PATH = Path(__file__).resolve().parent.parent / "lessons" / "course.py"
_spec = importlib.util.spec_from_file_location("lesson_course", _PATH)
course = importlib.util.module_from_spec(_spec)
sys.modules["lesson_course"] = course  # dataclasses look their module up there
_spec.loader.exec_module(course)


def engine_double(x):
    return x * 2


def test_check_reports_a_mismatch_with_expected_and_got(capsys):
    def double(x):
        out = x * 2
        out[2] += 1
        return out

    used = course.check(double, engine_double, torch.arange(4.0))
    out = capsys.readouterr().out
    assert used is engine_double, "a wrong exercise must hand the engine's version to the rest of the lesson"
    assert out.startswith("✗ double: different from")
    assert "result[2]: expected 4, got 5" in out and "1 of 4 values differ" in out
    assert "continues with" in out and course.RESULTS["double"] == "fail"


def test_check_reports_shape_and_dtype():
    assert course.compare(torch.zeros(2, 3), torch.zeros(3, 2)) == "result: expected shape [2, 3], got [3, 2]"
    assert "expected dtype torch.float32, got torch.float64" in course.compare(torch.zeros(2), torch.zeros(2).double())
    record = {"match [1, 2]": (2, [0, 1])}
    assert course.compare(record, {"match [1, 2]": (2, [0, 7])}) == "result['match [1, 2]'][1][1]: expected 1, got 7"


def test_check_open_passing_and_raising_exercises(capsys):
    def open_exercise(x):
        raise NotImplementedError("Exercise: write it")

    def good(x):
        return x + x

    def crashing(x):
        return x @ x  # [2, 3] @ [2, 3]: shapes do not chain, a real bug

    assert course.check(open_exercise, engine_double, torch.ones(3)) is engine_double
    assert course.check(good, engine_double, torch.ones(3)) is good
    assert course.check(crashing, engine_double, torch.ones(2, 3), name="crashing") is engine_double
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("○ open_exercise: exercise open (Exercise: write it)")
    assert out[1].startswith("✓ good: same results as") and "[3] float32" in out[1]
    assert out[2].startswith("✗ crashing: raised RuntimeError")
    assert [course.RESULTS[n] for n in ("open_exercise", "good", "crashing")] == ["open", "pass", "fail"]


def test_check_plays_a_scenario_on_a_set_of_functions():
    def play(ops, n):
        push, total = ops
        items = []
        for i in range(n):
            push(items, i)
        return {"items": items, "total": total(items)}

    mine = (lambda xs, i: xs.append(i), lambda xs: sum(xs) + 1)
    engine = (lambda xs, i: xs.append(i), sum)
    assert course.check(mine, engine, 4, run=play, name="scenario") is engine
    assert course.compare(play(engine, 4), play(mine, 4)) == "result['total']: expected 6, got 7"


def test_explorer_renders_its_static_picture_headless(capsys):
    state = {"steps": 0}
    ex = course.explorer(lambda: f"steps: {state['steps']}", {"step": lambda: state.update(steps=state["steps"] + 1)})
    out = capsys.readouterr().out
    assert ex.widget is None, "no kernel: no buttons"
    assert "Static picture" in out and "steps: 0" in out
    assert ex.press("step") == "steps: 1" and ex.picture == "steps: 1"


def test_explorer_draws_a_figure_headless():
    plt = pytest.importorskip("matplotlib.pyplot")

    def draw():
        fig, ax = plt.subplots()
        ax.set_title(f"{len(items)} items")
        return fig

    items: list[str] = []
    ex = course.explorer(draw, {"add": items.append}, text="hello")
    assert ex.widget is None and ex.picture.axes[0].get_title() == "0 items"
    assert ex.press("add").axes[0].get_title() == "1 items" and items == ["hello"]
    plt.close("all")


def test_the_reference_itself_or_a_wrapper_of_it_is_an_open_exercise(capsys):
    """An exercise whose name was rebound to the engine's function (lesson 04 once checked the engine
    against itself that way), or that calls it, is not done: it must never report agreement."""

    def wrapper(x):
        return engine_double(x)

    def partly(x):
        return engine_double(x) if x.numel() > 2 else x + x

    assert course.check(engine_double, engine_double, torch.ones(3), name="itself") is engine_double
    assert course.check(wrapper, engine_double, torch.ones(3)) is engine_double
    assert course.check(partly, engine_double, torch.ones(3)) is engine_double
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("○ itself: exercise open (this is") and "itself" in out[0]
    assert out[1].startswith("○ wrapper: exercise open (it calls") and "write your own" in out[1]
    assert out[2].startswith("○ partly: exercise open (it calls")
    assert [course.RESULTS[n] for n in ("itself", "wrapper", "partly")] == ["open"] * 3


def test_a_set_of_functions_may_share_the_engines_parts(capsys):
    """A scenario over (Tree, match, insert) where an earlier exercise is still open hands on the
    engine's part: the exercise is judged on the parts that are the student's."""

    def play(ops, n):
        push, total = ops
        items = []
        for i in range(n):
            push(items, i)
        return total(items)

    def engine_push(xs, i):
        xs.append(i)

    def my_total(xs):
        return sum(xs)

    def engine_total(xs):
        return sum(xs)

    engine = (engine_push, engine_total)
    assert course.check((engine_push, my_total), engine, 4, run=play, name="shared") == (engine_push, my_total)
    assert course.check(engine, engine, 4, run=play, name="all shared") is engine
    borrowing = (engine_push, lambda xs: engine_total(xs))
    assert course.check(borrowing, engine, 4, run=play, name="borrowing") is engine
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("✓ shared: same results as")
    assert out[1].startswith("○ all shared: exercise open (this is")
    assert out[2].startswith("○ borrowing: exercise open (it calls")


def _knob_explorer():
    calls = []

    def draw(chunk, policy):
        calls.append((chunk, policy))
        return f"chunk {chunk}, policy {policy}"

    knobs = {"chunk": course.Slider(16, 1024, 16, 128), "policy": course.Choice(("fifo", "lpm"), "fifo")}
    return course.explorer(draw, knobs=knobs), calls


def test_knobs_draw_with_their_values_headless(capsys):
    ex, calls = _knob_explorer()
    assert "Static picture" in capsys.readouterr().out and ex.widget is None
    assert calls == [(128, "fifo")] and ex.values == {"chunk": 128, "policy": "fifo"}
    assert ex.turn("chunk", 1024) == "chunk 1024, policy fifo", "the top of the slider is a value it takes"
    assert ex.turn("chunk", 16) == "chunk 16, policy fifo", "so is the bottom"
    assert ex.turn("policy", "lpm") == "chunk 16, policy lpm" and ex.picture == "chunk 16, policy lpm"
    assert calls[-1] == (16, "lpm") and ex.values == {"chunk": 16, "policy": "lpm"}


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("chunk", 1025, "outside [16, 1024]"),
        ("chunk", 15, "outside [16, 1024]"),
        ("chunk", 64.0, "is not an int"),
        ("chunk", "64", "is not an int"),
        ("chunk", True, "is not an int"),
        ("policy", "lru", "is not one of ('fifo', 'lpm')"),
        ("budget", 8, "no knob 'budget'; the knobs are ['chunk', 'policy']"),
    ],
)
def test_a_value_a_knob_cannot_take_raises_and_changes_nothing(name, value, message):
    ex, calls = _knob_explorer()
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        ex.turn(name, value)
    assert ex.values == {"chunk": 128, "policy": "fifo"} and calls == [(128, "fifo")], "nothing redrawn"
    assert ex.picture == "chunk 128, policy fifo"


def test_a_float_slider_takes_numbers_in_range():
    ex = course.explorer(lambda t: f"t={t}", knobs={"t": course.Slider(0.0, 2.0, 0.1, 1.0)})
    assert ex.turn("t", 2.0) == "t=2.0" and ex.turn("t", 0) == "t=0"
    with pytest.raises(ValueError, match="outside"):
        ex.turn("t", 2.05)
    assert ex.values == {"t": 0}


def test_a_failing_draw_keeps_the_knobs_old_value():
    def draw(n):
        if n == 3:
            raise ZeroDivisionError("n = 3")
        return f"n={n}"

    ex = course.explorer(draw, knobs={"n": course.Slider(1, 5, 1, 2)})
    with pytest.raises(ZeroDivisionError):
        ex.turn("n", 3)
    assert ex.values == {"n": 2} and ex.picture == "n=2"


def test_knobs_and_buttons_together_and_bad_definitions():
    state = {"steps": 0}
    ex = course.explorer(
        lambda scale: f"{state['steps'] * scale}",
        {"step": lambda: state.update(steps=state["steps"] + 1)},
        knobs={"scale": course.Slider(1, 3, 1, 1)},
    )
    assert ex.press("step") == "1" and ex.turn("scale", 3) == "3" and ex.press("step") == "6"
    with pytest.raises(ValueError, match=r"no button 'run'; the buttons are \['step'\]"):
        ex.press("run")
    assert state["steps"] == 2
    with pytest.raises(ValueError, match="lo <= value <= hi"):
        course.Slider(0, 10, 1, 11)
    with pytest.raises(ValueError, match="step > 0"):
        course.Slider(0, 10, 0, 5)
    with pytest.raises(ValueError, match="is not one of"):
        course.Choice(("a", "b"), "c")
    with pytest.raises(ValueError, match="at least one action or knob"):
        course.explorer(lambda: "x")


def test_png_bytes_are_opaque():
    """The live picture is PNG bytes on white: never the transparent PNG of issue 31."""
    plt = pytest.importorskip("matplotlib.pyplot")
    from PIL import Image

    fig, ax = plt.subplots(figsize=(2, 1))
    fig.patch.set_alpha(0)  # even a figure that asks for a transparent background
    ax.plot([0, 1], [0, 1])
    png = course.png_bytes(fig)
    assert png.startswith(b"\x89PNG") and not plt.fignum_exists(fig.number), "drawn, then closed"
    img = Image.open(io.BytesIO(png)).convert("RGBA")
    assert img.getchannel("A").getextrema() == (255, 255), "every pixel opaque"
