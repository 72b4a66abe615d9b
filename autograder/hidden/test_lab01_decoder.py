"""Lab 01, hidden tests: half-precision RMSNorm bit for bit (the contract's 1% of one-unit roundings
aside), attention's ``scale`` argument, and attention over long sequences with large scores. Each calls
the lab function first, so a stub fails at once with its hint."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from autograder.adapters import lab01 as lab
from autograder.checks import check_tensor, describe
from autograder.points import points
from minisgl.layers.norm import rms_norm as engine_rms_norm


def _normal(shape: tuple[int, ...], seed: int, std: float = 1.0, dtype=torch.float32) -> torch.Tensor:
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * std).to(dtype)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal GQA for queries at the last ``T`` of ``S`` positions, in float32 (the oracle)."""
    t, s = q.shape[0], k.shape[0]
    allowed = torch.arange(s)[None, :] <= torch.arange(s - t, s)[:, None]
    out = F.scaled_dot_product_attention(
        *(x.float().transpose(0, 1) for x in (q, k, v)), attn_mask=allowed, scale=scale, enable_gqa=True
    )
    return out.transpose(0, 1).to(q.dtype)


@points(3)
def test_rms_norm_bit_exact_in_half_precision():
    """In bfloat16 and float16 rms_norm equals the engine's bit for bit (the order of the casts), at most 1% of
    the values one unit in the last place off, as the contract allows."""
    for dtype in (torch.bfloat16, torch.float16):
        x = _normal((7, 576), seed=40, std=3.0, dtype=dtype)  # the embedded model's hidden size
        weight = (_normal((576,), seed=41).abs() + 0.5).to(dtype)
        check_tensor(
            lab.rms_norm(x, weight, 1e-5),
            engine_rms_norm(x, weight, 1e-5),
            f"rms_norm(x {describe(x)}) compared bit for bit (at most 1% of the values one unit off)",
            exact=True,
            hint="normalise in float32, cast the normalised value back to x.dtype, *then* multiply by weight "
            "(multiplying in float32 and casting last rounds differently)",
        )


@points(3)
def test_gqa_attention_uses_its_scale():
    """gqa_attention multiplies the scores by the ``scale`` it is given, whatever the head size."""
    q, k, v = _normal((5, 6, 16), seed=42), _normal((9, 2, 16), seed=43), _normal((9, 2, 16), seed=44)
    for scale in (0.1, 1.0):
        check_tensor(
            lab.gqa_attention(q, k, v, scale),
            _sdpa(q, k, v, scale),
            f"gqa_attention(q {describe(q)}, k/v {describe(k)}, scale={scale})",
            atol=1e-5,
            rtol=1e-5,
            hint="use the scale argument, not head_dim ** -0.5 (models choose their own: Gemma, muP, ...)",
        )


@points(4)
def test_gqa_attention_long_sequence_large_scores():
    """gqa_attention on a 300-token chunk over a 400-token cached prefix, 16 heads on 4 KV heads of 128,
    with scores above 100 (softmax must not overflow), in float32 and bfloat16."""
    # std 5: the largest score is ~140, and exp() overflows float32 past ~88
    for dtype, tol in ((torch.float32, 1e-3), (torch.bfloat16, 3e-2)):
        q = _normal((300, 16, 128), seed=45, std=5.0, dtype=dtype)
        k = _normal((700, 4, 128), seed=46, std=5.0, dtype=dtype)
        v = _normal((700, 4, 128), seed=47, dtype=dtype)
        got = lab.gqa_attention(q, k, v, 128**-0.5)
        if isinstance(got, torch.Tensor) and got.dtype.is_floating_point and not torch.isfinite(got).all():
            raise AssertionError(
                f"gqa_attention on scores above 100 returned inf/NaN ({describe(q)}): exp() overflows "
                "float32 past ~88; subtract each row's max before exp, or use torch.softmax"
            )
        check_tensor(
            got,
            _sdpa(q, k, v, 128**-0.5),
            f"gqa_attention(q {describe(q)}, k/v {describe(k)})",
            atol=tol,
            rtol=tol,
            hint="softmax in float32 over all 700 keys, masked from S - T + t + 1 on",
        )
