"""The FP8 layers' Triton kernels (``minisgl/quant/fp8_kernels.py``) and the fused activations between
FP8 layers (``minisgl/quant/fp8.py``) against the torch code they replace.

On a GPU the kernels run compiled; elsewhere under Triton's interpreter. The interpreter's float32 ->
FP8 conversion drops the carry of a rounding into the exponent (125.8 becomes 64, not 128) and its
float32 -> bf16 conversion truncates, where the GPU's conversions round to nearest even like torch's;
on the CPU these tests therefore hand the interpreter torch's conversions, so what they check is the
kernels' own code: indexing, masking, scales, where they round.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are defined, i.e. on first import

from minisgl.models.config import ModelConfig  # noqa: E402
from minisgl.models.decoder import DecoderLayer  # noqa: E402
from minisgl.quant import fp8  # noqa: E402
from minisgl.quant import fp8_kernels as fp8_quant  # noqa: E402
from minisgl.quant.fp8 import FP8Linear, Unscaled, fp8_rows  # noqa: E402

FP8 = torch.float8_e4m3fn
TORCH_OF = {(8, 3): FP8, (16, 7): torch.bfloat16, (16, 10): torch.float16}


@pytest.fixture(autouse=True)
def rounding_conversions(monkeypatch):
    """Under the interpreter: float32 -> FP8 / bf16 / fp16 through torch (rounds as the GPU does)."""
    if DEVICE == "cuda":
        return
    from triton.runtime import interpreter

    original = interpreter._convert_float

    def convert(data, src, dst, rounding_mode):
        to = TORCH_OF.get((dst.primitive_bitwidth, dst.fp_mantissa_width))
        if src.primitive_bitwidth != 32 or src.fp_mantissa_width != 23 or to is None:
            return original(data, src, dst, rounding_mode)
        x = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32)).to(to)
        return x.view(torch.uint8).numpy() if to == FP8 else x.view(torch.int16).numpy().view(np.uint16)

    monkeypatch.setattr(interpreter, "_convert_float", convert)


def close_to_fp8_of(q: torch.Tensor, scale: torch.Tensor, want: torch.Tensor) -> None:
    """``(q, scale)`` is ``fp8_rows(want)`` up to the last bit: the kernels compute ``want`` with float32
    sums in another order, which may move a value by an ulp of the model's dtype and so, rarely, the
    FP8 byte it rounds to. The scale is each row's largest magnitude / 448 (within that ulp); every
    value is within FP8's rounding (1/16 of it, or half the subnormal step) plus that ulp."""
    wq, ws = fp8_rows(want)
    assert q.dtype == FP8 and q.shape == want.shape and scale.shape == (want.shape[0], 1)
    torch.testing.assert_close(scale, ws, rtol=2**-7, atol=0)
    w = want.float()
    assert ((q.float() * scale - w).abs() <= w.abs() * (2**-4 + 2**-7) + scale * 2**-10).all()
    assert (q.view(torch.uint8) == wq.view(torch.uint8)).float().mean() >= 0.98


def reference_norm(x, weight, eps, residual, unscaled: Unscaled | None):
    """What the unfused path computes: the scales applied and rounded, the residual added (rounded into
    the residual; the norm reads the float32 sum), RMSNorm with the weight in float32, rounded."""
    if unscaled is not None:
        x = unscaled.materialize()
    h = x.float() + (residual.float() if residual is not None else 0)
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype), h.to(x.dtype)


def random_unscaled(m: int, n: int, dtype: torch.dtype, g: torch.Generator) -> Unscaled:
    """An FP8 GEMM's output: products of |q| <= 448 values (bf16 for a bf16 model, as FP8Linear leaves
    them, else float32), row and column scales."""
    acc = (torch.randn(m, n, generator=g) * 3000).to(DEVICE, torch.bfloat16 if dtype == torch.bfloat16 else None)
    row = (torch.rand(m, 1, generator=g) * 0.02 + 1e-3).to(DEVICE)
    col = (torch.rand(1, n, generator=g) * 2e-3 + 1e-4).to(DEVICE)
    return Unscaled(acc, row, col, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("source", ["tensor", "unscaled"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("quantize", [False, True])
def test_norm_kernel_matches_torch(dtype, source, residual, quantize):
    """One kernel: the input's scales (an FP8 GEMM's output), the residual add, RMSNorm and the next
    layer's quantization, each only when asked; widths below, at and off a power of two; 1 and 37 rows."""
    g = torch.Generator().manual_seed(0)
    for n in (64, 1000, 1024) + ((5120,) if DEVICE == "cuda" else ()):
        for m in (1, 37):
            weight = (torch.rand(n, generator=g) + 0.5).to(DEVICE, dtype)
            u = random_unscaled(m, n, dtype, g) if source == "unscaled" else None
            x = u.acc if u is not None else torch.randn(m, n, generator=g).to(DEVICE, dtype)
            res = torch.randn(m, n, generator=g).to(DEVICE, dtype) if residual else None
            want, want_res = reference_norm(x, weight, 1e-6, res, u)
            scales = (u.row_scale, u.col_scale, dtype) if u is not None else (None, None, None)
            got = fp8_quant.rms_norm(x, weight, 1e-6, res, *scales, quantize=quantize)
            if residual:  # elementwise float32 sums: exactly the reference's
                assert torch.equal(res, want_res)
            if quantize:
                close_to_fp8_of(*got, want)
            else:
                assert got.dtype == dtype and got.shape == (m, n)
                torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("source", ["tensor", "unscaled"])
def test_swiglu_quant_kernel_matches_torch(source, dtype):
    """SwiGLU quantized for ``down``: up to 4,096 columns one program a row (the row held whole),
    wider rows in chunks of 1,024 (two kernels): widths inside one block, at it and across it, the
    row's largest value in its last chunk (the row's scale must cover every chunk)."""
    g = torch.Generator().manual_seed(1)
    for i in (3, 1000, 4096, 5000):
        u = random_unscaled(3, 2 * i, dtype, g) if source == "unscaled" else None
        x = u.acc if u is not None else torch.randn(3, 2 * i, generator=g).to(DEVICE, dtype)
        if i == 5000:
            x[1, i + 4500] = 60.0 if u is None else 1e7  # the largest value of row 1 in the second block
        gate, up = (u.materialize() if u is not None else x).float().chunk(2, dim=-1)
        want = (F.silu(gate) * up).to(dtype)
        scales = (u.row_scale, u.col_scale, dtype) if u is not None else ()
        close_to_fp8_of(*fp8_quant.silu_and_mul_quant(x, *scales), want)


def test_rescale_and_quant_rows_match_torch():
    g = torch.Generator().manual_seed(2)
    u = random_unscaled(5, 300, torch.bfloat16, g)
    want = (u.acc * u.row_scale * u.col_scale).to(u.dtype)
    assert torch.equal(fp8_quant.rescale(u.acc, u.row_scale, u.col_scale, u.dtype), want)
    x = torch.randn(4, 5000, generator=g).to(DEVICE, torch.bfloat16) * 3
    q, s = fp8_quant.quant_rows(x)
    wq, ws = fp8_rows(x)
    assert torch.equal(s, ws) and torch.equal(q.view(torch.uint8), wq.view(torch.uint8))


@pytest.mark.parametrize("norm", [True, False])
def test_qk_norm_rope_applies_an_fp8_layers_scales(norm):
    """The q/k norm + rope kernel reading the qkv GEMM's float32 product before its scales gives what it
    gives on the scaled, rounded product, and V (scaled into a tensor of its own) is that product's V."""
    from minisgl.kernels import triton_kernels
    from minisgl.layers import RotaryEmbedding

    g = torch.Generator().manual_seed(4)
    h, kv, d, n = 6, 3, 64, 7  # 9 heads: masked head ranges for q/k and for V
    u = random_unscaled(n, (h + 2 * kv) * d, torch.bfloat16, g)
    pos = torch.randint(0, 100, (n,), generator=g).to(DEVICE)
    rot = RotaryEmbedding(d, 128, 1e4).to(DEVICE)
    w = tuple((torch.rand(d, generator=g) + 0.5).to(DEVICE, torch.bfloat16) for _ in range(2)) if norm else (None, None)
    q, k, v = triton_kernels.qk_norm_rope(
        u.acc, pos, rot.cos_sin, h, kv, d, *w, 1e-6, u.row_scale, u.col_scale, u.dtype
    )
    qkv = u.materialize()
    want_q, want_k, _ = triton_kernels.qk_norm_rope(qkv, pos, rot.cos_sin, h, kv, d, *w, 1e-6)
    assert q.dtype == k.dtype == v.dtype == torch.bfloat16 and v.shape == (n, kv, d) and v.is_contiguous()
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    assert torch.equal(v, qkv[:, (h + kv) * d :].reshape(n, kv, d))


def test_fused_decoder_layer_equals_the_unfused_one(monkeypatch):
    """One FP8 decoder layer in float32 (no rounding to tell the paths apart), with its neighbours' fused
    kernels (``fuse_neighbours``' modules: the norms quantize, SwiGLU quantizes, o_proj / gate_up / down
    leave their scales to the next kernel) and without: the same hidden state and residual. The fused run really
    handed over ``QuantRows`` and ``Unscaled`` (counted), and a consumer left with an ``Unscaled`` that
    cannot fuse (a swapped-in activation) materializes it."""
    if DEVICE == "cpu":  # cuBLASLt's role on the CPU: torch's _scaled_mm, and the kernels interpreted
        from minisgl.kernels import triton_kernels
        from minisgl.layers import rotary

        monkeypatch.setattr(fp8, "kernels", lambda x: fp8_quant)
        monkeypatch.setattr(rotary, "triton_ops", lambda x: triton_kernels)
    cfg = ModelConfig(
        model_type="qwen3", vocab_size=100, hidden_size=64, intermediate_size=96, num_layers=1, num_heads=4,
        num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, max_position=64,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(3)
    from minisgl.layers import LayerImpls, RotaryEmbedding

    with torch.device(DEVICE):
        rotary = RotaryEmbedding(16, 64, 10000.0)
        block = DecoderLayer(cfg, 0, rotary, LayerImpls())
        for p in block.parameters():
            p.data.normal_(0, 0.2)
    seen = []
    original = FP8Linear.product

    def counting(self, x):
        y = original(self, x)
        seen.append((type(x).__name__, type(y).__name__))
        return y

    monkeypatch.setattr(FP8Linear, "product", counting)
    fp8.quantize_linears(block)
    for m in block.modules():
        if isinstance(m, FP8Linear):
            m.scaled_mm = True
    x = torch.randn(5, 64, device=DEVICE)
    res = torch.randn(5, 64, device=DEVICE)
    block.self_attn.attn.forward = lambda q, k, v: q  # attention itself is not this test's subject
    pos = torch.arange(5, device=DEVICE)
    plain = block(pos, x.clone(), res.clone())
    # the layer as fuse_neighbours leaves it (it walks a whole model: here one layer, by hand)
    for norm in (block.input_layernorm, block.post_attention_layernorm):
        norm.__class__, norm.quantize = fp8.FP8RMSNorm, True
    block.mlp.__class__, block.self_attn.__class__ = fp8.FP8DecoderMLP, fp8.FP8DecoderAttention
    for lin in (block.self_attn.qkv_proj, block.self_attn.o_proj, block.mlp.gate_up_proj, block.mlp.down_proj):
        lin.defer = True
    seen.clear()
    fused = block(pos, x.clone(), res.clone())
    # qkv, o_proj, gate_up, down
    assert seen == [("QuantRows", "Unscaled"), ("Tensor", "Unscaled")] + [("QuantRows", "Unscaled")] * 2
    assert isinstance(fused[0], Unscaled)
    torch.testing.assert_close(fused[0].materialize(), plain[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused[1], plain[1], rtol=1e-5, atol=1e-5)
    block.mlp.act = lambda x: F.silu(x.chunk(2, -1)[0]) * x.chunk(2, -1)[1]  # a swapped-in activation does not
    # fuse: it gets gate_up's product materialized, and down_proj a tensor
    seen.clear()
    again = block(pos, x.clone(), res.clone())
    assert seen[2:] == [("QuantRows", "Unscaled"), ("Tensor", "Unscaled")]
    torch.testing.assert_close(again[0].materialize(), plain[0], rtol=1e-5, atol=1e-5)
