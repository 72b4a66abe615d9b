"""Lab 01 adapter: the five functions of ``lab01_decoder.py``, and the swap-in that runs the real
engine with them through its public seams: ``rms_norm``, ``rope_inv_freq`` + ``apply_rotary`` and
``silu_and_mul`` are registered as the ``"lab01"`` norm, rotary and activation (``minisgl.layers``),
and ``gqa_attention`` is called once per request by ``DenseLabBackend``, an attention backend
registered as ``"lab01"``. Tests run in forked processes, but every registration is undone on exit
so a direct ``pytest`` run stays clean."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from autograder.checks import describe
from autograder.impl import require
from minisgl.attention import BACKENDS
from minisgl.attention.base import AttentionBackend
from minisgl.core import Batch
from minisgl.layers import ACTIVATIONS, NORMS, ROTARIES, RotaryImpl

STEM = "lab01_decoder"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return require(STEM, "rms_norm")(x, weight, eps)


def rope_inv_freq(head_dim: int, base: float, scaling=None) -> torch.Tensor:
    return require(STEM, "rope_inv_freq")(head_dim, base, scaling)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return require(STEM, "apply_rotary")(x, cos, sin)


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return require(STEM, "gqa_attention")(q, k, v, scale)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return require(STEM, "silu_and_mul")(x)


# ---- the real engine with these functions ------------------------------------------------------
class DenseLabBackend(AttentionBackend):
    """Gathers each request's K/V from the pool (positions ``[0, end)``) into dense tensors and
    calls a dense attention function per request; slow, and simple enough to trust."""

    name = "lab01"

    def __init__(self, pool, table, num_heads: int, head_dim: int, attention: Callable):
        super().__init__(pool, table, num_heads, head_dim)
        self.attention = attention

    def prepare_metadata(self, batch: Batch) -> None:
        batch.attn_metadata = [
            (self.page_table[req.table_idx, :end].to(torch.int64), end - start)
            for req, start, end in zip(batch.reqs, batch.starts, batch.ends)
        ]

    def forward(self, q, k, v, layer_id: int, batch: Batch) -> torch.Tensor:
        self.pool.store(layer_id, batch.out_loc, k, v)
        keys, values = self.pool.k_slots(layer_id), self.pool.v_slots(layer_id)
        outs, offset = [], 0
        for slots, n in batch.attn_metadata:
            q_i = q[offset : offset + n]
            out = self.attention(q_i, keys[slots], values[slots], self.scale)
            if not isinstance(out, torch.Tensor) or out.shape != q_i.shape:
                got = describe(out) if isinstance(out, torch.Tensor) else type(out).__name__
                raise AssertionError(
                    f"inside the engine, gqa_attention(q {describe(q_i)}, k {describe(keys[slots])}, ...) "
                    f"returned {got}; expected {describe(q_i)}"
                )
            outs.append(out)
            offset += n
        return torch.cat(outs).reshape(q.shape[0], -1)


def _counted(fn: Callable, name: str, counts: Counter) -> Callable:
    def wrapper(*args, **kwargs):
        counts[name] += 1
        return fn(*args, **kwargs)

    return wrapper


# what the engine is built with to run this lab's functions (registered by lab01_components)
ENGINE_ARGS = dict(attention_backend="lab01", components=dict(norm="lab01", rotary="lab01", activation="lab01"))


@contextmanager
def lab01_components() -> Iterator[Counter]:
    """Register this lab's functions in the engine's registries under ``"lab01"`` (the norm,
    rotary and activation seams of ``minisgl.layers``, and ``DenseLabBackend`` as an attention
    backend calling ``gqa_attention``); yields how often the engine called each. Build the engine
    with ``**ENGINE_ARGS`` inside the block."""
    counts: Counter = Counter()
    attention = _counted(gqa_attention, "gqa_attention", counts)
    rotary = RotaryImpl(
        _counted(rope_inv_freq, "rope_inv_freq", counts), _counted(apply_rotary, "apply_rotary", counts)
    )
    with (
        NORMS.registered("lab01", _counted(rms_norm, "rms_norm", counts)),
        ROTARIES.registered("lab01", rotary),
        ACTIVATIONS.registered("lab01", _counted(silu_and_mul, "silu_and_mul", counts)),
        BACKENDS.registered(
            "lab01", lambda pool, table, heads, dim: DenseLabBackend(pool, table, heads, dim, attention)
        ),
    ):
        yield counts
