"""Lab 01 (the decoder's building blocks): unit tests against the engine's layers, then the real
engine with your functions swapped in. Run: ``python -m autograder lab01`` (or
``pytest autograder -k lab01 --impl labs`` to see pytest's own output)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from autograder.adapters import lab01 as lab
from autograder.checks import check_tensor, describe, first_token_difference
from autograder.engine_runs import generate_rounds
from autograder.points import engine, points
from minisgl.layers.activation import silu_and_mul as ref_silu_and_mul
from minisgl.layers.norm import RMSNorm
from minisgl.layers.rotary import RotaryEmbedding
from minisgl.layers.rotary import rope_inv_freq as ref_inv_freq
from minisgl.models.config import ModelConfig, RopeScaling

LLAMA31_SCALING = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192)


def rand(*shape, seed: int = 0, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


# ---- reference implementations (the engine's own layers) ---------------------------------------
def ref_rms_norm(x, weight, eps):
    norm = RMSNorm(x.shape[-1], eps).to(weight.dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
        return norm(x)


def rotary_cos_sin(head_dim: int, positions: torch.Tensor, dtype, base: float = 10000.0, scaling=None):
    """cos, sin ``[tokens, 1, head_dim // 2]`` exactly as the engine computes them."""
    table = RotaryEmbedding(head_dim, int(positions.max()) + 1, base, scaling).cos_sin
    cos, sin = table[positions].to(dtype).unsqueeze(1).chunk(2, dim=-1)
    return cos, sin


def ref_rotary(x, positions, base: float = 10000.0, scaling=None):
    rot = RotaryEmbedding(x.shape[-1], int(positions.max()) + 1, base, scaling)
    return rot(positions, x, x)[0]


def ref_attention(q, k, v, scale, causal: bool = True, grouped: bool = True):
    """Dense attention through torch SDPA (what the engine's torch backend runs). ``grouped=False``
    pairs heads the wrong way (``repeat`` instead of ``repeat_interleave``), for diagnostics."""
    t, s = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    if grouped:
        keys, values = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    else:
        keys, values = k.repeat(1, group, 1), v.repeat(1, group, 1)
    mask = torch.ones(t, s, dtype=torch.bool)
    if causal:
        mask = torch.arange(s)[None, :] <= torch.arange(s - t, s)[:, None]
    out = F.scaled_dot_product_attention(
        q.float().transpose(0, 1), keys.float().transpose(0, 1), values.float().transpose(0, 1), mask, scale=scale
    )
    return out.transpose(0, 1).to(q.dtype)


def _close(a: torch.Tensor, b: torch.Tensor, atol: float) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and bool((a.float() - b.float()).abs().max() <= atol)


# ---- RMSNorm ----------------------------------------------------------------------------------------
@points(6)
def test_rms_norm_fixed():
    """rms_norm matches the engine's RMSNorm, including rows so small that eps matters."""
    x = rand(4, 64, seed=1)
    x[1] *= 1e-4  # mean(x^2) ~ 1e-8, far below eps: without eps this row blows up
    x[2] *= 30.0
    weight = rand(64, seed=2).abs() + 0.5
    x_before = x.clone()
    got = lab.rms_norm(x, weight, 1e-6)
    want = ref_rms_norm(x, weight, 1e-6)
    assert torch.equal(x, x_before), "rms_norm changed its input x in place; return a new tensor"
    check_tensor(
        got[[0, 2, 3]],
        want[[0, 2, 3]],
        "rms_norm on ordinary rows",
        atol=1e-5,
        rtol=1e-5,
        hint="divide by sqrt(mean(x**2) + eps) over the last dim (mean, not sum; no mean subtraction)",
    )
    check_tensor(
        got[1],
        want[1],
        "rms_norm on a row of tiny values (1e-4)",
        atol=1e-5,
        rtol=1e-5,
        hint="eps goes inside the square root: rsqrt(mean(x**2) + eps); without it tiny rows are blown up",
    )
    x3 = rand(3, 4, 32, seed=3)  # Qwen3 normalises each head: [tokens, heads, head_dim]
    w3 = rand(32, seed=4)
    check_tensor(
        lab.rms_norm(x3, w3, 1e-6),
        ref_rms_norm(x3, w3, 1e-6),
        "rms_norm on [tokens, heads, head_dim]",
        atol=1e-5,
        rtol=1e-5,
        hint="normalise over the last dim only (dim=-1, keepdim=True)",
    )


@points(4)
def test_rms_norm_random():
    """rms_norm matches the engine on random shapes, in float32 and bfloat16."""
    lab.rms_norm(rand(2, 8), torch.ones(8), 1e-6)  # a stub fails here, before the random search
    _rms_norm_random()


@settings(max_examples=40)
@given(
    rows=st.integers(1, 6),
    dim=st.sampled_from([8, 64, 576]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    eps=st.sampled_from([1e-5, 1e-6]),
    seed=st.integers(0, 2**16),
)
def _rms_norm_random(rows, dim, dtype, eps, seed):
    x = rand(rows, dim, seed=seed, dtype=dtype, scale=3.0)
    weight = rand(dim, seed=seed + 1, dtype=dtype)
    want = ref_rms_norm(x, weight, eps)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    check_tensor(
        lab.rms_norm(x, weight, eps),
        want,
        f"rms_norm(x {describe(x)}, eps={eps})",
        atol=tol,
        rtol=tol,
        hint="in bfloat16, compute in float32 (x.float()), cast back to x.dtype, then multiply by weight",
    )


# ---- rotary -----------------------------------------------------------------------------------------
@points(8)
def test_rope_inv_freq_default():
    """rope_inv_freq without scaling: base ** (-2i / head_dim), float32, head_dim // 2 values."""
    for head_dim, base in [(64, 10000.0), (128, 1e6), (64, 100000.0), (16, 500.0)]:
        want = ref_inv_freq(head_dim, base)
        got = lab.rope_inv_freq(head_dim, base)
        check_tensor(
            got,
            want,
            f"rope_inv_freq(head_dim={head_dim}, base={base:g})",
            atol=0.0,
            rtol=1e-5,
            hint="inv_freq[i] = 1 / base ** (2i / head_dim) for i in range(head_dim // 2); use the base argument",
        )


@points(7)
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
        if _close(got, want, 0) or not isinstance(got, torch.Tensor) or got.shape != want.shape:
            check_tensor(got, want, what, atol=0.0, rtol=1e-5)
            continue
        plain = ref_inv_freq(head_dim, base)
        wavelen = 2 * math.pi / plain
        bad = ((got.double() - want.double()).abs() > 1e-5 * want.double().abs()).nonzero().flatten().tolist()
        if bad:
            i = bad[0]
            band = (
                "long (divide by factor)"
                if wavelen[i] > scaling.original_max_position / scaling.low_freq_factor
                else "short (unchanged)"
                if wavelen[i] < scaling.original_max_position / scaling.high_freq_factor
                else "middle (blend)"
            )
            unscaled = " — it is the unscaled value: is the scaling applied at all?" if _close(got, plain, 0) else ""
            raise AssertionError(
                f"{what}: frequency {i} (wavelength {wavelen[i]:.1f}, {band} band): expected {want[i]:.6g}, "
                f"got {got[i]:.6g}{unscaled}\n{len(bad)} of {len(want)} values wrong; check that band's formula "
                "in the docstring"
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
    want = ref_inv_freq(2 * half, base, scaling)
    check_tensor(
        lab.rope_inv_freq(2 * half, base, scaling),
        want,
        f"rope_inv_freq(head_dim={2 * half}, base={base:g}, scaling={scaling})",
        atol=1e-30,
        rtol=1e-5,
    )


@points(8)
def test_apply_rotary_fixed():
    """apply_rotary rotates pairs (x[i], x[i + head_dim/2]) by the given angles, like HF Llama."""
    positions = torch.tensor([0, 1, 2, 7, 100])
    x = rand(5, 4, 16, seed=5)
    cos, sin = rotary_cos_sin(16, positions, torch.float32)
    got = lab.apply_rotary(x, cos, sin)
    want = ref_rotary(x, positions)
    if isinstance(got, torch.Tensor) and got.shape == x.shape:
        assert torch.allclose(got[0], x[0], atol=1e-6), (
            "position 0 has angle 0, so its vector must come back unchanged; it did not"
        )
        odd = x.view(5, 4, 8, 2)
        interleaved = torch.stack(
            [odd[..., 0] * cos - odd[..., 1] * sin, odd[..., 1] * cos + odd[..., 0] * sin], dim=-1
        ).flatten(-2)
        assert not _close(got, interleaved, 1e-5), (
            "you rotated adjacent pairs (x[2i], x[2i+1]) (the GPT-J / Meta layout); HF Llama and Qwen3 "
            "weights use the 'rotate half' layout: pairs (x[i], x[i + head_dim // 2])"
        )
    check_tensor(
        got,
        want,
        "apply_rotary on [5 tokens, 4 heads, head_dim 16]",
        atol=1e-5,
        rtol=1e-5,
        hint="first half: x1*cos - x2*sin, second half: x2*cos + x1*sin (the sign of sin matters)",
    )


@points(3)
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
    cos, sin = rotary_cos_sin(2 * half, positions, dtype)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    check_tensor(
        lab.apply_rotary(x, cos, sin),
        ref_rotary(x, positions),
        f"apply_rotary(x {describe(x)})",
        atol=tol,
        rtol=tol,
        hint="compute in x's dtype with the cos/sin you are given",
    )


# ---- attention --------------------------------------------------------------------------------------
def _check_attention(q, k, v, scale, what):
    got = lab.gqa_attention(q, k, v, scale)
    want = ref_attention(q, k, v, scale)
    tol = 1e-5 if q.dtype == torch.float32 else 3e-2
    if isinstance(got, torch.Tensor) and got.shape == want.shape and not _close(got, want, tol):
        if _close(got, ref_attention(q, k, v, scale, causal=False), tol):
            raise AssertionError(
                f"{what}: your output equals attention *without* the causal mask; query t may only "
                f"see keys 0 .. S - T + t (here S={k.shape[0]}, T={q.shape[0]})"
            )
        if k.shape[1] < q.shape[1] and _close(got, ref_attention(q, k, v, scale, grouped=False), tol):
            raise AssertionError(
                f"{what}: query heads are paired with the wrong KV heads; with H={q.shape[1]} and "
                f"KV={k.shape[1]}, heads 0..{q.shape[1] // k.shape[1] - 1} share KV head 0 "
                "(repeat_interleave, not repeat)"
            )
        if q.shape[0] < k.shape[0] and _close(got[:, :, :], _shifted_mask_attention(q, k, v, scale), tol):
            raise AssertionError(
                f"{what}: the mask treats the queries as positions 0..T-1; they are the *last* T "
                f"positions (S - T .. S - 1) of the sequence — the first S - T keys are the cached prefix"
            )
    check_tensor(
        got,
        want,
        what,
        atol=tol,
        rtol=tol,
        hint="scores = q @ k^T * scale, masked with -inf, softmax over keys in float32, then @ v",
    )


def _shifted_mask_attention(q, k, v, scale):
    t, s = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    keys, values = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    mask = torch.arange(s)[None, :] <= torch.arange(t)[:, None]
    out = F.scaled_dot_product_attention(
        q.float().transpose(0, 1), keys.float().transpose(0, 1), values.float().transpose(0, 1), mask, scale=scale
    )
    return out.transpose(0, 1).to(q.dtype)


@points(8)
def test_gqa_attention_prefill():
    """Causal GQA over a whole prompt (T == S), 8 query heads sharing 2 KV heads."""
    q, k, v = rand(6, 8, 16, seed=6), rand(6, 2, 16, seed=7), rand(6, 2, 16, seed=8)
    _check_attention(q, k, v, 16**-0.5, "gqa_attention(q [6, 8, 16], k/v [6, 2, 16])")


@points(8)
def test_gqa_attention_cached_prefix():
    """Queries that are the last T positions: a prefill over a cached prefix, and a decode step."""
    q, k, v = rand(3, 4, 16, seed=9), rand(10, 2, 16, seed=10), rand(10, 2, 16, seed=11)
    _check_attention(q, k, v, 0.25, "gqa_attention with 7 cached keys + 3 new queries (q [3, 4, 16], k [10, 2, 16])")
    _check_attention(q[-1:], k, v, 0.25, "gqa_attention for one decode query over 10 keys")


@points(7)
def test_gqa_attention_random():
    """gqa_attention matches SDPA for random sequence lengths, head groupings and dtypes."""
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
    seed=st.integers(0, 2**16),
)
def _gqa_attention_random(new, cached, kv_heads, group, dim, dtype, seed):
    q = rand(new, kv_heads * group, dim, seed=seed, dtype=dtype)
    k = rand(new + cached, kv_heads, dim, seed=seed + 1, dtype=dtype)
    v = rand(new + cached, kv_heads, dim, seed=seed + 2, dtype=dtype)
    _check_attention(q, k, v, dim**-0.5, f"gqa_attention(q {describe(q)}, k/v {describe(k)})")


# ---- SwiGLU -----------------------------------------------------------------------------------------
@points(3)
def test_silu_and_mul():
    """silu_and_mul(x) = silu(gate) * up on the fused [gate | up] layout."""
    for shape, dtype, tol in [
        ((3, 16), torch.float32, 1e-6),
        ((2, 5, 256), torch.float32, 1e-6),
        ((4, 64), torch.bfloat16, 2e-2),
    ]:
        x = rand(*shape, seed=12, dtype=dtype, scale=2.0)
        got, want = lab.silu_and_mul(x), ref_silu_and_mul(x)
        if isinstance(got, torch.Tensor) and got.shape == want.shape and not _close(got, want, tol):
            gate, up = x.chunk(2, dim=-1)
            assert not _close(got, F.silu(up) * gate, tol), (
                "you applied silu to the second half; the first half of x is the gate: silu(x[..., :I]) * x[..., I:]"
            )
        check_tensor(
            got,
            want,
            f"silu_and_mul(x {describe(x)})",
            atol=tol,
            rtol=tol,
            hint="silu(g) = g * sigmoid(g); the output has half the last dim of x",
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


@points(9, timeout=180)
@engine
def test_engine_tiny_llama(tiny_llama):
    """The engine with your functions generates the reference tokens: tiny Llama with rope scaling,
    a cached prefix, chunked prefill and positions past the scaling's original context."""
    first = _prompts(tiny_llama, [5, 40, 300], seed=21)
    second = [first[1][:32] + p for p in _prompts(tiny_llama, [6, 9], seed=22)]  # hits the cached prefix
    _swap_in(tiny_llama, [first, second], max_prefill_length=128)


@points(8, timeout=180)
@engine
def test_engine_tiny_qwen3(tiny_qwen3):
    """The same on a tiny Qwen3 (RMSNorm of q and k per head, head_dim 32 != hidden / heads)."""
    first = _prompts(tiny_qwen3, [7, 33], seed=31)
    second = [first[1][:20] + p for p in _prompts(tiny_qwen3, [4], seed=32)]
    _swap_in(tiny_qwen3, [first, second])


@points(8, timeout=400)
@engine
def test_engine_embedded_model():
    """The same on the embedded SmolLM2-135M (30 layers, 9 heads sharing 3 KV heads)."""
    try:
        from minisgl.models.embedded import embedded_model_path

        embedded_model_path()
    except FileNotFoundError as e:
        pytest.fail(f"the embedded model is not installed, so this test cannot run: {e}")
    _swap_in(None, [["The capital of France is", "def fibonacci(n):"]], max_tokens=6)
