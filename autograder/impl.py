"""Where the graded lab files live and how a lab module is loaded from there.

The folder comes from ``$MINISGL_LAB_IMPL`` (set by the pytest plugin from ``--impl``); default
``labs/``. A lab module is imported from its file path under a private name, so two graded folders
(a student's ``labs/`` and a reference copy) never shadow each other.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
ENV = "MINISGL_LAB_IMPL"
_loaded: dict[Path, ModuleType] = {}
_original: set[tuple[Path, str, int]] = set()  # (lab file, attr, id of the object) that passed check_object


def resolve_folder(name: str | os.PathLike | None) -> Path:
    """``labs`` or any path; relative names are tried from the current directory, then from the
    repository root."""
    path = Path(name or "labs").expanduser()
    if not path.is_absolute() and not path.exists() and (REPO / path).exists():
        path = REPO / path
    return path.resolve()


def impl_folder() -> Path:
    return resolve_folder(os.environ.get(ENV))


def lab_file(stem: str) -> Path:
    return impl_folder() / f"{stem}.py"


def load(stem: str) -> ModuleType:
    """Import ``<impl folder>/<stem>.py`` (once per process). While grading, this process's guards
    (``originality.install``) go in first: a spawned tensor-parallel rank or a server process loads the
    lab file here too."""
    path = lab_file(stem)
    if path in _loaded:
        return _loaded[path]
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: the graded folder must contain {stem}.py")
    from autograder import originality

    if os.environ.get(originality.GUARD_ENV):  # grading: the references refuse lab code in every process
        originality.install(stem, path.parent)
    name = f"_graded_{abs(hash(str(path.parent)))}_{stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    _loaded[path] = module
    return module


def require(stem: str, attr: str):
    """``load(stem).attr``, with a message naming the file when the student renamed or removed it;
    refused (``originality.EngineReference``) when it is the engine's own implementation."""
    from autograder.originality import check_object

    module = load(stem)
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise AttributeError(
            f"{lab_file(stem).name} has no {attr!r}: keep the names and signatures of the lab file "
            "(the grader calls them)"
        ) from None
    key = (lab_file(stem), attr, id(obj))
    if key not in _original:  # adapters call require() at every call of a lab function: check once
        check_object(stem, attr, obj, key[0])  # never the engine's own implementation
        _original.add(key)
    return obj
