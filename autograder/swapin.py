"""Running the real engine with a student's component swapped in.

Lab 01: the student's ``rms_norm``, ``rope_inv_freq``, ``apply_rotary`` and ``silu_and_mul`` replace
the engine's (``minisgl.layers``), and ``gqa_attention`` is called once per request by
``DenseLabBackend``, an attention backend registered as ``"lab01"``. Lab 06: the student's cache
class is registered in ``minisgl.kvcache.PREFIX_CACHES`` as ``"lab06"``. Tests run in forked
processes, but every swap is still undone on exit so a direct ``pytest`` run stays clean.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from autograder.checks import describe
from minisgl.attention import BACKENDS
from minisgl.attention.base import AttentionBackend
from minisgl.core import Batch
from minisgl.kvcache import PREFIX_CACHES


class DenseLabBackend(AttentionBackend):
    """Gathers each request's K/V from the pool (positions ``[0, end)``) into dense tensors and
    calls a dense attention function per request; slow, and simple enough to trust."""

    name = "lab01"

    def __init__(self, pool, page_table, num_heads: int, head_dim: int, attention: Callable):
        super().__init__(pool, page_table, num_heads, head_dim)
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


@contextmanager
def _patched(target, attr: str, value) -> Iterator[None]:
    if not hasattr(target, attr):  # the engine moved: fail loudly rather than test nothing
        raise RuntimeError(
            f"autograder out of date with the engine: {getattr(target, '__name__', target)} has no {attr!r} "
            "(not your fault: tell the course staff)"
        )
    saved = getattr(target, attr)
    setattr(target, attr, value)
    try:
        yield
    finally:
        setattr(target, attr, saved)


@contextmanager
def lab01_components(lab) -> Iterator[Counter]:
    """Swap the lab 01 functions (from the adapter ``lab``) into the engine; yields call counts.
    Use ``attention_backend="lab01"`` for the attention. Engines must be built inside the block
    (the rotary table is computed at construction)."""
    import minisgl.layers.norm as norm
    import minisgl.layers.rotary as rotary
    import minisgl.models.decoder as decoder

    counts: Counter = Counter()
    rms = _counted(lab.rms_norm, "rms_norm", counts)
    attention = _counted(lab.gqa_attention, "gqa_attention", counts)
    with (
        _patched(norm.RMSNorm, "_norm", lambda self, x: rms(x, self.weight, self.eps)),
        _patched(rotary, "rope_inv_freq", _counted(lab.rope_inv_freq, "rope_inv_freq", counts)),
        _patched(rotary, "_rotate", _counted(lab.apply_rotary, "apply_rotary", counts)),
        _patched(decoder, "silu_and_mul", _counted(lab.silu_and_mul, "silu_and_mul", counts)),
    ):
        BACKENDS["lab01"] = lambda pool, table, heads, dim: DenseLabBackend(pool, table, heads, dim, attention)
        try:
            yield counts
        finally:
            BACKENDS.pop("lab01", None)


@contextmanager
def registered_cache(cls, name: str = "lab06") -> Iterator[str]:
    PREFIX_CACHES[name] = cls
    try:
        yield name
    finally:
        PREFIX_CACHES.pop(name, None)


def generate_rounds(
    model: Path | None, rounds: list[list], max_tokens: int = 8, **engine_args
) -> tuple[list[list[list[int]]], list[list[int]], object]:
    """Greedy generation for each round of prompts on one engine, in order (later rounds can hit
    the prefix cache filled by earlier ones). Returns tokens and cached-prompt lengths per round,
    and the engine's cache stats."""
    from minisgl import LLM, SamplingParams

    llm = LLM(None if model is None else str(model), device="cpu", dtype="float32", **engine_args)
    try:
        tokens, cached = [], []
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        for prompts in rounds:
            outs = llm.generate(prompts, params, use_tqdm=False)
            tokens.append([o.token_ids for o in outs])
            cached.append([o.cached_tokens for o in outs])
        return tokens, cached, llm.cache_stats
    finally:
        llm.shutdown()
