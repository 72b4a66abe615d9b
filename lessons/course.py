"""Helpers for the lesson notebooks: exercise checks, and one interactive explorer.

**Exercises.** An exercise cell holds a function for you to write; the cell after it calls ``check``,
which runs your function and the engine's on the same inputs and prints one line::

    ✓ rms_norm: same results as minisgl.layers.norm.rms_norm on [12, 576] float32. The lesson continues with yours.
    ✗ rms_norm: different from minisgl.layers.norm.rms_norm: result[0, 3]: expected 0.0512, got 0.0498 ...
    ○ rms_norm: exercise open (...). The lesson continues with minisgl.layers.norm.rms_norm.

An exercise that *is* the reference, or calls it, is open too: it is the engine's answer, not yours.

``check`` returns what the rest of the lesson uses: your function once it agrees, the engine's until
then. So a notebook runs top to bottom with every exercise open (that is how CI runs it).

**Explorer.** ``explorer(draw, actions, knobs=...)`` shows controls that change some state and
redraw it: sliders and dropdowns (``Slider``, ``Choice``) for a knob the picture is a function of,
buttons for a step (step the scheduler, insert into a radix tree, ...). Without a live frontend (CI,
GitHub, plain Python) the controls cannot work, so it always shows a static picture as well.
"""

from __future__ import annotations

import html
import importlib.util
import math
import textwrap
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

RESULTS: dict[str, str] = {}  # exercise name -> "pass" | "fail" | "open", in the order checked
_MARK = {"pass": "✓", "fail": "✗", "open": "○"}


# ---- exercises ---------------------------------------------------------------------------------
def check(
    student: Any,
    reference: Any,
    *inputs: Any,
    name: str | None = None,
    against: str | None = None,
    run: Callable[..., Any] | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-5,
) -> Any:
    """Compare ``student(*inputs)`` with ``reference(*inputs)``, print ✓ / ✗ / ○ (open), and return
    the one the rest of the lesson should use: ``student`` if it agrees, else ``reference``.

    ``run(impl, *inputs)``, when given, replaces the call: it plays a scenario with ``impl`` (a function
    or a tuple of them) and returns a record to compare, e.g. ``{"match [1, 2]": (2, [0, 1])}``.
    Tensors compare with ``atol``/``rtol`` (same shape and dtype required), other values with ``==``
    (floats with the tolerances). Each call gets fresh copies of tensor inputs. An exercise that
    raises ``NotImplementedError`` is *open*; any other exception is a failure and its last frames
    are printed."""
    name = name or getattr(student, "__name__", "your function")
    against = against or _name(reference)
    call = run or (lambda fn, *args: fn(*args))
    expected = call(reference, *_fresh(inputs))  # a failure here is the lesson's bug: let it raise
    # the reference's parts the exercise must not call: a tuple of functions may share some with the
    # reference (the engine's, handed on by an earlier check whose exercise is still open)
    own = [r for r, s in zip(reference, student) if r is not s] if _tuples(student, reference) else [reference]
    if student is reference or not own:  # e.g. the name was rebound to the engine's by an earlier check
        return _verdict(name, "open", f"○ {name}: exercise open (this is {against} itself).", against, reference)
    try:
        got, borrowed = _watching(_codes(own), lambda: call(student, *_fresh(inputs)))
    except NotImplementedError as e:
        return _verdict(name, "open", f"○ {name}: exercise open ({e or 'NotImplementedError'}).", against, reference)
    except Exception as e:  # the student's bug: show where (their frames, not ours), then carry on
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename != __file__][-3:]
        where = textwrap.indent("".join(traceback.format_list(frames)).rstrip(), "  ")
        return _verdict(name, "fail", f"✗ {name}: raised {type(e).__name__}: {e}\n{where}\n", against, reference)
    if borrowed:
        message = f"○ {name}: exercise open (it calls {against}, the function it is checked against: write your own)."
        return _verdict(name, "open", message, against, reference)
    problem = compare(expected, got, atol=atol, rtol=rtol)
    if problem is not None:
        return _verdict(name, "fail", f"✗ {name}: different from {against}: {problem}.", against, reference)
    RESULTS[name] = "pass"
    print(f"✓ {name}: same results as {against}{_describe(inputs)}. The lesson continues with yours.")
    return student


def _tuples(student: Any, reference: Any) -> bool:
    return isinstance(student, tuple) and isinstance(reference, tuple) and len(student) == len(reference)


def _codes(reference: Any) -> set:
    """The code objects of ``reference``: a function, a method, a partial, a class (its methods) or
    a tuple of those."""
    import functools

    found, todo = set(), [reference]
    while todo:
        obj = todo.pop()
        if isinstance(obj, tuple | list):
            todo += list(obj)
        elif isinstance(obj, functools.partial):
            todo.append(obj.func)
        elif isinstance(obj, type):
            todo += [v for v in vars(obj).values() if callable(v) or isinstance(v, staticmethod | classmethod)]
        elif isinstance(obj, staticmethod | classmethod):
            todo.append(obj.__func__)
        elif hasattr(obj, "__func__"):  # a bound method
            todo.append(obj.__func__)
        elif hasattr(obj, "__code__"):
            found.add(obj.__code__)
    return found


def _watching(codes: set, fn: Callable[[], Any]) -> tuple[Any, bool]:
    """``fn()``, and whether any of ``codes`` ran while it did (the student's function calling the
    reference: an exercise that wraps the engine's answer is not done)."""
    import sys

    seen = False

    def profile(frame, event, arg):
        nonlocal seen
        if event == "call" and frame.f_code in codes:
            seen = True

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        return fn(), seen
    finally:
        sys.setprofile(previous)


def _verdict(name: str, status: str, message: str, against: str, reference: Any) -> Any:
    RESULTS[name] = status
    sep = "" if message.endswith("\n") else " "
    print(f"{message}{sep}The lesson continues with {against}.")
    return reference


def summary() -> None:
    """One line per exercise checked so far in this notebook."""
    if not RESULTS:
        print("no exercise checked yet")
    for name, status in RESULTS.items():
        what = {"pass": "done", "fail": "differs from the engine", "open": "open"}[status]
        print(f"  {_MARK[status]} {name}: {what}")
    done = sum(s == "pass" for s in RESULTS.values())
    print(f"{done} of {len(RESULTS)} exercises agree with the engine")


def compare(expected: Any, got: Any, atol: float = 1e-5, rtol: float = 1e-5, path: str = "result") -> str | None:
    """``None`` when ``got`` matches ``expected``, else where and how it differs (expected vs got)."""
    torch = _torch()
    if torch is not None and isinstance(expected, torch.Tensor):
        return _compare_tensors(torch, expected, got, atol, rtol, path)
    if isinstance(expected, float) and isinstance(got, int | float) and not isinstance(got, bool):
        if math.isclose(got, expected, rel_tol=rtol, abs_tol=atol):
            return None
        return f"{path}: expected {expected:.6g}, got {got:.6g}"
    if isinstance(expected, Mapping):
        if not isinstance(got, Mapping) or list(got) != list(expected):
            return f"{path}: expected {_short(expected)}, got {_short(got)}"
        for key in expected:
            problem = compare(expected[key], got[key], atol, rtol, f"{path}[{key!r}]")
            if problem:
                return problem
        return None
    if isinstance(expected, list | tuple):
        if not isinstance(got, list | tuple) or len(got) != len(expected):
            return f"{path}: expected {_short(expected)}, got {_short(got)}"
        for i, (e, g) in enumerate(zip(expected, got)):
            problem = compare(e, g, atol, rtol, f"{path}[{i}]")
            if problem:
                return problem
        return None
    return None if got == expected else f"{path}: expected {_short(expected)}, got {_short(got)}"


def _compare_tensors(torch, expected, got, atol, rtol, path) -> str | None:
    if not isinstance(got, torch.Tensor):
        return f"{path}: expected a tensor of shape {list(expected.shape)}, got {_short(got)}"
    if got.shape != expected.shape:
        return f"{path}: expected shape {list(expected.shape)}, got {list(got.shape)}"
    if got.dtype != expected.dtype:
        return f"{path}: expected dtype {expected.dtype}, got {got.dtype}"
    e, g = expected.detach().cpu().double(), got.detach().cpu().double()
    close = torch.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
    if bool(close.all()):
        return None
    where = tuple((~close).nonzero()[0].tolist())
    diff = float((g - e).abs().nan_to_num(math.inf).max())
    return (
        f"{path}{list(where)}: expected {e[where].item():.6g}, got {g[where].item():.6g} "
        f"({int((~close).sum())} of {close.numel()} values differ, max |diff| {diff:.3g})"
    )


def _fresh(inputs: tuple) -> tuple:
    torch = _torch()
    if torch is None:
        return inputs
    return tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in inputs)


def _describe(inputs: tuple) -> str:
    torch = _torch()
    shapes = [f"{list(x.shape)} {str(x.dtype).removeprefix('torch.')}" for x in inputs if torch and torch.is_tensor(x)]
    return f" on {', '.join(shapes)}" if shapes else ""


def _name(fn: Any) -> str:
    qual = getattr(fn, "__qualname__", None)
    if qual is None or "<" in qual:
        return "the reference"
    module = getattr(fn, "__module__", None)
    return qual if module in (None, "__main__", "builtins") else f"{module}.{qual}"


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _torch():
    import sys

    return sys.modules.get("torch")  # never import torch here: the helper works without it


# ---- the explorer ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Slider:
    """A continuous (or integer) knob: a slider from ``lo`` to ``hi`` in steps of ``step``, starting at
    ``value``. All four ints make an integer slider."""

    lo: float
    hi: float
    step: float
    value: float

    def __post_init__(self):
        if not self.lo <= self.value <= self.hi or self.step <= 0:
            raise ValueError(f"Slider needs lo <= value <= hi and step > 0, got {self}")

    @property
    def integer(self) -> bool:
        """An integer slider (all four ints): it takes ints only."""
        return all(isinstance(v, int) for v in (self.lo, self.hi, self.step, self.value))


@dataclass(frozen=True)
class Choice:
    """A knob with a few named settings: a dropdown over ``options``, starting at ``value``."""

    options: tuple
    value: Any

    def __post_init__(self):
        object.__setattr__(self, "options", tuple(self.options))
        if self.value not in self.options:
            raise ValueError(f"Choice: {self.value!r} is not one of {self.options}")


class Explorer:
    """State behind the controls. ``press(label, text)`` runs an action, ``turn(name, value)`` sets a
    knob; both return the new picture (a matplotlib Figure or a str), which ``draw`` makes from the
    knobs' values (passed as keyword arguments when there are knobs)."""

    def __init__(
        self,
        draw: Callable[..., Any],
        actions: Mapping[str, Callable[..., Any]],
        text: str | None,
        knobs: Mapping[str, Slider | Choice],
    ):
        self.draw_fn, self.actions, self.text = draw, dict(actions), text
        self.knobs = dict(knobs)
        self.values: dict[str, Any] = {name: k.value for name, k in self.knobs.items()}
        self.picture: Any = None  # the last picture drawn
        self.widget: Any = None  # the controls, when a live kernel shows them

    def draw(self) -> Any:
        self.picture = self.draw_fn(**self.values)
        return self.picture

    def press(self, label: str, text: str | None = None) -> Any:
        if label not in self.actions:
            raise ValueError(f"no button {label!r}; the buttons are {list(self.actions)}")
        action = self.actions[label]
        if self.text is None:
            action()
        else:
            action(self.text if text is None else text)
        return self.draw()

    def turn(self, name: str, value: Any) -> Any:
        """Set knob ``name`` to ``value`` and redraw. A value the knob cannot take raises ValueError and
        changes nothing; so does a draw that fails (the knob keeps its old value)."""
        if name not in self.knobs:
            raise ValueError(f"no knob {name!r}; the knobs are {list(self.knobs)}")
        knob = self.knobs[name]
        if isinstance(knob, Choice) and value not in knob.options:
            raise ValueError(f"{name}: {value!r} is not one of {knob.options}")
        if isinstance(knob, Slider):
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or (knob.integer and not isinstance(value, int)):
                kind = "an int" if knob.integer else "a number"
                raise ValueError(f"{name}: {value!r} is not {kind} (a slider from {knob.lo} to {knob.hi})")
            if not knob.lo <= value <= knob.hi:
                raise ValueError(f"{name}: {value!r} is outside [{knob.lo}, {knob.hi}]")
        old = self.values[name]
        self.values[name] = value
        try:
            return self.draw()
        except Exception:
            self.values[name] = old
            raise


def explorer(
    draw: Callable[..., Any],
    actions: Mapping[str, Callable[..., Any]] | None = None,
    *,
    text: str | None = None,
    knobs: Mapping[str, Slider | Choice] | None = None,
    caption: str = "the state when this cell ran",
) -> Explorer:
    """Controls that change some state and redraw ``draw(**knob values)``: a matplotlib Figure or a
    str. ``knobs`` maps a name to a ``Slider`` or a ``Choice`` (the picture is a function of them);
    ``actions`` maps a button label to a function that changes state (with ``text``, a text box whose
    value the actions take). Always shows a static picture of the current state; in a live notebook
    the controls redraw the picture in the widget under it. Headless (CI, nbconvert, plain Python)
    the static picture is all there is."""
    ex = Explorer(draw, actions or {}, text, knobs or {})
    if not ex.actions and not ex.knobs:
        raise ValueError("explorer needs at least one action or knob")
    ex.draw()
    live = _live_kernel()
    if live:
        ex.widget = _controls(ex)
        names = " · ".join([*ex.knobs, *ex.actions])
        _display_widget(ex.widget, f"[controls: {names}; they need a live notebook]")
    # GitHub and CI show no live widgets: say what the controls do only as what a live notebook does
    live_note = " In a live notebook, the controls above redraw the picture between them and this one."
    print(f"Static picture: {caption}." + (live_note if live else ""))
    show(ex.picture)
    return ex


def _controls(ex: Explorer) -> Any:
    """The ipywidgets for ``ex``: knobs, buttons, a status line and the picture. The picture is an
    Image widget fed PNG bytes (or an HTML <pre> for text): a callback never goes through
    display() and the inline backend, whose output from a widget callback can come out blank."""
    import ipywidgets as w

    status = w.HTML(value="")
    image = w.Image(format="png", layout=w.Layout(display="none", max_width="100%"))
    textview = w.HTML(layout=w.Layout(display="none"))
    box = w.Text(value=ex.text, layout=w.Layout(width="32em")) if ex.text is not None else None

    def redraw(what: str, change: Callable[[], Any]) -> None:
        try:
            picture = change()
        except Exception as e:  # a bad input: say so, keep the explorer alive
            status.value = _html_line(f"{what}: {type(e).__name__}: {e}")
            return
        status.value = _html_line(f"after {what}:")
        if isinstance(picture, str):
            textview.value = "<pre>" + html.escape(picture, quote=False) + "</pre>"
            textview.layout.display, image.layout.display = None, "none"
        else:
            image.value = png_bytes(picture)
            image.layout.display, textview.layout.display = None, "none"

    rows = []
    for name, knob in ex.knobs.items():
        if isinstance(knob, Choice):
            control = w.Dropdown(options=list(knob.options), value=knob.value, description=name)
        elif knob.integer:
            control = w.IntSlider(min=knob.lo, max=knob.hi, step=knob.step, value=knob.value, description=name)
        else:
            control = w.FloatSlider(min=knob.lo, max=knob.hi, step=knob.step, value=knob.value, description=name)
        control.style.description_width = "initial"
        # continuous_update=False: a drag redraws once, where it is released
        if hasattr(control, "continuous_update"):
            control.continuous_update = False

        def on_change(change, name=name):
            redraw(f"{name} = {change['new']}", lambda: ex.turn(name, change["new"]))

        control.observe(on_change, names="value")
        rows.append(control)
    buttons = []
    for label in ex.actions:
        button = w.Button(description=label)

        def on_click(_, label=label):
            value = box.value if box is not None else None
            redraw(f"'{label}'" + (f" {value!r}" if box is not None else ""), lambda: ex.press(label, value))

        button.on_click(on_click)
        buttons.append(button)
    if buttons:
        rows.append(w.HBox(([box] if box is not None else []) + buttons))
    return w.VBox(rows + [status, image, textview])


def png_bytes(fig: Any) -> bytes:
    """A matplotlib Figure as PNG bytes (drawn on a white background: never transparent)."""
    import io

    buf = io.BytesIO()
    patch = getattr(fig, "patch", None)  # its alpha would win over the white facecolor: save it opaque
    alpha = patch.get_alpha() if patch is not None else None
    if patch is not None:
        patch.set_alpha(1.0)
    try:
        fig.savefig(buf, format="png", dpi=fig.dpi, bbox_inches="tight", facecolor="white")
    finally:
        if patch is not None:
            patch.set_alpha(alpha)
    if type(fig).__module__.startswith("matplotlib"):
        import matplotlib.pyplot as plt

        plt.close(fig)
    return buf.getvalue()


def _html_line(text: str) -> str:
    return "<code>" + html.escape(text, quote=False) + "</code>"


def show(picture: Any) -> None:
    """Display a Figure as a PNG (and close it, so the inline backend does not show it twice) or print text."""
    if isinstance(picture, str):
        print(picture)
        return
    from IPython.display import Image, display

    display(Image(data=png_bytes(picture), format="png"))


def _display_widget(widget: Any, text: str) -> None:
    # the widget's own repr would put a long "VBox(children=(...))" where GitHub shows text/plain
    from IPython.display import display

    view = {"version_major": 2, "version_minor": 0, "model_id": widget.model_id}
    display({"application/vnd.jupyter.widget-view+json": view, "text/plain": text}, raw=True)


def _live_kernel() -> bool:
    """True inside a Jupyter kernel with ipywidgets installed (a frontend may show the buttons)."""
    if importlib.util.find_spec("IPython") is None or importlib.util.find_spec("ipywidgets") is None:
        return False
    from IPython import get_ipython

    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None
