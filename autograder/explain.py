"""The student-facing failure message of a test: a few lines saying what went wrong (the assertion
text, "not implemented yet" for a stub, or the exception and the line of the lab file that raised
it), never a traceback.

A randomized (Hypothesis) test that fails raises its failure with a note naming the falsifying
example, or, when it found several distinct failures, an ``ExceptionGroup`` of them. Either way
the student sees one failure, the smallest, with its example on one line.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

MESSAGE_LINES = 14

# older Hypothesis releases write "Falsifying example:", newer ones (6.170 for one) "Failing test case:"
_EXAMPLE = re.compile(
    r"^(?:Falsifying (?:explicit )?example|Failing (?:explicit )?test case): [\w.]+\((?P<args>.*)\)$", re.S
)
# notes Hypothesis adds that only make sense next to a traceback
_HYPOTHESIS_NOISE = ("(note:", "Explanation:", "The test ", "You can ", "Unreliable ", "Trying example", "Hypothesis ")


def trim(text: str, lines: int = MESSAGE_LINES) -> str:
    """At most ``lines`` lines of at most 300 characters each."""
    out = text.strip().split("\n")
    if len(out) > lines:
        out = out[:lines] + ["..."]
    return "\n".join(line if len(line) <= 300 else line[:300] + "..." for line in out)


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, in order; ``[exc]`` for a plain one."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def example_line(note: str) -> str | None:
    """``Falsifying example: f(\\n    a=1,\\n    b=2,\\n)`` (or ``Failing test case: ...``) -> ``failing
    example: a=1, b=2``."""
    m = _EXAMPLE.match(note.strip())
    if m is None:
        return None
    parts = (re.sub(r"\s+#.*$", "", part).strip() for part in m.group("args").split("\n"))  # drop comments
    args = " ".join(part for part in parts if part).rstrip(",")
    return f"smallest failing example (random test): {args}"


def explain(excinfo: pytest.ExceptionInfo, impl_folder: Path) -> str:
    """A few lines that tell a student what went wrong (not a traceback)."""
    found = leaves(excinfo.value)
    exc = found[-1]  # Hypothesis lists distinct failures largest example first: the last is the smallest
    if exc is not excinfo.value:
        excinfo = pytest.ExceptionInfo.from_exception(exc)
    examples, notes = [], []
    for note in getattr(exc, "__notes__", []):
        line = example_line(note)
        if line is not None:
            examples.append(line)
        elif note.strip() and not note.startswith(_HYPOTHESIS_NOISE):
            notes.append(note)
    if len(found) > 1:
        examples.append(f"(the random test found {len(found)} different failures; this is the smallest)")
    text = _message(exc)
    where = _student_frame(excinfo, impl_folder)
    if where and not isinstance(exc, (AssertionError, NotImplementedError)):
        text += f"\n  raised at {where}"
    text = "\n".join([text, *notes]) if notes else text
    return trim(text, MESSAGE_LINES - len(examples)) + "".join(f"\n{line}" for line in examples)


def _message(exc: BaseException) -> str:
    if isinstance(exc, NotImplementedError):
        return f"not implemented yet: {exc}" if str(exc) else "not implemented yet (NotImplementedError)"
    if isinstance(exc, AssertionError):
        lines = str(exc).split("\n")
        # keep our message; drop pytest's rewritten "assert ..." explanation when a message exists
        if len(lines) > 1 and not lines[0].startswith("assert "):
            cut = next((i for i, line in enumerate(lines) if line.startswith("assert ")), len(lines))
            lines = lines[:cut]
        return "\n".join(lines) or "assertion failed"
    if isinstance(exc, pytest.fail.Exception):
        return exc.msg or "failed"
    if isinstance(exc, SystemExit):
        return f"your code called sys.exit({exc.code!r}); lab code must return or raise, never exit"
    return f"{type(exc).__name__}: {exc}"


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
