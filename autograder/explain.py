"""The student-facing failure message of a test: a few lines saying what went wrong (the assertion
text, "not implemented yet" for a stub, or the exception and the line of the lab file that raised
it), never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

MESSAGE_LINES = 14


def trim(text: str, lines: int = MESSAGE_LINES) -> str:
    """At most ``lines`` lines of at most 300 characters each."""
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
    return trim(text)


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
