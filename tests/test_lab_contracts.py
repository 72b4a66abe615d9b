"""Labs ask for design, not transcription (instructor-only: it reads solutions/): a solution's
expressions do not appear in its stub (the docstring, the stub's messages) or in its lesson's code, and
no lesson exercise is a function the lab asks for.

An expression is the right-hand side of a solution line (after ``=``, ``return``, ``if``, ...), with its
spaces normalised, of 12 characters or more; it counts as given away when it occurs verbatim in the
lab's stub or in a code cell of the lesson with the lab's number.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from autograder.generate import SOLUTIONS_DIR, expected_labs

pytestmark = pytest.mark.instructor

REPO = Path(__file__).resolve().parents[1]
LIMIT = 0.03  # the share of solution expressions a stub or lesson may show
_LEAD = re.compile(r"^(?:return|yield|if|elif|while|assert|raise|for .+? in|with)\s+")
_ASSIGN = re.compile(r"^[^=(\[{]*?(?<![=!<>+\-*/%&|^])=(?!=)\s*")


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().rstrip(":")


def solution_expressions(source: str) -> list[str]:
    """The right-hand side of each line inside the solution regions (12 characters or more)."""
    out, inside = [], False
    for line in source.splitlines():
        if "# BEGIN SOLUTION" in line:
            inside = True
        elif "# END SOLUTION" in line:
            inside = False
        elif inside and line.strip() and not line.strip().startswith("#"):
            code = line.split("  #")[0].strip()
            rhs = _ASSIGN.sub("", code, count=1)
            rhs = _LEAD.sub("", rhs, count=1)
            if len(_norm(rhs)) >= 12:
                out.append(_norm(rhs))
    return out


def lesson_code(number: str) -> str:
    found = sorted((REPO / "lessons").glob(f"{number}_*.ipynb"))
    if not found:
        return ""
    cells = json.loads(found[0].read_text())["cells"]
    return _norm(" ".join("".join(c["source"]) for c in cells if c["cell_type"] == "code"))


def given_away() -> dict[str, tuple[list[str], int]]:
    """``{lab: (expressions shown in the stub or the lesson, expressions in all)}``."""
    out = {}
    for name, stub in expected_labs().items():
        source = (SOLUTIONS_DIR / name).read_text()
        exprs = solution_expressions(source)
        shown = _norm(stub) + " " + lesson_code(name[3:5])
        out[name] = ([e for e in exprs if e in shown], len(exprs))
    return out


def test_solutions_are_not_in_their_stubs_or_lessons():
    found = given_away()
    shown = sum(len(v[0]) for v in found.values())
    total = sum(v[1] for v in found.values())
    per_lab = {name: f"{len(v[0])}/{v[1]}" for name, v in found.items() if v[0]}
    detail = "\n".join(f"  {name}: {e}" for name, v in found.items() for e in v[0])
    assert shown <= LIMIT * total, (
        f"{shown} of {total} solution expressions ({shown / total:.1%}) appear verbatim in the stubs or the "
        f"lessons' code (limit {LIMIT:.0%}); per lab {per_lab}:\n{detail}"
    )


def _lab_functions() -> dict[str, set[str]]:
    """Per lab number, the names of the functions and methods its solution regions sit in."""
    out: dict[str, set[str]] = {}
    for path in sorted(SOLUTIONS_DIR.glob("lab*.py")):
        source = path.read_text()
        lines = {i for i, line in enumerate(source.splitlines(), 1) if "# BEGIN SOLUTION" in line}
        names = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef) and any(node.lineno <= i <= node.end_lineno for i in lines):
                names.add(node.name)
        out[path.name[3:5]] = names - {"__init__"}
    return out


def test_no_lesson_exercise_is_a_lab_function():
    """An exercise (``check(fn, ...)`` in a lesson) is a different sub-step than the lab's functions."""
    labs = _lab_functions()
    clashes = []
    for path in sorted((REPO / "lessons").glob("[0-9][0-9]_*.ipynb")):
        code = "\n".join(
            "".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"
        )
        calls = re.findall(r"\bcheck\((.*?)\)\s*$", code, re.S | re.M)
        exercises = set(re.findall(r"\bcheck\(\s*([A-Za-z_]\w*)\s*,", code))
        exercises |= {m for call in calls for m in re.findall(r'\bname="([A-Za-z_]\w*)', call)}
        same = exercises & labs.get(path.name[:2], set())
        clashes += [f"{path.name}: exercise {name} is lab {path.name[:2]}'s {name}" for name in sorted(same)]
    assert not clashes, "\n".join(clashes)
