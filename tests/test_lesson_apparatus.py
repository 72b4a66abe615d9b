"""The course apparatus around the lessons: each lesson's header agrees with the README's course map,
the glossary points at lessons and sections that exist, and lessons/NUMBERS.md is what the committed
lessons and recorded results say now."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LESSONS = ROOT / "lessons"
NOTEBOOKS = sorted(LESSONS.glob("[0-9][0-9]_*.ipynb"))


def _first_cell(path: Path) -> str:
    return "".join(json.loads(path.read_text())["cells"][0]["source"])


def _sections(path: Path) -> set[int]:
    cells = json.loads(path.read_text())["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return {int(m) for m in re.findall(r"^## (\d+)\.", text, re.M)}


def _minutes(text: str) -> float | None:
    """'about 1.5 h' / '1 hour' / '30 min' / '45 minutes' -> minutes; None if there is no duration."""
    m = re.search(r"(\d+(?:\.\d+)?)\s*(h\b|hours?|min\b|minutes?)", text)
    if m is None:
        return None
    return float(m.group(1)) * (60 if m.group(2).startswith("h") else 1)


def _course_map() -> dict[str, tuple[set[str], float | None]]:
    """README's course map: lesson number -> (the lessons it needs, its time in minutes)."""
    rows = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) >= 6 and re.fullmatch(r"\d\d", cols[0]):
            rows[cols[0]] = (set(re.findall(r"\b\d\d\b", cols[3])), _minutes(cols[4]))
    return rows


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_lesson_header_matches_the_course_map(path: Path):
    """Every lesson says what it teaches, what it needs and how long it takes, as the README's map does."""
    first, number = _first_cell(path), path.name[:2]
    for field in ("You will learn", "Prerequisites", "Time"):
        assert re.search(rf"\*\*{field}:?\*\*", first), f"{path.name}: the first cell has no **{field}:** line"
    prereq = first.split("**Prerequisites:**", 1)[1].split("**Time:**", 1)[0]
    time = first.split("**Time:**", 1)[1]
    needs, minutes = _course_map()[number]
    said = set(re.findall(r"\b\d\d\b", prereq))
    assert said == needs, (
        f"{path.name}: its header needs lessons {sorted(said) or 'none'}, the README's course map "
        f"{sorted(needs) or 'none'}"
    )
    assert _minutes(time) == minutes, (
        f"{path.name}: its header says {_minutes(time)} min, the README's course map {minutes} min"
    )


def test_glossary_points_at_lessons_and_sections_that_exist():
    text = (LESSONS / "GLOSSARY.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| **") or line.startswith("| `")]
    assert len(rows) >= 30, "the glossary lost its rows"
    by_name = {p.name: p for p in NOTEBOOKS}
    for row in rows:
        taught = row.rstrip("|").rsplit("|", 1)[1]
        refs = re.findall(r"\[(\d\d)\]\(([^)]+)\)(?: §([\d–]+))?", taught)
        assert refs, f"GLOSSARY.md: {row[:60]!r} says where it is taught without a link to a lesson"
        for number, target, section in refs:
            assert target in by_name and target.startswith(number), f"GLOSSARY.md: {row[:40]!r} links {target}"
            for s in re.findall(r"\d+", section):
                assert int(s) in _sections(by_name[target]), f"GLOSSARY.md: {target} has no section {s}"


def test_numbers_md_is_current():
    spec = importlib.util.spec_from_file_location("lesson_make_numbers", LESSONS / "make_numbers.py")
    numbers = importlib.util.module_from_spec(spec)
    sys.modules["lesson_make_numbers"] = numbers
    spec.loader.exec_module(numbers)
    assert numbers.main(["--check"]) == 0, "lessons/NUMBERS.md is stale: run python lessons/make_numbers.py"
    table = (LESSONS / "NUMBERS.md").read_text()
    assert "h200.json" in table, "NUMBERS.md lost the recorded H200 runs the lessons read"


# a number that reports a measurement or a result: a decimal, or a number with a unit of time, memory,
# throughput, a ratio or a share (spans of code and math are left out)
_MEASURED = re.compile(
    r"(?<![\w.$])(~?\d{1,3}(?:,\d{3})+|~?\d+(?:\.\d+)?)"
    r"(\s?(?:ms|s|µs|us|ns|GB|GiB|MB|MiB|KB|KiB|tok/s|tokens/s|%|x|×|seconds|minutes|GB/s|TB/s))?(?![\w])"
)
_FACT = re.compile(r"<!--\s*facts?:(.*?)-->", re.S)  # <!-- facts: 141 GB, 4.8 TB/s (an H200's) -->


def _measured(text: str) -> list[str]:
    text = re.sub(r"`[^`]*`|\$[^$]*\$|<!--.*?-->", "", text, flags=re.S)
    return [m.group(0) for m in _MEASURED.finditer(text) if "." in m.group(1) or m.group(2)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_measurements_in_prose_are_rendered_from_data(path: Path):
    """A number in a lesson's prose that reports a measurement or a result is rendered from the variable
    that holds it (``display(Markdown(f"..."))`` in a code cell), so a re-run cannot make the prose lie.
    A static Markdown cell may state such a number only as a fact it names in a ``<!-- facts: ... -->``
    comment (a card's bandwidth, a published figure, the lesson's time)."""
    problems = []
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        facts = " ".join(_FACT.findall(text))
        loose = [n for n in _measured(text) if n.lstrip("~") not in facts]
        if loose:
            problems.append(f"cell {i}: {loose} (render them from the data, or name them in <!-- facts: ... -->)")
    assert not problems, f"{path.name}: numbers in static prose:\n" + "\n".join(problems)
