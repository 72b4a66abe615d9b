"""Batched sampling: greedy, temperature, top-k, top-p, each request with its own parameters.

Randomness is *counter-based*: the uniform number used for request ``r``'s ``n``-th output token
is a hash of ``(seed_r, n)``. No generator state is carried between steps, so a seeded request
gives the same tokens whatever it is batched with, on any device, and every tensor-parallel rank
draws the same tokens with no communication.

A draw is an inverse-CDF lookup: with ``p = softmax(filtered logits / T)`` and ``u`` uniform in
(0, 1), the token is the first ``i`` with ``cumsum(p)[i] >= u`` (filtered tokens have ``p = 0`` and
can never be picked). One uniform per row keeps the cost at a softmax and a cumsum per step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from minisgl.core import Batch
from minisgl.kernels import triton_ops
from minisgl.registry import Registry

_M32 = 0xFFFFFFFF


@dataclass
class SamplingInfo:
    """Per-row parameters of one batch, on the device (built once per batch)."""

    temperatures: torch.Tensor  # [B] float32, 0 for greedy rows
    top_k: torch.Tensor  # [B] int64, vocab size when disabled
    top_p: torch.Tensor  # [B] float32, 1.0 when disabled
    seeds: torch.Tensor  # [B] int64
    steps: torch.Tensor  # [B] int64: index of the output token being sampled
    all_greedy: bool
    need_top_k: bool
    need_top_p: bool

    @classmethod
    def from_batch(cls, batch: Batch, vocab_size: int, device: torch.device) -> SamplingInfo:
        reqs = batch.reqs
        temps = [r.sampling.temperature if not r.sampling.is_greedy else 0.0 for r in reqs]
        top_k = [r.sampling.top_k if 0 < r.sampling.top_k < vocab_size else vocab_size for r in reqs]
        top_p = [r.sampling.top_p for r in reqs]
        seeds = [r.seed for r in reqs]
        steps = [r.num_scheduled_outputs for r in reqs]
        t = lambda x, dt: torch.tensor(x, dtype=dt).to(device, non_blocking=True)
        return cls(
            temperatures=t(temps, torch.float32),
            top_k=t(top_k, torch.int64),
            top_p=t(top_p, torch.float32),
            seeds=t(seeds, torch.int64),
            steps=t(steps, torch.int64),
            all_greedy=all(x == 0.0 for x in temps),
            need_top_k=any(k < vocab_size for k in top_k),
            need_top_p=any(p < 1.0 for p in top_p),
        )

    @classmethod
    def plain(cls, n: int, temperature: float, vocab_size: int, device: torch.device) -> SamplingInfo:
        """``n`` rows sampled at one temperature, no top-k/top-p, seeds ``0..n-1``, first output token:
        the dummy batch that compiles the sampler at start-up, or times it."""
        full = lambda x, dt: torch.full((n,), x, dtype=dt, device=device)
        return cls(
            temperatures=full(temperature, torch.float32),
            top_k=full(vocab_size, torch.int64),
            top_p=full(1.0, torch.float32),
            seeds=torch.arange(n, device=device),
            steps=full(0, torch.int64),
            all_greedy=temperature == 0.0,
            need_top_k=False,
            need_top_p=False,
        )


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xor-shift-multiply) on int64 tensors holding values < 2^32; the
    multiplier is < 2^27, so products stay below 2^63 and nothing overflows."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & _M32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _M32
    return (x >> 16) ^ x


def uniform(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """``u[r]`` in (0, 1), a pure function of ``(seeds[r], steps[r])``; float64 with 52 random bits."""
    lo = _mix32(_mix32(seeds & _M32) ^ (steps & _M32))
    lo = _mix32(lo ^ ((seeds >> 32) & _M32))
    hi = _mix32(lo ^ 0x5BD1E995)
    bits = (hi >> 12) << 32 | lo  # 20 + 32 bits
    return (bits.to(torch.float64) + 0.5) * (1.0 / (1 << 52))


def filter_logits(logits: torch.Tensor, info: SamplingInfo) -> torch.Tensor:
    """Temperature-scaled logits with tokens outside each row's top-k / top-p set to ``-inf``.

    top-k keeps tokens whose logit is >= the k-th largest; top-p keeps the smallest set of the most
    likely tokens whose probabilities sum to >= p (the token that crosses p is kept; p = 1 keeps all)."""
    temps = torch.where(info.temperatures > 0, info.temperatures, torch.ones_like(info.temperatures))
    logits = logits / temps[:, None]
    if not (info.need_top_k or info.need_top_p):
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if info.need_top_k:
        rank = torch.arange(logits.shape[-1], device=logits.device)
        kth = sorted_logits.gather(1, (info.top_k - 1).clamp(min=0)[:, None])
        drop |= (rank[None, :] >= info.top_k[:, None]) & (sorted_logits < kth)
    if info.need_top_p:
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the strictly more likely tokens
        # p = 1 keeps every token: a float32 cumsum can reach 1 before the tail, and a row's filter must not
        # depend on whether another row of its batch needs top-p
        drop |= (before >= info.top_p[:, None]) & (info.top_p[:, None] < 1.0)
        drop[:, 0] = False  # the most likely token always passes: a top_p that rounds to 0 would drop every one
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


class Sampler(ABC):
    """Turns a batch's logits into token ids (lab 02's seam; registered in ``SAMPLERS``).

    Contract: ``logits`` is ``[B, vocab]`` in the model's dtype (compute probabilities in float32);
    row ``r`` follows ``info``'s ``r``-th parameters. Returns ``[B]`` int64 on the logits' device.
    Rows with temperature 0 are greedy (argmax). A sampled row's draw depends only on its logits,
    its parameters, ``info.seeds[r]`` and ``info.steps[r]``, never on the other rows or earlier calls,
    so a seeded request gives the same tokens in any batch and tensor-parallel ranks agree. It runs
    inside the engine's forward pass: no host synchronisation on a GPU."""

    @abstractmethod
    def sample(self, logits: torch.Tensor, info: SamplingInfo) -> torch.Tensor: ...


class DefaultSampler(Sampler):
    def sample(self, logits: torch.Tensor, info: SamplingInfo) -> torch.Tensor:
        if info.all_greedy:  # on the CPU torch's bf16 argmax is slower than a float32 copy and its argmax
            return (logits.float() if logits.is_cpu else logits).argmax(dim=-1)
        tri = triton_ops(logits)
        if tri is not None and not (info.need_top_k or info.need_top_p):  # GPU: two kernels, same draw
            return tri.sample(logits, info.temperatures, info.seeds, info.steps)
        logits = logits.float()
        greedy = logits.argmax(dim=-1)
        cdf = filter_logits(logits, info).softmax(dim=-1).cumsum(dim=-1)
        target = uniform(info.seeds, info.steps).to(cdf.dtype)[:, None] * cdf[:, -1:]
        sampled = torch.searchsorted(cdf, target).squeeze(1).clamp_(max=logits.shape[-1] - 1)
        return torch.where(info.temperatures > 0, sampled, greedy)


# name -> a Sampler class (built with no arguments)
SAMPLERS: Registry[type[Sampler]] = Registry("sampler", {"default": DefaultSampler})
