"""Generate the student stubs in ``labs/`` from the instructor solutions in ``solutions/``.

A solution file is copied line for line, except that each region

    # BEGIN SOLUTION hint="split the node when the match ends inside its key"
    ...the solution...
    # END SOLUTION

becomes one line at the indentation of the ``BEGIN`` marker:

    raise NotImplementedError("Lab 06: split the node when the match ends inside its key")

The lab number comes from the file name (``lab06_radix_cache.py`` -> ``Lab 06``). Docstrings,
signatures, imports and helper code outside the regions reach the student unchanged.

    python -m autograder.generate           # rewrite labs/ from solutions/
    python -m autograder.generate --check   # exit 1 if labs/ is not what the generator writes
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS_DIR = REPO / "solutions"
LABS_DIR = REPO / "labs"

LAB_FILE = re.compile(r"^lab(\d\d)_[a-z0-9_]+\.py$")
_BEGIN = re.compile(r'^(?P<indent>[ \t]*)# BEGIN SOLUTION(?:\s+hint="(?P<hint>[^"]*)")?\s*$')
_END = re.compile(r"^[ \t]*# END SOLUTION\s*$")
DEFAULT_HINT = "implement this part; the docstring above says what it must do"


class GenerateError(ValueError):
    pass


def lab_number(path: Path) -> str:
    m = LAB_FILE.match(path.name)
    if m is None:
        raise GenerateError(f"{path.name}: a lab file is named labNN_topic.py (e.g. lab06_radix_cache.py)")
    return m.group(1)


def make_stub(source: str, lab: str, name: str = "<solution>") -> str:
    """The lab text for one solution text; raises ``GenerateError`` on unbalanced markers."""
    out: list[str] = []
    begin_line = 0
    for lineno, line in enumerate(source.splitlines(keepends=True), start=1):
        begin = _BEGIN.match(line.rstrip("\r\n"))
        if "BEGIN SOLUTION" in line and begin is None:
            raise GenerateError(f'{name}:{lineno}: malformed marker; write  # BEGIN SOLUTION hint="..."')
        if begin is not None:
            if begin_line:
                raise GenerateError(f"{name}:{lineno}: BEGIN SOLUTION inside the region opened at line {begin_line}")
            begin_line = lineno
            message = f"Lab {lab}: {begin.group('hint') or DEFAULT_HINT}"
            out.append(f"{begin.group('indent')}raise NotImplementedError({json.dumps(message)})\n")
        elif _END.match(line.rstrip("\r\n")):
            if not begin_line:
                raise GenerateError(f"{name}:{lineno}: END SOLUTION without a BEGIN SOLUTION")
            begin_line = 0
        elif not begin_line:
            out.append(line)
    if begin_line:
        raise GenerateError(f"{name}:{begin_line}: BEGIN SOLUTION is never closed by END SOLUTION")
    text = "".join(out)
    try:
        compile(text, name, "exec")
    except SyntaxError as e:
        raise GenerateError(f"{name}: the generated stub does not compile ({e}); check the markers' indentation") from e
    return text


def expected_labs(solutions: Path = SOLUTIONS_DIR) -> dict[str, str]:
    """``{file name: stub text}`` for every ``labNN_*.py`` in ``solutions``."""
    files = sorted(p for p in solutions.glob("lab*.py") if LAB_FILE.match(p.name))
    return {p.name: make_stub(p.read_text(), lab_number(p), f"solutions/{p.name}") for p in files}


def differences(solutions: Path = SOLUTIONS_DIR, labs: Path = LABS_DIR) -> list[str]:
    """What differs between ``labs`` and what the generator would write (empty: up to date)."""
    want = expected_labs(solutions)
    have = {p.name for p in labs.glob("lab*.py") if LAB_FILE.match(p.name)} if labs.is_dir() else set()
    problems = [f"labs/{n} is missing" for n in sorted(set(want) - have)]
    problems += [f"labs/{n} has no solution in solutions/ (remove it)" for n in sorted(have - set(want))]
    stale = [n for n in sorted(have & set(want)) if (labs / n).read_text() != want[n]]
    problems += [f"labs/{n} differs from its generated stub" for n in stale]
    return problems


def write_labs(solutions: Path = SOLUTIONS_DIR, labs: Path = LABS_DIR) -> list[str]:
    """Write every stub; return the names of the files that changed."""
    labs.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, text in expected_labs(solutions).items():
        target = labs / name
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
            changed.append(name)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autograder.generate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 if labs/ is out of date")
    args = ap.parse_args(argv)
    try:
        if args.check:
            problems = differences()
            for p in problems:
                print(p)
            if problems:
                print("run `python -m autograder.generate` to regenerate labs/ from solutions/")
            return 1 if problems else 0
        changed = write_labs()
    except GenerateError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"labs/: {len(changed)} file(s) rewritten" + (f" ({', '.join(changed)})" if changed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
