"""Generate the student stubs in ``labs/`` from the instructor solutions in ``solutions/``.

A solution file is copied line for line, except that each region

    # BEGIN SOLUTION what="the node split where the match ends inside its key" hint="slice key and value at n; ..."
    ...the solution...
    # END SOLUTION

becomes one line at the indentation of the ``BEGIN`` marker, saying *what* is missing (never how):

    raise NotImplementedError("Lab 06: the node split where the match ends inside its key (a hint: ...)")

The ``hint`` (how, in words) is not in the stub: ``python -m autograder lab06 --hint`` prints it, from
``autograder/hints.json``, which the generator writes next to the stubs. A region without ``what``
says its ``hint`` in the stub (older labs). The lab number comes from the file name
(``lab06_radix_cache.py`` -> ``Lab 06``). Docstrings, signatures, imports and helper code outside the
regions reach the student unchanged.

A student's work is never overwritten. ``labs/.generated.json`` records the SHA-256 of each lab
file as the generator last wrote it. A lab file that still has that hash is the generator's own and
is rewritten freely; one that differs (someone edited it) is kept, and the generator says so and
exits 1, unless ``--force``: then the edited file is first copied to ``labs/.backup/`` (ignored by
git).

The check compares what the generator makes with the *recorded* hashes, never with the lab files,
so a student's edits never fail it while a solution changed without regenerating does; where git
is available it also checks that each committed lab file is the stub the committed record names (a
lab edited by hand and committed). Without ``solutions/`` (the student edition) it checks that every
recorded lab is there.

    python -m autograder.generate           # rewrite labs/ from solutions/; edited labs are kept
    python -m autograder.generate --force   # back edited labs up to labs/.backup/, then rewrite them
    python -m autograder.generate --check   # exit 1 if labs/ is out of date with solutions/
"""

from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS_DIR = REPO / "solutions"
LABS_DIR = REPO / "labs"
MANIFEST = ".generated.json"  # in labs/: {"labs": {file name: sha256 of the stub last written}}
BACKUP_DIR = ".backup"  # in labs/: edited labs that --force replaced (git ignores it)

LAB_FILE = re.compile(r"^lab(\d\d)_[a-z0-9_]+\.py$")
_BEGIN = re.compile(r'^(?P<indent>[ \t]*)# BEGIN SOLUTION(?P<attrs>(?:\s+(?:what|hint)="[^"]*")*)\s*$')
_ATTR = re.compile(r'(what|hint)="([^"]*)"')
HINTS = REPO / "autograder" / "hints.json"  # {lab stem: [{"where", "what", "hint"}]}: --hint prints them
_END = re.compile(r"^[ \t]*# END SOLUTION\s*$")
DEFAULT_HINT = "implement this part; the docstring above says what it must do"
_ABOUT = "sha256 of each lab file as `python -m autograder.generate` last wrote it; never edit by hand"


class GenerateError(ValueError):
    pass


def lab_number(path: Path) -> str:
    m = LAB_FILE.match(path.name)
    if m is None:
        raise GenerateError(f"{path.name}: a lab file is named labNN_topic.py (e.g. lab06_radix_cache.py)")
    return m.group(1)


@dataclass(frozen=True)
class Region:
    line: int  # of the BEGIN marker in the solution
    what: str  # what is missing: the stub says it
    hint: str  # how, in words: --hint says it


def regions(source: str, name: str = "<solution>") -> list[Region]:
    """The solution regions of ``source``, in order; raises ``GenerateError`` on a malformed marker."""
    out = []
    for lineno, line in enumerate(source.splitlines(), start=1):
        begin = _BEGIN.match(line)
        if "BEGIN SOLUTION" in line and begin is None:
            raise GenerateError(f'{name}:{lineno}: malformed marker; write  # BEGIN SOLUTION what="..." hint="..."')
        if begin is not None:
            attrs = dict(_ATTR.findall(begin.group("attrs")))
            out.append(Region(lineno, attrs.get("what", ""), attrs.get("hint", "")))
    return out


def stub_message(lab: str, region: Region) -> str:
    if not region.what:
        return f"Lab {lab}: {region.hint or DEFAULT_HINT}"
    more = f" (a hint: python -m autograder lab{lab} --hint)" if region.hint else ""
    return f"Lab {lab}: {region.what}{more}"


def make_stub(source: str, lab: str, name: str = "<solution>") -> str:
    """The lab text for one solution text; raises ``GenerateError`` on unbalanced markers."""
    out: list[str] = []
    begin_line = 0
    found = {r.line: r for r in regions(source, name)}
    for lineno, line in enumerate(source.splitlines(keepends=True), start=1):
        begin = _BEGIN.match(line.rstrip("\r\n"))
        if begin is not None:
            if begin_line:
                raise GenerateError(f"{name}:{lineno}: BEGIN SOLUTION inside the region opened at line {begin_line}")
            begin_line = lineno
            message = stub_message(lab, found[lineno])
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


def _enclosing(source: str, line: int) -> str:
    """The qualified name of the function (or class) of ``source`` that holds ``line``."""
    best, depth = "module level", -1

    def visit(node, prefix: str, level: int) -> None:
        nonlocal best, depth
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if child.lineno <= line <= (child.end_lineno or child.lineno) and level > depth:
                    best, depth = name, level
                visit(child, f"{name}.", level + 1)

    visit(ast.parse(source), "", 0)
    return best


def expected_hints(solutions: Path = SOLUTIONS_DIR) -> dict[str, list[dict[str, str]]]:
    """``{lab stem: [{"where", "what", "hint"}, ...]}`` of the regions that have a hint behind a ``what``."""
    out: dict[str, list[dict[str, str]]] = {}
    for p in sorted(p for p in solutions.glob("lab*.py") if LAB_FILE.match(p.name)):
        source = p.read_text()
        rows = [
            {"where": _enclosing(source, r.line), "what": r.what, "hint": r.hint}
            for r in regions(source, f"solutions/{p.name}")
            if r.what and r.hint
        ]
        if rows:
            out[p.stem] = rows
    return out


def hints_text(solutions: Path = SOLUTIONS_DIR) -> str:
    return json.dumps(expected_hints(solutions), indent=1, ensure_ascii=False) + "\n"


def expected_labs(solutions: Path = SOLUTIONS_DIR) -> dict[str, str]:
    """``{file name: stub text}`` for every ``labNN_*.py`` in ``solutions``."""
    files = sorted(p for p in solutions.glob("lab*.py") if LAB_FILE.match(p.name))
    return {p.name: make_stub(p.read_text(), lab_number(p), f"solutions/{p.name}") for p in files}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def parse_manifest(text: str, where: str = f"labs/{MANIFEST}") -> dict[str, str]:
    try:
        labs = json.loads(text)["labs"]
        assert isinstance(labs, dict) and all(isinstance(v, str) for v in labs.values())
    except (ValueError, KeyError, TypeError, AssertionError):
        raise GenerateError(f"{where} is not a manifest the generator wrote") from None
    return labs


def read_manifest(labs: Path = LABS_DIR) -> dict[str, str]:
    """The recorded hashes; empty when there is no manifest yet."""
    path = labs / MANIFEST
    return parse_manifest(path.read_text()) if path.exists() else {}


def write_manifest(labs: Path, hashes: dict[str, str]) -> None:
    body = dict(about=_ABOUT, labs=dict(sorted(hashes.items())))
    (labs / MANIFEST).write_text(json.dumps(body, indent=1) + "\n")


def _git(repo: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def committed_differences(labs: Path = LABS_DIR) -> list[str]:
    """Lab files whose committed text (git ``HEAD``) is not the stub the committed manifest records:
    edited by hand and committed. Empty without git or without a committed manifest."""
    top = _git(labs, "rev-parse", "--show-toplevel")
    if top is None:
        return []
    rel = labs.resolve().relative_to(Path(top.strip()).resolve()).as_posix()
    manifest = _git(labs, "show", f"HEAD:{rel}/{MANIFEST}")
    if manifest is None:
        return []
    problems = []
    for name, recorded in parse_manifest(manifest, f"{rel}/{MANIFEST} at HEAD").items():
        text = _git(labs, "show", f"HEAD:{rel}/{name}")
        if text is not None and digest(text) != recorded:
            problems.append(
                f"labs/{name} as committed (HEAD) is not the stub labs/{MANIFEST} records: "
                "it was edited by hand; regenerate it from solutions/"
            )
    return problems


def edited_labs(labs: Path = LABS_DIR) -> list[str]:
    """Recorded lab files whose text differs from what the generator last wrote (a student's work)."""
    recorded = read_manifest(labs)
    return [n for n, h in sorted(recorded.items()) if (labs / n).exists() and digest((labs / n).read_text()) != h]


def differences(solutions: Path = SOLUTIONS_DIR, labs: Path = LABS_DIR) -> list[str]:
    """Why ``labs/`` is not what the generator last made from ``solutions/`` (empty: up to date).
    Never looks at the lab files' own text, which may hold a student's work."""
    recorded = read_manifest(labs)
    if not solutions.is_dir():  # the student edition: the manifest came with the stubs
        if not recorded:
            return [f"labs/{MANIFEST} is missing: the labs were not made by the generator"]
        return [f"labs/{n} is missing (recorded in labs/{MANIFEST})" for n in recorded if not (labs / n).exists()]
    want = expected_labs(solutions)
    problems = []
    for name, text in want.items():
        if name not in recorded:
            problems.append(f"labs/{name} was never generated")
        elif recorded[name] != digest(text):
            problems.append(f"solutions/{name} changed since labs/{name} was generated")
        elif not (labs / name).exists():
            problems.append(f"labs/{name} is missing")
    problems += [f"labs/{MANIFEST} records {n}, which has no solution" for n in sorted(set(recorded) - set(want))]
    if labs.resolve() == LABS_DIR.resolve() and (not HINTS.exists() or HINTS.read_text() != hints_text(solutions)):
        problems.append(f"{HINTS.relative_to(REPO)} is not the hints of solutions/")
    return problems + committed_differences(labs)


@dataclass
class Outcome:
    wrote: list[str] = field(default_factory=list)  # (re)written from solutions/
    unchanged: list[str] = field(default_factory=list)  # already the generated stub: left alone
    kept: list[str] = field(default_factory=list)  # edited since generated, no --force: left alone
    backups: dict[str, Path] = field(default_factory=dict)  # --force: edited lab -> its copy
    strays: list[str] = field(default_factory=list)  # lab files with no solution: left alone


def backup(path: Path) -> Path:
    """Copy ``labs/NAME.py`` to ``labs/.backup/NAME.<local time>.py`` (a fresh name)."""
    folder = path.parent / BACKUP_DIR
    folder.mkdir(exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y-%m-%dT%H-%M-%S")
    target, n = folder / f"{path.stem}.{stamp}.py", 1
    while target.exists():
        n += 1
        target = folder / f"{path.stem}.{stamp}-{n}.py"
    shutil.copy2(path, target)
    return target


def write_labs(solutions: Path = SOLUTIONS_DIR, labs: Path = LABS_DIR, force: bool = False) -> Outcome:
    """Write every stub whose file is missing or still the generator's own; with ``force`` back up
    and replace edited ones too. The manifest records exactly what is on disk as generated."""
    want = expected_labs(solutions)
    labs.mkdir(parents=True, exist_ok=True)
    recorded = read_manifest(labs)
    out = Outcome()
    hashes = {}
    for name, text in want.items():
        target = labs / name
        current = target.read_text() if target.exists() else None
        if current == text:
            out.unchanged.append(name)
        elif current is not None and digest(current) != recorded.get(name) and not force:
            out.kept.append(name)
            if name in recorded:
                hashes[name] = recorded[name]  # the stub it was generated from: still the last generated
            continue
        else:
            if current is not None and digest(current) != recorded.get(name):
                out.backups[name] = backup(target)
            target.write_text(text)
            out.wrote.append(name)
        hashes[name] = digest(text)
    out.strays = sorted(p.name for p in labs.glob("lab*.py") if LAB_FILE.match(p.name) and p.name not in want)
    write_manifest(labs, hashes)
    if labs.resolve() == LABS_DIR.resolve():
        HINTS.write_text(hints_text(solutions))
    return out


def describe(out: Outcome) -> list[str]:
    lines = [
        f"labs/{n}: written" + (f" (your version is in {out.backups[n]})" if n in out.backups else "")
        for n in out.wrote
    ]
    lines += [f"labs/{n}: left alone (already the generated stub)" for n in out.unchanged]
    lines += [
        f"labs/{n}: kept, NOT regenerated: it differs from the stub the generator last wrote (someone's work?). "
        "Run `python -m autograder.generate --force` to save a copy in labs/.backup/ and regenerate it"
        for n in out.kept
    ]
    lines += [f"labs/{n}: left alone (no solutions/{n})" for n in out.strays]
    lines.append(
        f"labs/: {len(out.wrote)} written, {len(out.unchanged) + len(out.strays)} left alone, {len(out.kept)} kept"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autograder.generate", description=__doc__.split("\n\n")[0])
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="only compare; exit 1 if labs/ is out of date")
    group.add_argument("--force", action="store_true", help="also replace edited labs (after a copy in labs/.backup/)")
    args = ap.parse_args(argv)
    try:
        if args.check:
            problems = differences()
            for name in edited_labs():
                print(f"labs/{name}: edited since it was generated (the check ignores edits)")
            for p in problems:
                print(p)
            if problems and SOLUTIONS_DIR.is_dir():
                print("run `python -m autograder.generate` to regenerate labs/ from solutions/")
            return 1 if problems else 0
        if not SOLUTIONS_DIR.is_dir():
            print("error: no solutions/ folder here (the student edition): labs/ is yours, nothing to generate")
            return 2
        out = write_labs(force=args.force)
    except GenerateError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(describe(out)))
    return 1 if out.kept else 0


if __name__ == "__main__":
    sys.exit(main())
