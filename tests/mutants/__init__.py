"""Deliberately broken variants ("mutants") of the lab solutions, to check that the autograder
notices: each one must lose points in the tests named in ``must_fail``, and the first of them must
say what went wrong with the hint for that pitfall (``hint``, a phrase of its message).

A mutant is a few exact text edits of ``solutions/<stem>.py``. Every ``old`` text must occur
exactly once, so when a solution changes, a mutant that no longer applies fails loudly instead
of silently becoming the solution. ``EQUIVALENTS`` are the opposite: other correct ways to write
a lab, which must keep full marks (a check that a strict test is not too strict).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"

# The classes of holes a careful student finds in a grader (issue 30), each of which every lab must
# show a mutant of (``kind``), unless its module says why the class cannot occur there
# (``NOT_APPLICABLE = {kind: reason}``). "pitfall" is the default: a mistake the lab's docstring names.
KINDS = {
    "boundary": "a comparison the contract states, flipped at its boundary (> for >=): a case lands exactly on it",
    "one_argument": "an input check that looks at one argument only: a case where only another argument is wrong",
    "each_part": "an aggregate checked where each part must hold: a case whose aggregate passes, one part failing",
    "order": "an order of operations the contract states, swapped",
    "engine_reference": "the engine's own implementation, subclassed, aliased or delegated to: the lab scores 0",
    "visible_on_cpu": "a bug that once lost only hidden points, now shown by a visible test on the CPU",
}


@dataclass(frozen=True)
class Mutant:
    name: str
    stem: str  # lab file, e.g. "lab06_radix_cache"
    edits: tuple[tuple[str, str], ...]  # (old, new) exact replacements
    must_fail: tuple[str, ...]  # short test names that must lose their points
    hint: str = ""  # a phrase the message of must_fail[0] must contain (the hint for this pitfall)
    why: str = ""
    kind: str = "pitfall"  # or one of KINDS
    route: str = ""  # a probe's route to the engine's answer (probes.ROUTES)

    def __post_init__(self):
        if self.kind != "pitfall" and self.kind not in KINDS:
            raise ValueError(f"mutant {self.name}: kind {self.kind!r} is not 'pitfall' or one of {sorted(KINDS)}")
        if self.route and self.kind != "engine_reference":
            raise ValueError(f"mutant {self.name}: a probe (route {self.route!r}) is of kind engine_reference")

    @property
    def lab(self) -> str:
        return self.stem.split("_")[0]

    @property
    def key(self) -> str:
        """``lab07-derives_from_the_engine``: unique across labs (two labs may name a mutant alike)."""
        return f"{self.lab}-{self.name}"

    def selection(self, partners: dict[str, str] | None = None) -> str:
        """The tests to grade it on (``-k``): the unit tests, and an engine test (slow) only where
        it must fail. A mutant of one of ``KINDS`` other than ``engine_reference`` (which must
        score 0 on every test) is graded on its ``must_fail`` tests and their randomized partners
        (``partners``: ``{fixed: random}`` short names) only: each run costs seconds."""
        engine = sorted({name.split("[")[0] for name in self.must_fail if name.startswith("engine_")})
        if self.route:  # a probe: one refusal zeroes the lab, wherever it happens
            return " or ".join(sorted({name.split("[")[0] for name in self.must_fail}))
        if self.kind in ("pitfall", "engine_reference"):
            return " or ".join(["not engine", *engine])
        names = {name.split("[")[0] for name in self.must_fail}
        names |= {partners[n] for n in names if partners and n in partners}
        return " or ".join(sorted(names))

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


def lab_modules() -> list:
    """The mutant modules of every lab (``mutants/labNN_*.py``), in lab order. Each defines ``STEM``,
    ``MUTANTS``, ``RANDOMIZED`` ({fixed test: the randomized test that must fail with it}), and may
    define ``EQUIVALENT`` (a correct solution written another way), ``HIDDEN_MUTANTS`` and
    ``NOT_APPLICABLE`` ({kind of KINDS: why no mutant of it can exist for this lab})."""
    import importlib
    import pkgutil

    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if re.fullmatch(r"lab\d\d_\w+", m.name))
    return [importlib.import_module(f"mutants.{name}") for name in names]


def all_mutants() -> list[Mutant]:
    """Every lab's mutants, then the probes of the routes to the engine's answer (``probes.py``)."""
    from mutants.probes import PROBES

    return [m for module in lab_modules() for m in module.MUTANTS] + PROBES


def all_equivalents() -> list[Mutant]:
    return [module.EQUIVALENT for module in lab_modules() if hasattr(module, "EQUIVALENT")]


def all_hidden_mutants() -> list[Mutant]:
    """Variants that pass the visible tests and must fail hidden ones (``hidden.py``, and each lab's)."""
    from mutants.hidden import HIDDEN_MUTANTS

    return HIDDEN_MUTANTS + [m for module in lab_modules() for m in getattr(module, "HIDDEN_MUTANTS", [])]


def randomized_partners() -> dict[str, str]:
    """``{"lab01: rms_norm_fixed": "lab01: rms_norm_random", ...}``: the randomized test that must
    also fail whenever a fixed test of the same function fails (so a wrong implementation never
    collects the random test's points)."""
    return {
        f"{module.STEM.split('_')[0]}: {fixed}": f"{module.STEM.split('_')[0]}: {rnd}"
        for module in lab_modules()
        for fixed, rnd in module.RANDOMIZED.items()
    }
