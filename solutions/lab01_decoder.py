"""Lab 01: the building blocks of the decoder forward pass.

You implement five functions; the engine's versions live in ``minisgl/layers/`` (``norm.py``,
``rotary.py``, ``activation.py``) and ``minisgl/attention/torch_backend.py``. Every function works
on the engine's *flat* layout: the tokens of all requests of a batch back to back, so a
``[num_tokens, num_heads, head_dim]`` tensor has no batch dimension.

Contract (what the autograder checks):

* ``rms_norm(x, weight, eps)``: ``x * rsqrt(mean(x**2, last dim) + eps) * weight``. Normalise in
  float32, cast the normalised value back to ``x.dtype``, *then* multiply by ``weight``.
  ``x`` may have any number of leading dims (Qwen3 also normalises ``[tokens, heads, head_dim]``).
* ``rope_inv_freq(head_dim, base, scaling)``: the ``head_dim // 2`` rotary inverse frequencies
  ``base ** (-2i / head_dim)`` in float32, with Llama-3 frequency scaling when ``scaling`` is set.
* ``apply_rotary(x, cos, sin)``: rotate ``x`` ``[tokens, heads, head_dim]`` in the "rotate half"
  layout of HF Llama / Qwen3: the pairs are ``(x[..., i], x[..., i + head_dim // 2])``.
  ``cos`` and ``sin`` are ``[tokens, 1, head_dim // 2]`` in ``x.dtype`` (the engine builds them
  from your ``rope_inv_freq``: ``angle[p, i] = p * inv_freq[i]``).
* ``gqa_attention(q, k, v, scale)``: causal grouped-query attention over dense tensors;
  ``q`` is ``[T, H, D]``, ``k`` and ``v`` are ``[S, KV, D]`` with ``S >= T`` and ``H % KV == 0``.
  The queries are the *last* ``T`` positions of the sequence (the first ``S - T`` keys are the
  cached prefix), so query ``t`` may attend to keys ``0 .. S - T + t``. Query head ``h`` uses KV
  head ``h // (H // KV)``. Softmax in float32; returns ``[T, H, D]`` in ``q.dtype``.
* ``silu_and_mul(x)``: SwiGLU on the fused ``[gate | up]`` projection ``[..., 2 * I]``:
  ``silu(gate) * up`` with ``silu(g) = g * sigmoid(g)``; returns ``[..., I]``.

Grading: ``python -m autograder lab01``. Besides unit tests against the engine on fixed and
random inputs, the grader runs the real engine (``minisgl.LLM``) with your RMSNorm, rotary and
SwiGLU swapped in and your attention called once per request, and checks that the greedy tokens
equal the reference engine's on a tiny Llama (with rope scaling), a tiny Qwen3, and the embedded
SmolLM2 model.
"""

from __future__ import annotations

import math

import torch

from minisgl.models.config import RopeScaling


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square norm over the last dimension (no mean subtraction, no bias).

    ``x``: ``[..., dim]``; ``weight``: ``[dim]``. Returns ``[..., dim]``. Computing the mean of
    squares in ``x.dtype`` loses precision in bfloat16: convert to float32 first, and cast back
    before the ``weight`` multiply, as HF and the engine do (bit-for-bit equal results).
    """
    # BEGIN SOLUTION hint="normalise x by rsqrt(mean(x**2) + eps) over the last dim in float32, then * weight"
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)
    # END SOLUTION


def rope_inv_freq(head_dim: int, base: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """Rotary inverse frequencies, float32 ``[head_dim // 2]``.

    Without scaling: ``inv_freq[i] = 1 / base ** (2i / head_dim)`` for ``i = 0 .. head_dim/2 - 1``.

    Llama-3 scaling (``scaling`` is a ``RopeScaling``: ``factor``, ``low_freq_factor``,
    ``high_freq_factor``, ``original_max_position``) stretches long wavelengths so the model
    reaches past its training context. With ``wavelen = 2 * pi / inv_freq``,
    ``low_wavelen = original_max_position / low_freq_factor`` and
    ``high_wavelen = original_max_position / high_freq_factor``:

    * ``wavelen > low_wavelen`` (slow rotations): ``inv_freq / factor``
    * ``wavelen < high_wavelen`` (fast rotations): unchanged
    * otherwise blend: ``(1 - s) * inv_freq / factor + s * inv_freq`` with
      ``s = (original_max_position / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)``
    """
    # BEGIN SOLUTION hint="set inv_freq[i] = 1 / base ** (2i / head_dim) for i < head_dim // 2 (a float32 tensor)"
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (base**exponents)
    # END SOLUTION
    if scaling is None:
        return inv_freq
    # BEGIN SOLUTION hint="Llama-3 scaling: divide slow frequencies by factor, keep fast ones, blend in between"
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = scaling.original_max_position / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position / scaling.high_freq_factor
    s = (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - s) * inv_freq / scaling.factor + s * inv_freq
    out = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    return torch.where((wavelen >= high_wavelen) & (wavelen <= low_wavelen), blended, out)
    # END SOLUTION


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair ``(x1, x2) = (x[..., i], x[..., i + head_dim // 2])`` by its angle:
    ``(x1 * cos - x2 * sin, x2 * cos + x1 * sin)``.

    ``x``: ``[tokens, heads, head_dim]``; ``cos``, ``sin``: ``[tokens, 1, head_dim // 2]``
    (broadcast over heads). Returns a new tensor shaped like ``x``.
    """
    # BEGIN SOLUTION hint="split x into halves x1, x2 on the last dim; return cat(x1*cos - x2*sin, x2*cos + x1*sin)"
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    # END SOLUTION


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal grouped-query attention for one request.

    ``q``: ``[T, H, D]`` (the last ``T`` positions); ``k``, ``v``: ``[S, KV, D]`` (positions
    ``0 .. S-1``). ``softmax(q @ k^T * scale)`` with query ``t`` masked to keys ``<= S - T + t``,
    then ``@ v``. Query heads ``[g * (H // KV), (g + 1) * (H // KV))`` share KV head ``g``.
    Returns ``[T, H, D]`` in ``q.dtype``.
    """
    # BEGIN SOLUTION hint="repeat each KV head H // KV times, mask keys after S - T + t with -inf, softmax in float32"
    num_q, heads, _ = q.shape
    seq, kv_heads, _ = k.shape
    group = heads // kv_heads
    keys = k.float().repeat_interleave(group, dim=1)  # [S, H, D]
    values = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q.float(), keys) * scale  # [H, T, S]
    q_pos = torch.arange(seq - num_q, seq, device=q.device)
    k_pos = torch.arange(seq, device=q.device)
    scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
    out = torch.einsum("hts,shd->thd", scores.softmax(dim=-1), values)
    return out.to(q.dtype)
    # END SOLUTION


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU: ``x`` is ``[..., 2 * I]`` = ``[gate | up]``; returns ``gate * sigmoid(gate) * up``
    (``[..., I]``)."""
    # BEGIN SOLUTION hint="split x into gate (first half) and up (second half); return gate * sigmoid(gate) * up"
    gate, up = x.chunk(2, dim=-1)
    return gate * torch.sigmoid(gate) * up
    # END SOLUTION
