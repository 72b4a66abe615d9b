"""Deliberately broken variants ("mutants") of the lab solutions, to check that the autograder
notices: each one must lose points in the tests named in ``must_fail``, and the first of them must
say what went wrong with the hint for that pitfall (``hint``, a phrase of its message).

A mutant is a few exact text edits of ``solutions/<stem>.py``. Every ``old`` text must occur
exactly once, so when a solution changes, a mutant that no longer applies fails loudly instead
of silently becoming the solution. ``EQUIVALENTS`` are the opposite: other correct ways to write
a lab, which must keep full marks (a check that a strict test is not too strict).
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
    hint: str = ""  # a phrase the message of must_fail[0] must contain (the hint for this pitfall)
    why: str = ""

    @property
    def lab(self) -> str:
        return self.stem.split("_")[0]

    def selection(self) -> str:
        """The tests to grade it on (``-k``): the unit tests, and an engine test (slow) only where
        it must fail."""
        engine = sorted({name.split("[")[0] for name in self.must_fail if name.startswith("engine_")})
        return " or ".join(["not engine", *engine])

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


def all_equivalents() -> list[Mutant]:
    from mutants.lab01_decoder import EQUIVALENT as lab01
    from mutants.lab06_radix_cache import EQUIVALENT as lab06

    return [lab01, lab06]


def randomized_partners() -> dict[str, str]:
    """``{"lab01: rms_norm_fixed": "lab01: rms_norm_random", ...}``: the randomized test that must
    also fail whenever a fixed test of the same function fails (so a wrong implementation never
    collects the random test's points)."""
    from mutants.lab01_decoder import RANDOMIZED as lab01
    from mutants.lab06_radix_cache import RANDOMIZED as lab06

    return {
        f"{lab}: {fixed}": f"{lab}: {rnd}"
        for lab, table in (("lab01", lab01), ("lab06", lab06))
        for fixed, rnd in table.items()
    }
