"""Lab 02 adapter: the four functions and the ``LabSampler`` class of ``lab02_sampler.py``, and the
swap-in that lets the real engine sample with it: the class registered in
``minisgl.engine.sample.SAMPLERS`` as ``"lab02"`` (selected by ``components={"sampler": "lab02"}``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from autograder.impl import require
from minisgl.engine.sample import SAMPLERS, Sampler, SamplingInfo

STEM = "lab02_sampler"


def scale_logits(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    return require(STEM, "scale_logits")(logits, temperatures)


def top_k_filter(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    return require(STEM, "top_k_filter")(logits, top_k)


def top_p_filter(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    return require(STEM, "top_p_filter")(logits, top_p)


def draw(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return require(STEM, "draw")(logits, u)


def sampler_class() -> type[Sampler]:
    cls = require(STEM, "LabSampler")
    if not (isinstance(cls, type) and issubclass(cls, Sampler)):
        raise TypeError("LabSampler must be a class derived from minisgl.engine.sample.Sampler")
    return cls


def sample(logits: torch.Tensor, info: SamplingInfo) -> torch.Tensor:
    """One call of a fresh ``LabSampler`` (the engine builds it once, with no arguments)."""
    return sampler_class()().sample(logits, info)


@contextmanager
def registered_sampler(cls: type[Sampler], name: str = "lab02") -> Iterator[dict]:
    """``cls`` as the engine's sampler ``name`` inside the block; yields the ``components`` argument
    of ``LLM(...)`` that selects it."""
    with SAMPLERS.registered(name, cls):
        yield {"sampler": name}
