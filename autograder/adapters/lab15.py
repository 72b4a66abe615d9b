"""Lab 15 adapter: the functions and the ``LabVerifier`` class of ``lab15_verifier.py`` (the class used
only through the ``Verifier`` interface of ``minisgl/speculative/base.py``), and the swap-in: the class
registered in ``minisgl.speculative.VERIFIERS`` as ``"lab15"`` (``LLM(components={"verifier": "lab15"})``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from autograder.impl import require
from minisgl.engine.sample import Sampler, SamplingInfo
from minisgl.speculative.base import VERIFIERS, Rollback, Verdict, Verifier

STEM = "lab15_verifier"


def per_position(info: SamplingInfo, k1: int) -> SamplingInfo:
    return require(STEM, "per_position")(info, k1)


def leading_accepted(accept: torch.Tensor) -> torch.Tensor:
    return require(STEM, "leading_accepted")(accept)


def draw_without(probs: torch.Tensor, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return require(STEM, "draw_without")(probs, x, u)


def verifier_class() -> type[Verifier]:
    cls = require(STEM, "LabVerifier")
    if not (isinstance(cls, type) and issubclass(cls, Verifier)):
        raise TypeError("LabVerifier must be a class derived from minisgl.speculative.base.Verifier")
    return cls


def verify(logits: torch.Tensor, drafts: torch.Tensor, info: SamplingInfo, sampler: Sampler) -> Verdict:
    """One call of a fresh ``LabVerifier`` (the engine builds it once, with no arguments)."""
    return verifier_class()().verify(logits, drafts, info, sampler)


def rollback(n: int, drafted: int, accepted: int) -> Rollback:
    return verifier_class()().rollback(n, drafted, accepted)


@contextmanager
def registered_verifier(cls: type[Verifier], name: str = "lab15") -> Iterator[dict]:
    """``cls`` as the engine's verifier ``name`` inside the block; yields the ``components`` argument of
    ``LLM(...)`` that selects it."""
    with VERIFIERS.registered(name, cls):
        yield {"verifier": name}
