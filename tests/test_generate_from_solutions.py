"""The generator and its check with solutions/ (instructor-only): every solution region becomes a
stub, a student's edited lab is never overwritten or blamed, and the check still fails when a
solution changes without regenerating, or when a hand-edited lab is committed.

The scenarios run the real commands (``python -m autograder.generate``, the test suite's check) in
a throw-away git repository holding a copy of this one's tracked files.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.generate import LABS_DIR, MANIFEST, SOLUTIONS_DIR, expected_labs
from autograder.release import tracked_files

pytestmark = pytest.mark.instructor

REPO = Path(__file__).resolve().parent.parent
STUDENT_WORK = "\n\n# my work: a helper I wrote for this lab\ndef helper():\n    return 42\n"


def test_every_region_becomes_a_stub_with_a_hint():
    for name, text in expected_labs().items():
        lab = re.match(r"lab(\d\d)_", name).group(1)
        solution = (SOLUTIONS_DIR / name).read_text()
        regions = solution.count("# BEGIN SOLUTION")
        stubs = re.findall(r'raise NotImplementedError\("Lab (\d\d): ([^"]+)"\)', text)
        assert regions > 0, f"solutions/{name} has no # BEGIN SOLUTION region: the lab would be complete already"
        assert len(stubs) == regions, f"labs/{name}: {len(stubs)} stubs for {regions} solution regions"
        assert {n for n, _ in stubs} == {lab}, f"labs/{name}: stubs must say 'Lab {lab}:', got {stubs}"
        assert "SOLUTION" not in text, f"labs/{name} still contains a solution marker"
        doc = ast.get_docstring(ast.parse(text))
        assert doc and f"python -m autograder lab{lab}" in doc, (
            f"labs/{name} must start with a docstring stating the contract and the grading command"
        )


def test_labs_folder_is_committed_next_to_solutions():
    assert sorted(p.name for p in LABS_DIR.glob("lab*.py")) == sorted(expected_labs())


# ---- in a copy of the repository -------------------------------------------------------------------
def _git(root: Path, *args: str) -> None:
    ident = ["-c", "user.name=course", "-c", "user.email=course@example.com", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", *ident, *args], cwd=root, check=True, capture_output=True)


def run(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, *args]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    for rel in tracked_files(REPO):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, root / rel)
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "copy")
    return root


def test_student_edits_survive_the_check_and_the_generator(repo):
    lab = repo / "labs" / "lab01_decoder.py"
    stub = lab.read_text()
    mine = "half = x.shape[-1] // 2\n    return torch.nn.functional.silu(x[..., :half]) * x[..., half:]"
    edited = re.sub(r'raise NotImplementedError\("Lab 01: SwiGLU[^\n]*', mine, stub)
    assert edited != stub
    lab.write_text(edited + STUDENT_WORK)
    check = run(repo, "-m", "pytest", "tests/test_labs_generated.py::test_labs_are_generated_from_solutions", "-q")
    assert check.returncode == 0, f"a student's edit must not fail the generation check:\n{check.stdout[-3000:]}"

    gen = run(repo, "-m", "autograder.generate")
    assert gen.returncode == 1, f"generate must refuse to overwrite an edited lab (exit 1)\n{gen.stdout}{gen.stderr}"
    assert "labs/lab01_decoder.py: kept" in gen.stdout and "--force" in gen.stdout, gen.stdout
    assert "labs/lab06_radix_cache.py: left alone" in gen.stdout, gen.stdout
    assert lab.read_text() == edited + STUDENT_WORK, "the edited lab was changed by generate without --force"
    assert not (repo / "labs" / ".backup").exists()

    forced = run(repo, "-m", "autograder.generate", "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    backups = list((repo / "labs" / ".backup").glob("lab01_decoder.*.py"))
    assert len(backups) == 1 and backups[0].read_text() == edited + STUDENT_WORK, backups
    assert re.fullmatch(r"lab01_decoder\.\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d\.py", backups[0].name), backups[0].name
    assert str(backups[0].relative_to(repo)) in forced.stdout, f"--force must say where the copy is:\n{forced.stdout}"
    assert lab.read_text() == stub, "--force must regenerate the lab"
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    assert status == "", f"after --force only ignored files may be new (labs/.backup/ is ignored): {status!r}"


def test_check_fails_when_a_solution_changes_without_regenerating(repo):
    solution = repo / "solutions" / "lab06_radix_cache.py"
    solution.write_text(solution.read_text().replace('what="eviction of unlocked', 'what="evict unlocked', 1))
    check = run(repo, "-m", "autograder.generate", "--check")
    assert check.returncode == 1, check.stdout
    assert "solutions/lab06_radix_cache.py changed since labs/lab06_radix_cache.py was generated" in check.stdout
    gen = run(repo, "-m", "autograder.generate")
    assert gen.returncode == 0 and "labs/lab06_radix_cache.py: written" in gen.stdout, gen.stdout + gen.stderr
    assert 'NotImplementedError("Lab 06: evict unlocked leaves' in (repo / "labs" / "lab06_radix_cache.py").read_text()
    assert run(repo, "-m", "autograder.generate", "--check").returncode == 0


def test_check_fails_on_a_hand_edited_committed_lab(repo):
    lab = repo / "labs" / "lab06_radix_cache.py"
    lab.write_text(lab.read_text() + STUDENT_WORK)
    assert run(repo, "-m", "autograder.generate", "--check").returncode == 0, "an uncommitted edit is someone's work"
    _git(repo, "commit", "-qam", "edit a stub by hand")
    check = run(repo, "-m", "autograder.generate", "--check")
    assert check.returncode == 1 and "labs/lab06_radix_cache.py as committed (HEAD)" in check.stdout, check.stdout
    (repo / "labs" / MANIFEST).unlink()
    check = run(repo, "-m", "autograder.generate", "--check")
    assert check.returncode == 1 and "was never generated" in check.stdout, check.stdout
