"""The Triton kernels (``minisgl/kernels/triton_kernels.py``) against the torch code they replace.

On a GPU they run as compiled kernels; elsewhere under Triton's interpreter (``TRITON_INTERPRET=1``,
numpy on the CPU), which checks the same kernel code: indexing, masking, the hash, the two-pass
sampling, rounding points.
"""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are defined, i.e. on first import

from minisgl.engine import sample as sample_mod  # noqa: E402
from minisgl.engine.sample import SamplingInfo  # noqa: E402
from minisgl.kernels import triton_kernels  # noqa: E402
from minisgl.layers.norm import RMSNorm  # noqa: E402
from minisgl.layers.rotary import RotaryEmbedding, apply_rotary  # noqa: E402


def torch_sample(logits: torch.Tensor, info: SamplingInfo) -> torch.Tensor:
    """DefaultSampler's torch path (its Triton path turned off)."""
    saved = sample_mod.triton_ops
    sample_mod.triton_ops = lambda x: None
    try:
        return sample_mod.DefaultSampler().sample(logits, info)
    finally:
        sample_mod.triton_ops = saved


@pytest.mark.parametrize("chunk", [8192, 1024])  # rows in 1-2 or in 9-149 chunks
def test_sampler_draws_what_the_torch_sampler_draws(chunk):
    g = torch.Generator().manual_seed(0)
    b, v = (96, 151936) if DEVICE == "cuda" else (48, 9000)  # several blocks of 4096 and a ragged last one
    logits = (torch.randn(b, v, generator=g) * 4).to(DEVICE)
    temps = (torch.rand(b, generator=g) + 0.1).to(DEVICE)
    temps[::5] = 0.0  # greedy rows
    seeds = torch.randint(0, 2**62, (b,), generator=g).to(DEVICE)
    steps = torch.randint(0, 4096, (b,), generator=g).to(DEVICE)
    info = SamplingInfo(temps, torch.full((b,), v), torch.ones(b), seeds, steps, False, False, False)
    tokens = triton_kernels.sample(logits, temps, seeds, steps, chunk=chunk)
    assert tokens.dtype == torch.int64 and tokens.shape == (b,)
    assert torch.equal(tokens[::5], logits[::5].argmax(-1))
    # the same uniform and the same CDF: only summation order differs, which can move a draw
    # only when u lands within rounding of a CDF step
    agree = (tokens == torch_sample(logits, info)).float().mean().item()
    assert agree >= 0.98, f"only {agree:.1%} of draws match the torch sampler"
    alone = triton_kernels.sample(logits[7:8].clone(), temps[7:8], seeds[7:8], steps[7:8], chunk=chunk)
    assert alone.item() == tokens[7].item()  # a row's draw does not depend on the batch


def test_sampler_reads_bf16_logits_as_their_float32_values():
    """The engine hands the sampler bf16 logits (no float32 copy): the draws are those of the same
    values in float32, row for row, strided rows (a vocabulary slice) included."""
    g = torch.Generator().manual_seed(1)
    b, v = 32, 9000
    wide = (torch.randn(b, v + 24, generator=g) * 4).to(DEVICE, torch.bfloat16)
    logits = wide[:, :v]  # the LM head's slice of a padded vocabulary
    temps = (torch.rand(b, generator=g) + 0.1).to(DEVICE)
    temps[::4] = 0.0
    seeds = torch.randint(0, 2**62, (b,), generator=g).to(DEVICE)
    steps = torch.randint(0, 4096, (b,), generator=g).to(DEVICE)
    got = triton_kernels.sample(logits, temps, seeds, steps, chunk=1024)
    assert torch.equal(got, triton_kernels.sample(logits.float(), temps, seeds, steps, chunk=1024))
    info = SamplingInfo(temps, torch.full((b,), v), torch.ones(b), seeds, steps, False, False, False)
    assert torch.equal(torch_sample(logits, info), torch_sample(logits.float(), info))


def test_sampler_follows_the_distribution():
    """A 4-token distribution sampled with 1,000 (seed, step) pairs: frequencies match softmax(l/T)
    (ignoring T would be 0.12 away in total variation; this draw is 0.002 away)."""
    n = 1000
    row = torch.tensor([2.0, 1.0, 0.0, -1.0] + [-1e4] * 60)
    logits = row.repeat(n, 1).to(DEVICE)
    temps = torch.full((n,), 0.7, device=DEVICE)
    seeds = torch.arange(n, device=DEVICE) * 7919
    steps = torch.arange(n, device=DEVICE) % 13
    tokens = triton_kernels.sample(logits, temps, seeds, steps).cpu()
    freq = torch.bincount(tokens, minlength=64).float() / n
    expected = torch.softmax(row / 0.7, -1)
    assert freq[4:].sum() == 0  # tokens with probability 0 are never drawn
    assert 0.5 * (freq - expected).abs().sum() < 0.03


# an all -inf chunk computes -inf - (-inf) = nan on the way (masked out by tl.where); numpy warns of it
@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")
def test_sampler_combines_chunks():
    """Mass spread over chunks of 16 logits, one chunk all -inf (filtered) and one all negligible: the
    draws follow softmax(l/T) over the 5 live tokens, the greedy rows pick the max across chunks."""
    n = 800
    row = torch.full((64,), float("-inf"))
    row[16:20] = torch.tensor([2.0, 1.0, 0.0, -1.0])
    row[40] = 2.5
    row[48:] = -1e4
    logits = row.repeat(n, 1).to(DEVICE)
    temps = torch.full((n,), 0.7, device=DEVICE)
    temps[:10] = 0.0
    seeds = torch.arange(n, device=DEVICE) * 7919
    steps = torch.arange(n, device=DEVICE) % 13
    tokens = triton_kernels.sample(logits, temps, seeds, steps, chunk=16).cpu()
    assert (tokens[:10] == 40).all()
    freq = torch.bincount(tokens[10:], minlength=64).float() / (n - 10)
    expected = torch.softmax(row / 0.7, -1)
    assert freq[expected == 0].sum() == 0
    tv = 0.5 * (freq - expected).abs().sum()
    assert tv < 0.04, tv  # ignoring T would be 0.094 away


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("norm", [True, False])
def test_qk_norm_rope_matches_torch(dtype, norm):
    torch.manual_seed(0)
    h, kv, d, n = 16, 8, 128, 40  # 24 heads: a masked, padded head range
    qkv = (torch.randn(n, (h + 2 * kv) * d) * 3).to(DEVICE, dtype)
    pos = torch.randint(0, 4000, (n,)).to(DEVICE)
    rot = RotaryEmbedding(d, 4096, 1e6).to(DEVICE)
    qn, kn = RMSNorm(d).to(DEVICE, dtype), RMSNorm(d).to(DEVICE, dtype)
    qn.weight.data.uniform_(0.5, 1.5), kn.weight.data.uniform_(0.5, 1.5)
    q, k, _ = qkv.split([h * d, kv * d, kv * d], -1)
    q, k = q.reshape(n, h, d), k.reshape(n, kv, d)
    if norm:  # the unfused norm, in float32, rounded once like the fused kernel
        q, k = qn.impl(q.float(), qn.weight, qn.eps).to(dtype), kn.impl(k.float(), kn.weight, kn.eps).to(dtype)
    cos, sin = rot.cos_sin[pos].unsqueeze(1).chunk(2, dim=-1)
    ref_q, ref_k = apply_rotary(q.float(), cos, sin), apply_rotary(k.float(), cos, sin)
    weights = (qn.weight, kn.weight) if norm else (None, None)
    tq, tk, tv = triton_kernels.qk_norm_rope(qkv, pos, rot.cos_sin, h, kv, d, *weights, qn.eps)
    assert tq.shape == (n, h, d) and tk.shape == (n, kv, d) and tq.is_contiguous() and tk.is_contiguous()
    tol = 0.07 if dtype == torch.bfloat16 else 1e-4  # bf16: one rounding of values up to ~10
    assert (tq.float() - ref_q).abs().max() < tol
    assert (tk.float() - ref_k).abs().max() < tol
    assert torch.equal(tv, qkv[:, (h + kv) * d :].reshape(n, kv, d))  # V as the projection left it


@pytest.mark.parametrize("kv", [8, 3])  # 3 * 128: a row width that is not a power of two
def test_store_kv_writes_only_the_given_slots(kv):
    torch.manual_seed(0)
    d, n, slots = 128, 50, 400
    qkv = torch.randn(n, (4 + 2 * kv) * d).to(DEVICE, torch.bfloat16)
    k = qkv[:, 4 * d : (4 + kv) * d].reshape(n, kv, d).contiguous()
    v = qkv[:, (4 + kv) * d :].view(n, kv, d)  # rows strided inside qkv, as in the decoder
    k_slots = torch.zeros(slots, kv, d, dtype=torch.bfloat16, device=DEVICE)
    v_slots = torch.zeros_like(k_slots)
    loc = torch.randperm(slots)[:n].to(DEVICE)
    assert triton_kernels.can_fuse(d, k) and triton_kernels.can_fuse(d, v)
    triton_kernels.store_kv(k_slots, v_slots, loc, k, v)
    assert torch.equal(k_slots[loc], k) and torch.equal(v_slots[loc], v)
    untouched = torch.ones(slots, dtype=torch.bool, device=DEVICE)
    untouched[loc] = False
    assert not k_slots[untouched].any() and not v_slots[untouched].any()


def test_can_fuse_refuses_what_the_kernels_cannot_index():
    assert not triton_kernels.can_fuse(96)  # head_dim must be a power of two
    x = torch.zeros(4, 2, 256)[:, :, :128]  # heads not contiguous
    assert not triton_kernels.can_fuse(128, x)
