"""The student edition (``python -m autograder.release DIR``), built into a temporary folder: nothing
instructor-only is in it, and its own test command passes there.

The release's README test command is ``python -m pytest`` after the pip install; the package is
installed here already, so it runs with the release as root and ``PYTHONPATH`` pointing at it. The
whole suite would double CI time, so it runs with ``-x`` on the files whose behaviour depends on
what the release removes or rewrites, which is enough:

* ``tests/test_grading.py``: the autograder as shipped grades the stubs to 0 with the hidden tests
  absent (90 visible points a lab, and it says that 10 more are hidden);
* ``tests/test_labs_generated.py``: the generation check without solutions/ (on a lab edited first,
  as a student would);
* one lesson notebook, as scrubbed (a scrubbed line that a cell needed would break it).

Every other file is copied byte for byte from this repository, where its tests run already; that
the right test files are there is checked on the file list.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from grading import run
from mutants import all_mutants
from mutants.hidden import HIDDEN_MUTANTS

from autograder import generate, release

pytestmark = pytest.mark.instructor

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "lessons").glob("*.ipynb"), key=lambda p: (not p.name.startswith("06_"), p.name))
STUDENT_WORK = "\n\n# my work\ndef helper():\n    return 42\n"


@pytest.fixture(scope="module")
def student_edition(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("release") / "course"
    out = subprocess.run(
        [sys.executable, "-m", "autograder.release", str(dest)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, f"the release build failed:\n{out.stdout}\n{out.stderr}"
    assert "left out" in out.stdout and "solutions/lab01_decoder.py" in out.stdout, out.stdout
    return dest


def _files(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text(errors="replace") for p in root.rglob("*") if p.is_file()}


def test_nothing_instructor_only_is_shipped(student_edition):
    files = _files(student_edition)
    for prefix in ("solutions/", "tests/mutants/", "autograder/hidden/", "autograder/gradescope/"):
        assert not [f for f in files if f.startswith(prefix)], f"{prefix} must be left out"
    fingerprints = release.solution_fingerprints()
    assert len(fingerprints) > 20, f"too few solution lines to look for: {fingerprints}"
    hidden = {
        node.name
        for path in (REPO / "autograder" / "hidden").glob("test_*.py")
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }
    mutants = {m.name for m in all_mutants() + HIDDEN_MUTANTS}
    assert len(hidden) >= 6 and mutants, (hidden, mutants)
    for rel, text in files.items():
        assert "--impl solutions" not in text, f"{rel} still mentions --impl solutions"
        assert "Mutant(" not in text and not [m for m in mutants if m in text], f"{rel} mentions a mutant"
        assert not [n for n in hidden if n in text], f"{rel} names a hidden test"
        leaked = [line for line in fingerprints if line in text]
        assert not leaked, f"{rel} contains solution text: {leaked[:3]}"
    assert "<!-- instructor-only -->" not in files["README.md"] and "## Labs and grading" in files["README.md"]


def test_labs_are_the_stubs_and_tests_the_student_ones(student_edition):
    stubs = generate.expected_labs()
    for name, text in stubs.items():
        assert (student_edition / "labs" / name).read_text() == text, f"labs/{name} is not the generated stub"
    assert generate.read_manifest(student_edition / "labs") == {n: generate.digest(t) for n, t in stubs.items()}
    shipped = {p.name for p in (student_edition / "tests").glob("test_*.py")}
    for path in (REPO / "tests").glob("test_*.py"):
        instructor = bool(release.INSTRUCTOR_MARK.search(path.read_text()))
        assert (path.name in shipped) != instructor, (
            f"{path.name}: instructor-only {instructor}, shipped {not instructor}"
        )
    assert {"test_autograder.py", "test_release.py"}.isdisjoint(shipped)


def test_its_test_command_passes_there(student_edition):
    lab = student_edition / "labs" / "lab01_decoder.py"
    lab.write_text(lab.read_text() + STUDENT_WORK)  # as a student would, before running the tests
    env = {**os.environ, "PYTHONPATH": str(student_edition), "OMP_NUM_THREADS": "1"}
    gen = run([sys.executable, "-m", "autograder.generate"], env, cwd=student_edition)
    assert gen.returncode == 2 and "student edition" in gen.stdout, gen.explain()
    assert lab.read_text().endswith(STUDENT_WORK), "generate must not touch labs/ in the student edition"
    # the README's test command, after its install steps (the last `&&`): python -m pytest
    readme = (student_edition / "README.md").read_text()
    command = re.search(r"<!-- test-command -->\n```bash\n(.*?)\n```", readme, re.S).group(1).split("&&")[-1].split()
    assert command[:3] == ["python", "-m", "pytest"], f"the student edition's README test command: {command}"
    notebook = f"tests/test_notebooks.py::test_notebook_runs[{NOTEBOOKS[0].stem}]"
    cmd = [sys.executable, *command[1:], "-x", "-q", "-p", "no:cacheprovider"]
    # test_grading's edition-specific tests (90 visible points, "+10 hidden"); its pace tests are the same code
    cmd += ["tests/test_labs_generated.py", "tests/test_grading.py", notebook]
    cmd += ["-k", "not pace and not starved and not each_lab_line"]  # those three are the same code here
    out = run(cmd, env, cwd=student_edition)
    assert out.returncode == 0, f"the student edition's tests fail there:\n{out.explain()}"
    assert " passed" in out.stdout and "skipped" not in out.stdout, out.stdout[-2000:]


def test_scrub_drops_instructor_regions_and_impl_solutions_lines():
    text = (
        "a\n\n<!-- instructor-only -->\ngrade with --impl solutions\n<!-- /instructor-only -->\n\n"
        "b mentions `<!-- /instructor-only -->` inline\nrun --impl solutions here\nc\n"
    )
    assert release.scrub_markdown(text) == "a\n\nb mentions `<!-- /instructor-only -->` inline\nc\n"
    for broken in ("<!-- instructor-only -->\nx\n", "x\n<!-- /instructor-only -->\n"):
        with pytest.raises(release.ReleaseError):
            release.scrub_markdown(broken, "README.md")
