"""Lab 01: the building blocks of the decoder forward pass.

You implement five functions, which the engine calls through its seams (the ``NORMS``, ``ROTARIES``
and ``ACTIVATIONS`` registries of ``minisgl.layers``, and an attention backend). Write them here: the
engine's own versions and its C++ kernels are off limits, and so is torch's fused attention
(``torch.nn.functional.scaled_dot_product_attention``, which is the whole of ``gqa_attention``): a lab
that aliases or calls them is graded 0. Every function works on the engine's *flat* layout: the tokens of all requests of a batch back
to back, so a ``[num_tokens, num_heads, head_dim]`` tensor has no batch dimension.

Contract (what the autograder checks):

* ``rms_norm(x, weight, eps)``: ``x * rsqrt(mean(x**2, last dim) + eps) * weight``, in this order
  and precision (HF's and the engine's): convert ``x`` to float32, normalise it, cast the
  normalised value back to ``x.dtype``, *then* multiply by ``weight`` (in ``x.dtype``). On bfloat16
  and float16 inputs the grader wants this bit for bit (up to a rare last-bit rounding of float32
  math done in another order). ``x`` may have any number of leading dims (Qwen3 also normalises
  ``[tokens, heads, head_dim]``).
* ``rope_inv_freq(head_dim, base, scaling)``: the ``head_dim // 2`` rotary inverse frequencies
  ``base ** (-2i / head_dim)`` in float32, with Llama-3 frequency scaling when ``scaling`` is set.
* ``apply_rotary(x, cos, sin)``: rotate ``x`` ``[tokens, heads, head_dim]`` in the "rotate half"
  layout of HF Llama / Qwen3: the pairs are ``(x[..., i], x[..., i + head_dim // 2])``.
  ``cos`` and ``sin`` are ``[tokens, 1, head_dim // 2]`` in ``x.dtype`` (the engine builds them
  from your ``rope_inv_freq``: ``angle[p, i] = p * inv_freq[i]``); the result is in ``x.dtype``.
* ``gqa_attention(q, k, v, scale)``: causal grouped-query attention over dense tensors;
  ``q`` is ``[T, H, D]``, ``k`` and ``v`` are ``[S, KV, D]`` with ``S >= T`` and ``H % KV == 0``.
  The queries are the *last* ``T`` positions of the sequence (the first ``S - T`` keys are the
  cached prefix), so query ``t`` may attend to keys ``0 .. S - T + t``. Query head ``h`` uses KV
  head ``h // (H // KV)``. Compute in float32 throughout (convert ``q``, ``k``, ``v``; the scores,
  the softmax and the weighted sum of ``v`` in float32, as the engine's kernels accumulate) and
  cast the result once to ``q.dtype``: returns ``[T, H, D]``.
* ``silu_and_mul(x)``: SwiGLU on the fused ``[gate | up]`` projection ``[..., 2 * I]``:
  ``silu(gate) * up`` with ``silu(g) = g * sigmoid(g)``; returns ``[..., I]``.

Pitfalls the grader recognises (and names in its message when your output is one of them):

* RMSNorm: ``eps`` left out or outside the square root; one mean of squares for the whole tensor
  instead of each row's (the last dim only); the mean of squares (or the whole norm)
  computed in bfloat16 / float16 (``x**2`` even overflows float16 past 256); the weight multiplied
  in float32 with a single cast at the end (the other order); the ``rsqrt`` factor cast back to
  ``x.dtype`` before it multiplies ``x`` (too early).
* rotary: a hard-coded base instead of ``base``; the wrong band of the Llama-3 scaling (or the
  blend's weights swapped); adjacent pairs ``(x[2i], x[2i + 1])`` (the GPT-J / Meta layout)
  instead of ``(x[i], x[i + d/2])``; the sign of ``sin`` flipped (rotating backwards).
* attention: no causal mask; the mask offset forgotten (queries taken as positions ``0 .. T-1``
  instead of ``S - T .. S - 1``); query head ``h`` paired with KV head ``h % KV`` (``repeat``)
  instead of ``h // (H // KV)`` (``repeat_interleave``); the scores or the softmax in bfloat16, or
  the probabilities cast to ``q.dtype`` before ``@ v`` (HF's eager order); ``1 / sqrt(head_dim)``
  instead of the ``scale`` argument; ``exp()`` without subtracting each row's maximum (scores above
  88 overflow float32); a mask that hides a query's own key (``<`` for ``<=``).
* SwiGLU: ``silu`` applied to the second half (``up``) instead of the first (``gate``).

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

    ``x``: ``[..., dim]``; ``weight``: ``[dim]``. Returns ``[..., dim]`` in ``x.dtype``. Three
    steps, in this order: ``h = x.float()``; ``h = h * rsqrt(mean(h**2) + eps)``; return
    ``weight * h.to(x.dtype)``. Computing the mean of squares in bfloat16 loses precision (and
    overflows float16), and multiplying by ``weight`` before the cast rounds differently: either
    differs from HF and the engine, which are bit-for-bit equal to these three steps.
    """
    # BEGIN SOLUTION hint="h = x.float(); h = h * rsqrt(mean(h**2, last dim) + eps); return weight * h.to(x.dtype)"
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
    (broadcast over heads). Returns a new tensor shaped like ``x``. Not adjacent pairs
    ``(x[..., 2i], x[..., 2i + 1])``: that is another checkpoint layout (GPT-J, Meta's originals).
    """
    # BEGIN SOLUTION hint="split x into halves x1, x2 on the last dim; return cat(x1*cos - x2*sin, x2*cos + x1*sin)"
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    # END SOLUTION


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal grouped-query attention for one request.

    ``q``: ``[T, H, D]`` (the last ``T`` positions); ``k``, ``v``: ``[S, KV, D]`` (positions
    ``0 .. S-1``). ``softmax(q @ k^T * scale)`` with query ``t`` masked to keys ``<= S - T + t``
    (not ``<= t``: the first ``S - T`` keys are a cached prefix), then ``@ v``. Query heads
    ``[g * (H // KV), (g + 1) * (H // KV))`` share KV head ``g``: head ``h`` reads KV head
    ``h // (H // KV)``, not ``h % KV``. Everything in float32 (``q.float()``, ``k.float()``,
    ``v.float()``); returns ``[T, H, D]`` cast once to ``q.dtype``.
    """
    # BEGIN SOLUTION hint="in float32: repeat_interleave KV heads H // KV times, mask keys > S - T + t, softmax, @ v"
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
