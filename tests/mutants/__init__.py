"""Deliberately broken variants ("mutants") of the lab solutions, to check that the autograder
notices: each one must lose points, and in the tests named in ``must_fail``.

A mutant is a few exact text edits of ``solutions/<stem>.py``. Every ``old`` text must occur
exactly once, so when a solution changes, a mutant that no longer applies fails loudly instead
of silently becoming the solution.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"


@dataclass(frozen=True)
class Mutant:
    name: str
    stem: str  # lab file, e.g. "lab06_radix_cache"
    edits: tuple[tuple[str, str], ...]  # (old, new) exact replacements
    must_fail: tuple[str, ...]  # short test names that must lose their points
    why: str = ""

    @property
    def lab(self) -> str:
        return self.stem.split("_")[0]

    def source(self) -> str:
        text = (SOLUTIONS / f"{self.stem}.py").read_text()
        for old, new in self.edits:
            count = text.count(old)
            if count != 1:
                raise ValueError(
                    f"mutant {self.name}: {old!r} occurs {count} times in solutions/{self.stem}.py "
                    "(expected once); update the mutant to the new solution"
                )
            text = text.replace(old, new)
        return text

    def write(self, folder: Path) -> Path:
        """A graded folder holding only this mutant's lab file."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{self.stem}.py").write_text(self.source())
        return folder


def all_mutants() -> list[Mutant]:
    from mutants.lab01_decoder import MUTANTS as lab01
    from mutants.lab06_radix_cache import MUTANTS as lab06

    return lab01 + lab06
