"""``python -m autograder.release DIR``: write the student edition of the repository into ``DIR``.

The student edition is the tracked files (``git ls-files``, as they are in the working tree) minus
what only instructors may see, with the docs scrubbed and the labs freshly generated:

* left out: ``solutions/``, ``tests/mutants/``, ``autograder/hidden/`` (the hidden tests), the
  instructor tools (this file, ``autograder/gradescope/``, ``autograder/timings.py``), and every test file that declares
  ``pytestmark = pytest.mark.instructor`` (it needs solutions or mutants);
* ``labs/`` is written by the generator (stubs and their ``.generated.json``), never copied, so an
  instructor's filled-in lab files cannot leak;
* Markdown files and notebook cells lose their ``<!-- instructor-only -->`` ...
  ``<!-- /instructor-only -->`` regions, then any line that still mentions ``--impl solutions``.

Before it reports success the build checks its own output: no left-out path, no ``--impl
solutions``, no line of a solution region (other than lines the engine itself contains: students
have the engine), and no hidden test's name. Its test suite and notebooks run there as they do here
(``tests/test_release.py`` runs them).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from autograder import generate

REPO = Path(__file__).resolve().parent.parent
LEFT_OUT = (
    "solutions/",
    "tests/mutants/",
    "autograder/hidden/",
    "autograder/release.py",
    "autograder/timings.py",
    "autograder/gradescope/",
)
INSTRUCTOR_MARK = re.compile(r"^pytestmark\s*=.*\bpytest\.mark\.instructor\b", re.M)
OPEN, CLOSE = "<!-- instructor-only -->", "<!-- /instructor-only -->"  # each alone on its line
FORBIDDEN = "--impl solutions"
FINGERPRINT_MIN = 30  # shorter solution lines are too generic to call a leak
_HIDDEN_TEST = re.compile(r"^def (test_\w+)\(", re.M)


class ReleaseError(Exception):
    pass


def tracked_files(repo: Path = REPO) -> list[str]:
    try:
        proc = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise ReleaseError(f"git is needed to list the tracked files: {e}") from e
    if proc.returncode != 0:
        raise ReleaseError(f"{repo} is not a git checkout: {proc.stderr.strip()}")
    return sorted(p for p in proc.stdout.split("\0") if p and (repo / p).is_file())


def instructor_only(rel: str, text: str | None) -> bool:
    if rel.startswith(LEFT_OUT):
        return True
    return rel.startswith("tests/") and rel.endswith(".py") and text is not None and bool(INSTRUCTOR_MARK.search(text))


def scrub_markdown(text: str, where: str = "") -> str:
    """Drop instructor-only regions (from an ``OPEN`` line to a ``CLOSE`` line, with one blank line
    after them when one is before), then every line that still mentions ``--impl solutions``."""
    out: list[str] = []
    inside, skip_blank = False, False
    for line in text.splitlines(keepends=True):
        marker = line.strip()
        if marker in (OPEN, CLOSE):
            if (marker == OPEN) == inside:
                raise ReleaseError(f"{where}: {marker} without its {'closing' if inside else 'opening'} line")
            inside = marker == OPEN
            skip_blank = not inside and (not out or not out[-1].strip())
        elif not inside and not (skip_blank and not line.strip()) and FORBIDDEN not in line:
            out.append(line)
            skip_blank = False
        else:
            skip_blank = False
    if inside:
        raise ReleaseError(f"{where}: {OPEN} is never closed by {CLOSE}")
    return "".join(out)


def scrub_notebook(text: str, where: str = "") -> str:
    nb = json.loads(text)
    changed = False
    for cell in nb["cells"]:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        clean = scrub_markdown(source, where) if cell["cell_type"] == "markdown" else source
        clean = "".join(line for line in clean.splitlines(keepends=True) if FORBIDDEN not in line)
        if clean != source:
            cell["source"], changed = clean.splitlines(keepends=True), True
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n" if changed else text


def scrub(rel: str, text: str) -> str:
    if rel.endswith(".ipynb"):
        return scrub_notebook(text, rel)
    if rel == "autograder/timings.json":
        return scrub_timings(text)
    return scrub_markdown(text, rel) if rel.endswith(".md") else text


def scrub_timings(text: str, repo: Path = REPO) -> str:
    """The reference solution's recorded times (``pace.reference_times``) minus the hidden tests'."""
    hidden = {name.removeprefix("test_") for name in hidden_test_names(repo)}
    data = json.loads(text)
    data["tests"] = {k: v for k, v in data["tests"].items() if k.split(": ", 1)[1].split("[")[0] not in hidden}
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except UnicodeDecodeError:
        return None  # a binary file: copied as is


def solution_fingerprints(repo: Path = REPO) -> set[str]:
    """Lines (stripped, >= FINGERPRINT_MIN chars) inside the solution regions that the engine
    (``minisgl/``) does not contain: finding one in the student edition is a leak."""
    engine = "\n".join(p.read_text() for p in sorted((repo / "minisgl").rglob("*.py")))
    out = set()
    for path in sorted((repo / "solutions").glob("lab*.py")):
        inside = False
        for line in path.read_text().splitlines():
            if "# BEGIN SOLUTION" in line or "# END SOLUTION" in line:
                inside = "BEGIN" in line
            elif inside and len(line.strip()) >= FINGERPRINT_MIN and line.strip() not in engine:
                out.add(line.strip())
    return out


def hidden_test_names(repo: Path = REPO) -> set[str]:
    return {n for p in (repo / "autograder" / "hidden").glob("test_*.py") for n in _HIDDEN_TEST.findall(p.read_text())}


def check_release(dest: Path, repo: Path = REPO) -> list[str]:
    """Why ``dest`` is not a clean student edition (empty: clean)."""
    fingerprints, hidden = solution_fingerprints(repo), hidden_test_names(repo)
    problems = []
    for path in sorted(p for p in dest.rglob("*") if p.is_file()):
        rel = path.relative_to(dest).as_posix()
        if rel.startswith(LEFT_OUT):
            problems.append(f"{rel}: instructor-only, must be left out")
        text = _read(path)
        if text is None:
            continue
        if FORBIDDEN in text:
            problems.append(f"{rel}: mentions {FORBIDDEN!r}")
        if any(line.strip() in (OPEN, CLOSE) for line in text.splitlines()):
            problems.append(f"{rel}: an instructor-only marker is left")
        problems += [f"{rel}: contains the solution line {line!r}" for line in sorted(fingerprints) if line in text]
        problems += [f"{rel}: names the hidden test {name}" for name in sorted(hidden) if name in text]
    return problems


def build(dest: Path, repo: Path = REPO) -> dict[str, list[str]]:
    """Write the student edition into ``dest`` (absent or empty); return what was left out and
    what was scrubbed. Raises ``ReleaseError`` when the result would leak."""
    if dest.exists() and any(dest.iterdir()):
        raise ReleaseError(f"{dest} is not empty: the student edition goes into a new folder")
    if dest.resolve().is_relative_to(repo.resolve()):
        raise ReleaseError(f"{dest} is inside the repository; choose a folder outside it")
    left_out, scrubbed = [], []
    for rel in tracked_files(repo):
        src, out = repo / rel, dest / rel
        text = _read(src)
        if instructor_only(rel, text):
            left_out.append(rel)
            continue
        if rel.startswith("labs/") and (generate.LAB_FILE.match(src.name) or src.name == generate.MANIFEST):
            continue  # generated below
        out.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            shutil.copy2(src, out)
            continue
        clean = scrub(rel, text)
        if clean != text:
            scrubbed.append(rel)
        out.write_text(clean)
        shutil.copymode(src, out)  # .ci/run stays executable
    written = generate.write_labs(repo / "solutions", dest / "labs")
    problems = check_release(dest, repo)
    if problems:
        raise ReleaseError("the student edition would leak instructor material:\n  " + "\n  ".join(problems))
    return dict(left_out=left_out, scrubbed=scrubbed, labs=written.wrote)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autograder.release", description=__doc__.split("\n\n")[0])
    ap.add_argument("dest", type=Path, help="a new (or empty) folder for the student edition")
    args = ap.parse_args(argv)
    try:
        report = build(args.dest)
    except (ReleaseError, generate.GenerateError) as e:
        print(f"release: {e}", file=sys.stderr)
        return 2
    print(f"student edition written to {args.dest}")
    print(f"  labs/ generated from solutions/: {', '.join(report['labs'])}")
    print(f"  left out ({len(report['left_out'])} files): {', '.join(report['left_out'])}")
    print(f"  scrubbed of instructor-only text: {', '.join(report['scrubbed']) or 'nothing'}")
    print(f"next: cd {args.dest} && git init && git add -A && git commit -m 'Student edition'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
