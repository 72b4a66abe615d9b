"""Lab 05 adapter: the ``CacheAwareAdmission`` class of ``lab05_admission.py``, used only through the
``AdmissionPolicy`` interface (``reserved_len``, ``admit``), and the swap-in that lets the real engine run
on it: the class registered in ``minisgl.scheduler.ADMISSION_POLICIES`` as ``"lab05"``
(``LLM(components={"admission": "lab05"})``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from autograder.impl import require
from minisgl.scheduler.admission import ADMISSION_POLICIES, AdmissionPolicy

STEM = "lab05_admission"


def policy_class() -> type[AdmissionPolicy]:
    cls = require(STEM, "CacheAwareAdmission")
    if not (isinstance(cls, type) and issubclass(cls, AdmissionPolicy)):
        raise TypeError("CacheAwareAdmission must be a class derived from minisgl.scheduler.admission.AdmissionPolicy")
    return cls


def make_policy() -> AdmissionPolicy:
    return policy_class()()


@contextmanager
def registered_policy(cls: type[AdmissionPolicy], name: str = "lab05") -> Iterator[str]:
    """``cls`` as the engine's ``components={"admission": name}`` inside the block; yields the name."""
    with ADMISSION_POLICIES.registered(name, cls):
        yield name
