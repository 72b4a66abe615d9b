"""The lessons' helper module (``lessons/course.py``): exercise checks and the headless explorer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

_PATH = Path(__file__).resolve().parent.parent / "lessons" / "course.py"
_spec = importlib.util.spec_from_file_location("lesson_course", _PATH)
course = importlib.util.module_from_spec(_spec)
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
