"""Lab 01: the building blocks of the decoder forward pass.

You implement five functions, which the engine calls through its seams (the ``NORMS``, ``ROTARIES``
and ``ACTIVATIONS`` registries of ``minisgl.layers``, and an attention backend). Write them here: the
engine's own versions and its C++ kernels are off limits, and so is torch's fused attention
(``torch.nn.functional.scaled_dot_product_attention``, which is the whole of ``gqa_attention``): a lab
that aliases or calls them is graded 0. Every function works on the engine's *flat* layout: the tokens
of all requests of a batch back to back, so a ``[num_tokens, num_heads, head_dim]`` tensor has no batch
dimension. No function changes its inputs; each returns a new tensor.

Contract (what the autograder checks):

* ``rms_norm(x, weight, eps)``: every row of ``x`` (a vector along the last dim; ``x`` may have any
  number of leading dims: Qwen3 also normalises ``[tokens, heads, head_dim]``) divided by its own
  root mean square, ``eps`` added to the mean of squares under the root, then multiplied channel by
  channel by ``weight`` (``[dim]``, in ``x.dtype``). Returns ``x``'s shape and dtype. *Precision*,
  the one HF and the engine share: the mean of squares and the division are float32 arithmetic
  whatever ``x.dtype``, and the normalised row is rounded to ``x.dtype`` before ``weight`` scales it
  (that product is in ``x.dtype``). What the grader accepts: for float32 ``x``, every value within
  ``1e-5 + 1e-5 * |the engine's value|`` of the engine's; for bfloat16 and float16 ``x``, the
  engine's values bit for bit, except that at most 1% of them (at least one) may be one unit in the
  last place off (float32 sums done in another order round that way now and then; the gain applied
  before the rounding, or the scale factor rounded before it multiplies ``x``, is one unit off in
  far more places, and a half-precision statistic more still).
  Example: ``x = [[1, 7], [0, 0]]``, ``weight = [1, 0.5]``, ``eps = 1e-6`` -> ``[[0.2, 0.7], [0, 0]]``
  (the first row's root mean square is 5; ``eps`` keeps the row of zeros finite).
* ``rope_inv_freq(head_dim, base, scaling)``: the rotary frequency of each of the ``head_dim // 2``
  rotating pairs, in radians per position, float32 (the grader accepts a relative ``1e-5``): pair
  ``i`` turns by ``base ** (-2i / head_dim)``. Example: ``rope_inv_freq(4, 100.0)`` -> ``[1.0, 0.1]``.
  With ``scaling`` (Llama-3's rule, a ``RopeScaling``), call ``L = original_max_position`` and a
  pair's wavelength ``2 * pi / frequency`` (positions per turn). A pair whose wavelength is longer
  than ``L / low_freq_factor`` turns ``factor`` times slower; one whose wavelength is shorter than
  ``L / high_freq_factor`` keeps its frequency; one in between gets a mix of the two, ``w * original
  + (1 - w) * original / factor``, whose weight ``w`` grows linearly with ``L / wavelength``, from 0
  where that ratio equals ``low_freq_factor`` to 1 where it equals ``high_freq_factor`` (so the bands
  meet without a jump). Example: ``rope_inv_freq(6, 1000.0, RopeScaling(factor=4,
  low_freq_factor=1, high_freq_factor=4, original_max_position=100))`` -> ``[1.0, 0.0397887,
  0.0025]`` (wavelengths 6.3, 62.8 and 628: kept, mixed with ``w = 0.197``, slowed 4x).
* ``apply_rotary(x, cos, sin)``: ``x`` is ``[tokens, heads, head_dim]``; ``cos`` and ``sin`` are
  ``[tokens, 1, head_dim // 2]`` in ``x.dtype``, the cosine and sine of each token's angle for each
  pair (the engine builds them from your ``rope_inv_freq``: pair ``i`` at position ``p`` turns by
  ``p * inv_freq[i]``; the same angles serve every head). The pairs are HF Llama's and Qwen3's
  "rotate half" layout: pair ``i`` is ``(x[..., i], x[..., i + head_dim // 2])``, the first half of
  the head against the second, never neighbours. Each pair turns by its angle counterclockwise, so a
  positive angle takes ``(1, 0)`` towards ``(0, 1)``. Returns ``x``'s shape, in ``x.dtype``; the
  order of the rounding is yours (the grader accepts ``1e-5`` absolute plus relative in float32,
  ``3e-2`` in bfloat16). Example: ``x = [[[1, 0, 0, 1]]]`` (pairs ``(1, 0)`` and ``(0, 1)``), ``cos = [[[0, 1]]]``,
  ``sin = [[[1, 0]]]`` (a quarter turn, then none) -> ``[[[0, 0, 1, 1]]]``.
* ``gqa_attention(q, k, v, scale)``: causal grouped-query attention of one request over dense tensors;
  ``q`` is ``[T, H, D]``, ``k`` and ``v`` are ``[S, KV, D]``, with ``S >= T`` and ``H`` a multiple of
  ``KV`` (the caller keeps both promises). The queries are the *last* ``T`` of the ``S`` positions
  (the first ``S - T`` keys are a cached prefix), so query ``t`` attends to keys ``0 .. S - T + t``,
  its own position included, and to no later one. The ``H`` query heads form ``KV`` groups of
  ``H // KV`` *consecutive* heads, and group ``g`` reads KV head ``g``. Each query's weights are the
  softmax, over the keys it may see, of ``scale`` times its dot product with each key (``scale`` as
  given, whatever ``D``); the output is the weighted sum of their values, ``[T, H, D]`` in ``q.dtype``.
  *Precision*: scores, softmax and weighted sum are float32 arithmetic whatever the input dtype,
  rounded to ``q.dtype`` once, at the end; scores far above 88 (where ``exp`` overflows float32) give
  finite weights. What the grader accepts: float32 within ``1e-5`` absolute plus relative of its
  float32 attention; bfloat16 as ``rms_norm`` above (bit for bit but at most 1% of the values one
  unit off). Examples, with ``q`` and ``k`` all zeros (every visible key weighs the same) and
  ``scale = 1``: ``T = S = 2``, ``H = KV = 1``, ``v = [[[2]], [[4]]]`` -> ``[[[2]], [[3]]]`` (query
  0 sees key 0 only); the last query alone, ``q`` of ``T = 1`` -> ``[[[3]]]``; ``S = T = 1``,
  ``H = 4``, ``KV = 2``, ``v = [[[10], [20]]]`` -> ``[[[10], [10], [20], [20]]]`` (heads 0 and 1 read
  KV head 0).
* ``silu_and_mul(x)``: SwiGLU's activation on the engine's fused projection: ``x`` is
  ``[..., 2 * I]``, the gate in the first ``I`` channels and the up projection in the last ``I``;
  returns ``[..., I]``, the up projection multiplied by ``silu`` of the gate, where ``silu(g) = g *
  sigmoid(g)``, in ``x.dtype`` (the grader accepts ``1e-6`` absolute plus relative in float32,
  ``2e-2`` in bfloat16). Example: ``[[0, 5], [2, 1]]`` -> ``[[0], [1.7616]]``.

Pitfalls the grader recognises (and names in its message when your output is one of them):

* any function: an input changed in place (the engine goes on using it).
* RMSNorm: tiny rows blown up to unit size (``eps`` left out, or added outside the root); one root
  mean square for the whole tensor instead of one per row; half-precision statistics (in float16 the
  squares overflow past 256); the gain applied before the rounding to ``x.dtype``; the scale factor
  rounded to ``x.dtype`` before it multiplies ``x`` (each differs from the engine in many values).
* rotary: a fixed base instead of ``base`` (Qwen3 uses 1e6, Llama-3 500000); a band of the Llama-3
  rule wrong, or the mix's weights swapped; neighbouring dims paired (the GPT-J / Meta layout);
  turning the wrong way (clockwise).
* attention: no causal mask; the mask placed as if the queries were positions ``0 .. T - 1`` (wrong
  whenever a prefix is cached); query heads paired with KV heads round-robin (head ``h`` with KV head
  ``h mod KV``); the scores, the softmax, or the weights before the sum with ``v`` rounded to
  bfloat16 (HF's eager attention rounds the weights); ``1 / sqrt(D)`` in place of ``scale``; an
  overflow to ``inf`` / ``NaN`` on large scores; a mask that hides a query's own key.
* SwiGLU: ``silu`` on the up projection instead of the gate.

Grading: ``python -m autograder lab01`` (``--hint`` prints a hint per function). Besides unit tests
against the engine on fixed and random inputs, the grader runs the real engine (``minisgl.LLM``) with
your RMSNorm, rotary and SwiGLU swapped in and your attention called once per request, and checks that
the greedy tokens equal the reference engine's on a tiny Llama (with rope scaling), a tiny Qwen3, and
the embedded SmolLM2 model.
"""

from __future__ import annotations

import math

import torch

from minisgl.models.config import RopeScaling


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square norm of each row (the last dim), no mean subtracted and no bias, with a gain.

    ``x``: ``[..., dim]``; ``weight``: ``[dim]``. Returns ``[..., dim]`` in ``x.dtype``, in the
    precision the module docstring states (statistics in float32, rounded before the gain).
    """
    raise NotImplementedError("Lab 01: the RMSNorm of each row, in the contract's precision (a hint: python -m autograder lab01 --hint)")


def rope_inv_freq(head_dim: int, base: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """The rotary frequency of each rotating pair, float32 ``[head_dim // 2]``; with ``scaling``, after
    Llama-3's rule (``factor``, ``low_freq_factor``, ``high_freq_factor``, ``original_max_position``),
    which stretches the long wavelengths so that a model reaches past its training context. The module
    docstring states both, with an example of each."""
    raise NotImplementedError("Lab 01: the frequency of each rotating pair, without scaling (a hint: python -m autograder lab01 --hint)")
    if scaling is None:
        return inv_freq
    raise NotImplementedError("Lab 01: Llama-3 scaling of the frequencies: three bands by wavelength (a hint: python -m autograder lab01 --hint)")


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn each rotate-half pair of ``x`` (``[tokens, heads, head_dim]``) by its token's angle
    (``cos``, ``sin``: ``[tokens, 1, head_dim // 2]``, the same for every head). Returns a new tensor
    shaped like ``x``, in ``x.dtype``."""
    raise NotImplementedError("Lab 01: the rotation of every rotate-half pair by its angle (a hint: python -m autograder lab01 --hint)")


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal grouped-query attention of one request: ``q`` ``[T, H, D]`` (the last ``T`` positions),
    ``k`` and ``v`` ``[S, KV, D]`` (positions ``0 .. S - 1``). Returns ``[T, H, D]`` in ``q.dtype``.
    Written out here: torch's fused attention is off limits (the module docstring says why)."""
    raise NotImplementedError("Lab 01: causal grouped-query attention over a cached prefix, in float32 (a hint: python -m autograder lab01 --hint)")


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation: ``x`` is ``[..., 2 * I]``, the gate then the up projection; returns
    ``[..., I]``."""
    raise NotImplementedError("Lab 01: SwiGLU's gated activation (a hint: python -m autograder lab01 --hint)")
