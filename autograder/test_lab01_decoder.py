"""Lab 01 (the decoder's building blocks): unit tests against the engine's layers, then the real
engine with your functions swapped in. Run: ``python -m autograder lab01`` (or
``pytest autograder -k lab01 --impl labs`` to see pytest's own output)."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from autograder.adapters import lab01 as lab
from autograder.checks import Pitfall, check_tensor, describe, dtype_name, first_token_difference, matches
from autograder.engine_runs import generate_rounds
from autograder.points import engine, points
from minisgl.env import ENV
from minisgl.layers.activation import silu_and_mul as engine_silu_and_mul
from minisgl.layers.norm import RMSNorm
from minisgl.layers.rotary import RotaryEmbedding
from minisgl.layers.rotary import rope_inv_freq as ref_inv_freq
from minisgl.models.config import ModelConfig, RopeScaling

LLAMA31_SCALING = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192)


def rand(*shape, seed: int = 0, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


# ---- reference implementations (the engine's own layers) ---------------------------------------
@contextlib.contextmanager
def torch_math():
    """The engine's layers as their torch ops: on a CPU they otherwise run C++ kernels
    (``minisgl/kernels/cpu_fused.py``), whose sums may round a value differently in its last bit. The
    contract is the torch arithmetic, bit for bit in half precision."""
    before = ENV.fused_kernels
    ENV.fused_kernels = False
    try:
        yield
    finally:
        ENV.fused_kernels = before


def ref_rms_norm(x, weight, eps):
    norm = RMSNorm(x.shape[-1], eps).to(weight.dtype)
    with torch.no_grad(), torch_math():
        norm.weight.copy_(weight)
        return norm(x)


def rotary_cos_sin(head_dim: int, positions: torch.Tensor, dtype, base: float = 10000.0, scaling=None):
    """cos, sin ``[tokens, 1, head_dim // 2]`` exactly as the engine computes them."""
    table = RotaryEmbedding(head_dim, int(positions.max()) + 1, base, scaling).cos_sin
    cos, sin = table[positions].to(dtype).unsqueeze(1).chunk(2, dim=-1)
    return cos, sin


def ref_rotary(x, positions, base: float = 10000.0, scaling=None):
    rot = RotaryEmbedding(x.shape[-1], int(positions.max()) + 1, base, scaling)
    with torch_math():
        return rot(positions, x, x)[0]


def ref_silu_and_mul(x):
    with torch_math():
        return engine_silu_and_mul(x)


def ref_attention(q, k, v, scale):
    """Causal GQA through torch SDPA in float32 (the engine's torch backend), rounded once to q.dtype."""
    t, s = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    keys, values = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    mask = torch.arange(s)[None, :] <= torch.arange(s - t, s)[:, None]
    out = F.scaled_dot_product_attention(
        q.float().transpose(0, 1), keys.float().transpose(0, 1), values.float().transpose(0, 1), mask, scale=scale
    )
    return out.transpose(0, 1).to(q.dtype)


def low_precision(dtype: torch.dtype) -> bool:
    return dtype in (torch.bfloat16, torch.float16)


def keeping_inputs(fn, what: str, **args):
    """``fn(**args)`` (an adapter function), after which every tensor argument must be as it was: the
    contract's "no function changes its inputs" (the engine goes on using them)."""
    before = {key: t.clone() for key, t in args.items() if isinstance(t, torch.Tensor)}
    out = fn(**args)
    name = fn.__name__
    for key, t in before.items():
        assert torch.equal(args[key], t), (
            f"{what}: {name} changed its input {key} in place (the contract: no function changes its inputs, each "
            f"returns a new tensor; an in-place op such as mul_ or copy_ on {key}, or on a view of it, does)"
        )
    return out


# ---- RMSNorm ----------------------------------------------------------------------------------------
def rms_norm_pitfalls(x: torch.Tensor, weight: torch.Tensor, eps: float) -> list[Pitfall]:
    """The wrong answers rms_norm is known to give, each computed on this input. The precision ones
    are named only for a low-precision ``x``: in float32 every order gives the same answer."""

    def finish(h: torch.Tensor) -> torch.Tensor:  # the contract's last two steps
        return weight * h.to(x.dtype)

    h = x.float()
    mean_sq = h.pow(2).mean(-1, keepdim=True)
    inside = "eps goes inside the square root, rsqrt(mean(x**2) + eps)"
    out = [
        Pitfall("leaving eps out", f"{inside}; without it tiny rows are blown up", lambda: finish(h * mean_sq.rsqrt())),
        Pitfall("adding eps outside the square root", inside, lambda: finish(h / (mean_sq.sqrt() + eps))),
        Pitfall(
            "the sum of squares instead of their mean",
            "divide by sqrt(mean(x**2) + eps)",
            lambda: finish(h * torch.rsqrt(h.pow(2).sum(-1, keepdim=True) + eps)),
        ),
        Pitfall(
            "forgetting the weight",
            "multiply the normalised value by weight",
            lambda: (h * torch.rsqrt(mean_sq + eps)).to(x.dtype),
        ),
        Pitfall(
            "one mean of squares for the whole tensor instead of each row's",
            "each row (each head of a [tokens, heads, head_dim] x) is normalised by its own mean over the last "
            "dim: mean(dim=-1, keepdim=True)",
            lambda: finish(h * torch.rsqrt(h.pow(2).mean() + eps)),
        ),
    ]
    if not low_precision(x.dtype):
        return out
    low = dtype_name(x.dtype)
    return out + [
        Pitfall(
            f"computing the mean of squares in {low} (x**2, its mean and the normalisation in {low}, no x.float())",
            f"convert x to float32 first, normalise, then cast back to {low}",
            lambda: weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)),
        ),
        Pitfall(
            f"casting back to {low} too early (the rsqrt factor cast to {low}, then x * it in {low})",
            f"normalise in float32, x.float() * rsqrt(...), and cast that back to {low}",
            lambda: weight * (x * torch.rsqrt(mean_sq + eps).to(x.dtype)),
        ),
        Pitfall(
            f"multiplying by weight in float32 and casting to {low} at the end (the other order)",
            f"cast the normalised value back to {low} first, *then* multiply by weight, as HF and the engine do",
            lambda: (weight.float() * (h * torch.rsqrt(mean_sq + eps))).to(x.dtype),
        ),
        Pitfall(
            f"computing the mean of squares in {low} (x.pow(2).mean() before .float())",
            "convert x to float32 first, then square it",
            lambda: finish(h * torch.rsqrt(x.pow(2).mean(-1, keepdim=True).float() + eps)),
        ),
    ]


def check_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, what: str, hint: str = "") -> None:
    """The contract's precision: float32 within 1e-5 of the engine; bfloat16/float16 the engine's values bit for
    bit, but at most 1% of them one unit in the last place off (the contract fixes the order of the casts)."""
    got = keeping_inputs(lab.rms_norm, what, x=x, weight=weight, eps=eps)
    tol = 0.0 if low_precision(x.dtype) else 1e-5
    check_tensor(
        got,
        ref_rms_norm(x, weight, eps),
        what,
        atol=tol,
        rtol=tol,
        exact=low_precision(x.dtype),
        hint=hint or "normalise x.float() by rsqrt(mean(x**2) + eps) over the last dim, cast back, then * weight",
        pitfalls=rms_norm_pitfalls(x, weight, eps),
    )


@points(6)
def test_rms_norm_fixed():
    """rms_norm matches the engine's RMSNorm in float32, including rows so small that eps matters."""
    x = rand(4, 64, seed=1)
    weight = rand(64, seed=2).abs() + 0.5
    check_rms_norm(
        x[[0, 2, 3]] * torch.tensor([[1.0], [30.0], [1.0]]),
        weight,
        1e-6,
        "rms_norm on ordinary rows",
        hint="divide by sqrt(mean(x**2) + eps) over the last dim (mean, not sum; no mean subtraction)",
    )
    check_rms_norm(
        x[1:2] * 1e-4,  # mean(x^2) ~ 1e-8, far below eps: without eps this row blows up
        weight,
        1e-6,
        "rms_norm on a row of tiny values (1e-4)",
        hint="eps goes inside the square root: rsqrt(mean(x**2) + eps); without it tiny rows are blown up",
    )
    x3 = rand(3, 4, 32, seed=3)  # Qwen3 normalises each head: [tokens, heads, head_dim]
    check_rms_norm(
        x3, rand(32, seed=4), 1e-6, "rms_norm on [tokens, heads, head_dim]", hint="normalise over the last dim only"
    )


@points(5)
def test_rms_norm_low_precision():
    """In bfloat16 and float16, rms_norm normalises in float32, rounds to x.dtype, then applies the gain: the
    engine's values bit for bit, at most 1% of them one unit in the last place off. The other order of the
    rounding and the gain is one unit off in about a quarter of the values: only the bit-for-bit rule (not a
    tolerance of one unit) tells it apart."""
    x = rand(64, 576, seed=41, dtype=torch.bfloat16, scale=3.0)  # SmolLM2's hidden size
    check_rms_norm(
        x,
        (rand(576, seed=42) * 0.3 + 1.0).bfloat16(),
        1e-5,
        f"rms_norm(x {describe(x)}), compared bit for bit (the contract allows at most 1% of the values one unit in "
        "the last place off)",
    )
    big = rand(8, 64, seed=43, dtype=torch.float16, scale=300.0)
    check_rms_norm(
        big,
        (rand(64, seed=44) * 0.3 + 1.0).half(),
        1e-6,
        f"rms_norm(x {describe(big)}) on values of magnitude ~300 (x**2 ~ 1e5 overflows float16, whose "
        "largest value is 65504)",
    )


@points(5)
def test_rms_norm_random():
    """rms_norm matches the engine on random shapes, magnitudes and dtypes (float32 within 1e-5,
    bfloat16 and float16 bit for bit but at most 1% of the values one unit off)."""
    lab.rms_norm(rand(2, 8), torch.ones(8), 1e-6)  # a stub fails here, before the random search
    _rms_norm_random()


@settings(max_examples=40)
@given(
    rows=st.integers(2, 6),  # at least 64 values: enough for each precision mistake to round its own way
    dim=st.sampled_from([32, 64, 576]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    eps=st.sampled_from([1e-5, 1e-6]),
    scale=st.sampled_from([1e-4, 1e-2, 1.0, 3.0, 30.0]),
    seed=st.integers(0, 2**16),
)
def _rms_norm_random(rows, dim, dtype, eps, scale, seed):
    x = rand(rows, dim, seed=seed, dtype=dtype, scale=scale)
    weight = (rand(dim, seed=seed + 1) * 0.3 + 1.0).to(dtype)
    check_rms_norm(x, weight, eps, f"rms_norm(x {describe(x)} of magnitude {scale:g}, eps={eps})")


# ---- rotary -----------------------------------------------------------------------------------------
def rope_pitfalls(head_dim: int, base: float, scaling: RopeScaling | None) -> list[Pitfall]:
    def swapped_blend() -> torch.Tensor:
        inv_freq = ref_inv_freq(head_dim, base)
        wavelen = 2 * math.pi / inv_freq
        ctx, low, high = scaling.original_max_position, scaling.low_freq_factor, scaling.high_freq_factor
        s = (ctx / wavelen - low) / (high - low)  # the docstring's blend weight
        middle = (wavelen >= ctx / high) & (wavelen <= ctx / low)
        return torch.where(
            middle, s * inv_freq / scaling.factor + (1 - s) * inv_freq, ref_inv_freq(head_dim, base, scaling)
        )

    out = [
        Pitfall(
            "a hard-coded base 10000",
            "use the base argument (the model's rope_theta: Qwen3 uses 1e6, Llama-3 500000)",
            lambda: ref_inv_freq(head_dim, 10000.0, scaling) if base != 10000.0 else None,
        ),
        Pitfall(
            "base ** (-i / head_dim)",
            "the exponent is 2i / head_dim (i < head_dim // 2)",
            lambda: 1.0 / base ** (torch.arange(head_dim // 2).float() / head_dim),
        ),
    ]
    if scaling is not None:
        out += [
            Pitfall(
                "leaving the scaling out",
                "apply the Llama-3 scaling when scaling is set",
                lambda: ref_inv_freq(head_dim, base),
            ),
            Pitfall(
                "swapping the blend's weights (middle band)",
                "(1 - s) * inv_freq / factor + s * inv_freq, so s = 1 at the fast end keeps the frequency",
                swapped_blend,
            ),
        ]
    return out


@points(6)
def test_rope_inv_freq_default():
    """rope_inv_freq without scaling: base ** (-2i / head_dim), float32, head_dim // 2 values."""
    for head_dim, base in [(64, 10000.0), (128, 1e6), (64, 100000.0), (16, 500.0)]:
        check_tensor(
            lab.rope_inv_freq(head_dim, base),
            ref_inv_freq(head_dim, base),
            f"rope_inv_freq(head_dim={head_dim}, base={base:g})",
            rtol=1e-5,
            hint="inv_freq[i] = 1 / base ** (2i / head_dim) for i in range(head_dim // 2)",
            pitfalls=rope_pitfalls(head_dim, base, None),
        )


@points(6)
def test_rope_inv_freq_llama3():
    """rope_inv_freq with Llama-3 scaling: slow frequencies / factor, fast kept, a blend between."""
    cases = [
        (128, 500000.0, LLAMA31_SCALING),  # Llama-3.1-8B
        (16, 10000.0, RopeScaling(8.0, 1.0, 4.0, 256)),  # the grader's tiny Llama
    ]
    for head_dim, base, scaling in cases:
        want = ref_inv_freq(head_dim, base, scaling)
        got = lab.rope_inv_freq(head_dim, base, scaling)
        what = f"rope_inv_freq(head_dim={head_dim}, base={base:g}, scaling={scaling})"
        if matches(got, want, rtol=1e-5):
            continue
        plain_ok = matches(lab.rope_inv_freq(head_dim, base), ref_inv_freq(head_dim, base), rtol=1e-5)
        if plain_ok and isinstance(got, torch.Tensor) and got.shape == want.shape:  # the scaling is wrong
            wavelen = 2 * math.pi / ref_inv_freq(head_dim, base)
            bad = ((got.double() - want.double()).abs() > 1e-5 * want.double().abs()).nonzero().flatten()
            i = int(bad[0]) if len(bad) else 0
            band = (
                "long band (divide by factor)"
                if wavelen[i] > scaling.original_max_position / scaling.low_freq_factor
                else "short band (unchanged)"
                if wavelen[i] < scaling.original_max_position / scaling.high_freq_factor
                else "middle band (blend)"
            )
            what += f": the first wrong value, frequency {i} (wavelength {wavelen[i]:.1f}), is in the {band}"
        check_tensor(
            got,
            want,
            what,
            rtol=1e-5,
            hint="check that band's formula in the docstring (wavelen = 2 * pi / inv_freq)",
            pitfalls=rope_pitfalls(head_dim, base, scaling),
        )


@points(3)
def test_rope_inv_freq_random():
    """rope_inv_freq matches the engine for random head sizes, bases and scaling parameters."""
    lab.rope_inv_freq(8, 10000.0, None)  # a stub fails here, before the random search
    _rope_inv_freq_random()


@settings(max_examples=40)
@given(
    half=st.integers(1, 64),
    base=st.floats(100.0, 1e6),
    scaled=st.booleans(),
    factor=st.floats(1.5, 32.0),
    low=st.floats(0.5, 2.0),
    extra=st.floats(0.5, 8.0),
    original=st.sampled_from([64, 256, 2048, 8192]),
)
def _rope_inv_freq_random(half, base, scaled, factor, low, extra, original):
    scaling = RopeScaling(factor, low, low + extra, original) if scaled else None
    check_tensor(
        lab.rope_inv_freq(2 * half, base, scaling),
        ref_inv_freq(2 * half, base, scaling),
        f"rope_inv_freq(head_dim={2 * half}, base={base:g}, scaling={scaling})",
        atol=1e-30,
        rtol=1e-5,
        hint="see the docstring's formula for each band" if scaled else "inv_freq[i] = 1 / base ** (2i / head_dim)",
        pitfalls=rope_pitfalls(2 * half, base, scaling),
    )


def rotary_pitfalls(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> list[Pitfall]:
    x1, x2 = x.chunk(2, dim=-1)

    def adjacent_pairs() -> torch.Tensor:
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)

    return [
        Pitfall(
            "rotating adjacent pairs (x[2i], x[2i+1]) (the GPT-J / Meta layout)",
            "HF Llama and Qwen3 weights use the 'rotate half' layout, pairs (x[i], x[i + head_dim // 2])",
            adjacent_pairs,
        ),
        Pitfall(
            "rotating by minus the angle (the sign of sin flipped)",
            "the first half is x1*cos - x2*sin, the second x2*cos + x1*sin",
            lambda: torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1),
        ),
    ]


def check_rotary(x: torch.Tensor, positions: torch.Tensor, what: str) -> None:
    cos, sin = rotary_cos_sin(x.shape[-1], positions, x.dtype)
    tol = 3e-2 if low_precision(x.dtype) else 1e-5  # the contract leaves apply_rotary's rounding open
    check_tensor(
        keeping_inputs(lab.apply_rotary, what, x=x, cos=cos, sin=sin),
        ref_rotary(x, positions),
        what,
        atol=tol,
        rtol=tol,
        hint="first half: x1*cos - x2*sin, second half: x2*cos + x1*sin, with x1, x2 = x.chunk(2, dim=-1)",
        pitfalls=rotary_pitfalls(x, cos, sin),
    )


@points(7)
def test_apply_rotary_fixed():
    """apply_rotary rotates pairs (x[i], x[i + head_dim/2]) by the given angles, like HF Llama."""
    x = rand(5, 4, 16, seed=5)
    cos, sin = rotary_cos_sin(16, torch.tensor([0]), torch.float32)
    check_tensor(
        lab.apply_rotary(x[:1], cos, sin),
        x[:1],
        "apply_rotary at position 0 (angle 0: every vector must come back unchanged)",
        atol=1e-6,
        hint="cos and sin are per pair, [tokens, 1, head_dim // 2]: do not rotate by anything else",
    )
    check_rotary(x, torch.tensor([0, 1, 2, 7, 100]), "apply_rotary on [5 tokens, 4 heads, head_dim 16]")


@points(4)
def test_apply_rotary_random():
    """apply_rotary matches the engine on random shapes and positions, float32 and bfloat16."""
    lab.apply_rotary(
        rand(1, 1, 4), *rotary_cos_sin(4, torch.tensor([1]), torch.float32)
    )  # a stub fails here, before the random search
    _apply_rotary_random()


@settings(max_examples=30)
@given(
    tokens=st.integers(1, 8),
    heads=st.integers(1, 4),
    half=st.sampled_from([1, 4, 32]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def _apply_rotary_random(tokens, heads, half, dtype, seed):
    positions = torch.randint(0, 4096, (tokens,), generator=torch.Generator().manual_seed(seed))
    x = rand(tokens, heads, 2 * half, seed=seed, dtype=dtype)
    check_rotary(x, positions, f"apply_rotary(x {describe(x)}, positions {positions.tolist()})")


# ---- attention --------------------------------------------------------------------------------------
def dense_attention(
    q, k, v, scale, *, mask: str = "causal", heads: str = "interleave", low: str = "", naive: bool = False
) -> torch.Tensor:
    """Attention written the way a student might, to compute the pitfalls: ``mask`` is "causal"
    (queries at S - T .. S - 1), "strict" (each query's own key hidden too), "first" (queries taken as
    0 .. T - 1) or "none"; ``heads`` "interleave" (head h reads KV head h // (H // KV)) or "repeat"
    (h % KV); ``low`` the step done in q.dtype: "all", "scores" (q @ k^T), "softmax" or "probs" (cast
    before @ v); ``naive``: exp / sum without subtracting the row's maximum."""
    t, s = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]

    def spread(z: torch.Tensor) -> torch.Tensor:
        return z.repeat_interleave(group, dim=1) if heads == "interleave" else z.repeat(1, group, 1)

    def up(z: torch.Tensor) -> torch.Tensor:
        return z if low == "all" else z.float()

    scores = torch.einsum("thd,shd->hts", q if low == "scores" else up(q), spread(k if low == "scores" else up(k)))
    scores = (scores * scale).float() if low == "scores" else scores * scale
    if mask != "none":
        q_pos = torch.arange(t) if mask == "first" else torch.arange(s - t, s) - int(mask == "strict")
        scores = scores.masked_fill(torch.arange(s)[None, None, :] > q_pos[None, :, None], float("-inf"))
    # the normalisation runs in q.dtype only for the "softmax" pitfall
    weights = scores.to(q.dtype) if low == "softmax" else scores
    probs = (weights.exp() / weights.exp().sum(-1, keepdim=True) if naive else torch.softmax(weights, dim=-1)).float()
    values = spread(up(v))
    if low == "probs":
        probs, values = probs.to(q.dtype), spread(v)
    return torch.einsum("hts,shd->thd", probs, values).to(q.dtype)


def attention_pitfalls(q, k, v, scale) -> list[Pitfall]:
    t, h = q.shape[:2]
    s, kv = k.shape[:2]
    out = []
    if t > 1:
        out.append(
            Pitfall(
                "attention without the causal mask",
                f"query t may only see keys 0 .. S - T + t (here S={s}, T={t})",
                lambda: dense_attention(q, k, v, scale, mask="none"),
            )
        )
    if s > t:
        out.append(
            Pitfall(
                "a mask that takes the queries as positions 0 .. T-1",
                f"they are the last T positions (S - T .. S - 1 = {s - t} .. {s - 1}); the first S - T keys are the "
                "cached prefix",
                lambda: dense_attention(q, k, v, scale, mask="first"),
            )
        )
    if scale != q.shape[-1] ** -0.5:
        out.append(
            Pitfall(
                "1 / sqrt(head_dim) instead of the scale argument",
                f"multiply the scores by scale (here {scale:g}, not head_dim ** -0.5 = {q.shape[-1] ** -0.5:g}): "
                "models choose their own (Gemma, muP, ...)",
                lambda: dense_attention(q, k, v, q.shape[-1] ** -0.5),
            )
        )
    out.append(
        Pitfall(
            "a mask that hides each query's own key (keys < S - T + t kept instead of <=)",
            "query t sees keys 0 .. S - T + t, its own position included",
            lambda: dense_attention(q, k, v, scale, mask="strict"),
        )
    )
    if (torch.einsum("thd,shd->hts", q.float(), k.float().repeat_interleave(h // kv, dim=1)) * scale).max() > 88:
        out.append(
            Pitfall(
                "exp() without subtracting each row's maximum (scores above 88 overflow float32: inf / inf is NaN)",
                "use torch.softmax, or subtract each row's max before exp()",
                lambda: dense_attention(q, k, v, scale, naive=True),
            )
        )
    if 1 < kv < h:
        out.append(
            Pitfall(
                "pairing query head h with KV head h % KV (repeat instead of repeat_interleave)",
                f"with H={h} and KV={kv}, heads 0..{h // kv - 1} share KV head 0: head h reads KV head h // (H // KV)",
                lambda: dense_attention(q, k, v, scale, heads="repeat"),
            )
        )
    if low_precision(q.dtype):  # in float32 there is no lower precision to compute in
        name = dtype_name(q.dtype)
        out += [
            Pitfall(
                f"computing the scores and the softmax in {name} (q, k, v never converted to float32)",
                f"q.float(), k.float(), v.float(), and cast the output to {name} once at the end",
                lambda: dense_attention(q, k, v, scale, low="all"),
            ),
            Pitfall(
                f"the softmax in {name} (scores cast to {name} before it)",
                "keep the scores in float32",
                lambda: dense_attention(q, k, v, scale, low="softmax"),
            ),
            Pitfall(
                f"casting the probabilities to {name} before @ v (HF's eager order)",
                "keep them in float32 and multiply by v.float()",
                lambda: dense_attention(q, k, v, scale, low="probs"),
            ),
            Pitfall(
                f"q @ k^T in {name} (the scores are rounded before the float32 softmax)",
                "convert q and k first",
                lambda: dense_attention(q, k, v, scale, low="scores"),
            ),
        ]
    return out


def check_attention(q, k, v, scale, what) -> None:
    """float32: within 1e-5 of SDPA; bfloat16: float32 math rounded once, bit for bit."""
    low = low_precision(q.dtype)
    tol = 0.0 if low else 1e-5
    check_tensor(
        keeping_inputs(lab.gqa_attention, what, q=q, k=k, v=v, scale=scale),
        ref_attention(q, k, v, scale),
        what,
        atol=tol,
        rtol=tol,
        exact=low,
        hint="scores = q @ k^T * scale, masked with -inf, softmax over keys, then @ v, all in float32",
        pitfalls=attention_pitfalls(q, k, v, scale),
    )


@points(7)
def test_gqa_attention_prefill():
    """Causal GQA over a whole prompt (T == S), 8 query heads sharing 2 KV heads, scaled by the scale it is
    given (1 / sqrt(head_dim), and another)."""
    q, k, v = rand(6, 8, 16, seed=6), rand(6, 2, 16, seed=7), rand(6, 2, 16, seed=8)
    check_attention(q, k, v, 16**-0.5, "gqa_attention(q [6, 8, 16], k/v [6, 2, 16])")
    check_attention(q, k, v, 0.125, "gqa_attention(q [6, 8, 16], k/v [6, 2, 16], scale=0.125)")


@points(7)
def test_gqa_attention_cached_prefix():
    """Queries that are the last T positions: a prefill over a cached prefix, and a decode step."""
    q, k, v = rand(3, 4, 16, seed=9), rand(10, 2, 16, seed=10), rand(10, 2, 16, seed=11)
    check_attention(q, k, v, 0.25, "gqa_attention with 7 cached keys + 3 new queries (q [3, 4, 16], k [10, 2, 16])")
    check_attention(q[-1:], k, v, 0.25, "gqa_attention for one decode query over 10 keys")


@points(5)
def test_gqa_attention_bfloat16():
    """In bfloat16, attention computes in float32 and rounds once: bit for bit the float32 result; and its
    softmax survives scores above 88 (where exp() overflows float32)."""
    q = rand(8, 6, 64, seed=45, dtype=torch.bfloat16, scale=2.0)
    k, v = rand(40, 2, 64, seed=46, dtype=torch.bfloat16), rand(40, 2, 64, seed=47, dtype=torch.bfloat16)
    check_attention(q, k, v, 64**-0.5, f"gqa_attention(q {describe(q)}, k/v {describe(k)})")
    q, k = large_scores(q, k)
    check_attention(q, k, v, 64**-0.5, f"gqa_attention(q {describe(q)}, k/v {describe(k)}) on scores above 88")


def large_scores(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rounded to integers, q scaled up: scores far above 88 (exp() overflows float32 there), and
    exact whatever the order of the sums (integers, and a power-of-two scale)."""
    return (q.float() * 30).round().to(q.dtype), (k.float() * 2).round().to(k.dtype)


@points(6)
def test_gqa_attention_random():
    """gqa_attention matches SDPA for random sequence lengths, head groupings, dtypes, scales and scores
    (some above 88)."""
    lab.gqa_attention(rand(2, 2, 4), rand(2, 1, 4), rand(2, 1, 4), 0.5)  # a stub fails here, before the random search
    _gqa_attention_random()


@settings(max_examples=40)
@given(
    new=st.integers(1, 6),
    cached=st.integers(0, 9),
    kv_heads=st.integers(1, 3),
    group=st.sampled_from([1, 2, 3]),
    dim=st.sampled_from([4, 16]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    scale=st.sampled_from([None, 0.125, 1.0]),  # None: 1 / sqrt(dim); all powers of two
    large=st.booleans(),
    seed=st.integers(0, 2**16),
)
def _gqa_attention_random(new, cached, kv_heads, group, dim, dtype, scale, large, seed):
    q = rand(new, kv_heads * group, dim, seed=seed, dtype=dtype, scale=2.0)
    k = rand(new + cached, kv_heads, dim, seed=seed + 1, dtype=dtype)
    v = rand(new + cached, kv_heads, dim, seed=seed + 2, dtype=dtype)
    if large:
        q, k = large_scores(q, k)
    scale = dim**-0.5 if scale is None else scale
    what = f"gqa_attention(q {describe(q)}, k/v {describe(k)}, scale={scale:g}" + (", large scores)" if large else ")")
    check_attention(q, k, v, scale, what)


# ---- SwiGLU -----------------------------------------------------------------------------------------
def silu_pitfalls(x: torch.Tensor) -> list[Pitfall]:
    gate, up = x.chunk(2, dim=-1)
    return [
        Pitfall(
            "applying silu to the second half",
            "the first half of x is the gate, silu(x[..., :I]) * x[..., I:]",
            lambda: F.silu(up) * gate,
        ),
        Pitfall("sigmoid(gate) * up", "silu(g) = g * sigmoid(g)", lambda: torch.sigmoid(gate) * up),
    ]


@points(4)
def test_silu_and_mul():
    """silu_and_mul(x) = silu(gate) * up on the fused [gate | up] layout."""
    for shape, dtype, tol in [
        ((3, 16), torch.float32, 1e-6),
        ((2, 5, 256), torch.float32, 1e-6),
        ((4, 64), torch.bfloat16, 2e-2),
    ]:
        x = rand(*shape, seed=12, dtype=dtype, scale=2.0)
        what = f"silu_and_mul(x {describe(x)})"
        check_tensor(
            keeping_inputs(lab.silu_and_mul, what, x=x),
            ref_silu_and_mul(x),
            what,
            atol=tol,
            rtol=tol,
            hint="silu(g) = g * sigmoid(g); the output has half the last dim of x",
            pitfalls=silu_pitfalls(x),
        )


# ---- the real engine with your components -----------------------------------------------------------
ENGINE_COMPONENTS = ("rms_norm", "rope_inv_freq", "apply_rotary", "gqa_attention", "silu_and_mul")


def _prompts(model, lengths: list[int], seed: int) -> list[list[int]]:
    vocab = ModelConfig.from_path(model).vocab_size
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def _swap_in(model, rounds, max_tokens: int = 8, **engine_args) -> None:
    with lab.lab01_components() as counts:
        try:
            got, _, _ = generate_rounds(model, rounds, max_tokens, **lab.ENGINE_ARGS, **engine_args)
        except (NotImplementedError, AssertionError):
            raise
        except Exception as e:
            raise AssertionError(
                f"the engine failed while running your functions: {type(e).__name__}: {e}\n"
                "usual cause: a function returns the wrong shape or dtype (see the unit tests above)"
            ) from e
    unused = [name for name in ENGINE_COMPONENTS if counts[name] == 0]
    assert not unused, f"the engine never called your {unused}: the autograder is out of date (tell the staff)"
    want, _, _ = generate_rounds(model, rounds, max_tokens, attention_backend="torch", **engine_args)
    flat_got, flat_want = [t for r in got for t in r], [t for r in want for t in r]
    diff = first_token_difference(flat_got, flat_want)
    assert diff is None, (
        f"with your functions the engine generated other greedy tokens than the reference engine: {diff}\n"
        "usually a unit test above fails too: fix those first"
    )


@points(7, timeout=180)
@engine
def test_engine_tiny_llama(tiny_llama):
    """The engine with your functions generates the reference tokens: tiny Llama with rope scaling,
    a cached prefix, chunked prefill and positions past the scaling's original context."""
    first = _prompts(tiny_llama, [5, 40, 300], seed=21)
    second = [first[1][:32] + p for p in _prompts(tiny_llama, [6, 9], seed=22)]  # hits the cached prefix
    _swap_in(tiny_llama, [first, second], max_prefill_length=128)


@points(6, timeout=180)
@engine
def test_engine_tiny_qwen3(tiny_qwen3):
    """The same on a tiny Qwen3 (RMSNorm of q and k per head, head_dim 32 != hidden / heads)."""
    first = _prompts(tiny_qwen3, [7, 33], seed=31)
    second = [first[1][:20] + p for p in _prompts(tiny_qwen3, [4], seed=32)]
    _swap_in(tiny_qwen3, [first, second])


@points(6, timeout=400)
@engine
def test_engine_embedded_model():
    """The same on the embedded SmolLM2-135M (30 layers, 9 heads sharing 3 KV heads)."""
    try:
        from minisgl.models.embedded import embedded_model_path

        embedded_model_path()
    except FileNotFoundError as e:
        pytest.fail(f"the embedded model is not installed, so this test cannot run: {e}")
    _swap_in(None, [["The capital of France is", "def fibonacci(n):"]], max_tokens=6)
