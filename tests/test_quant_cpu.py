"""Weight-only int8 / int4 on the CPU (``minisgl/quant/cpu_int.py``, ``kernels/csrc/quant_linear.h``):
GGUF's Q8_0 and Q4_1 blocks, the stated rounding and nibble order, the C++ kernels against the reference
de-quantizer on every instruction-set level this CPU runs, and the engine on the de-quantized weights'
float model (the exactness oracle)."""

from __future__ import annotations

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.engine.config import EngineConfig
from minisgl.kernels import jit
from minisgl.layers.linear import ColumnParallelLinear, RowParallelLinear
from minisgl.quant import QUANTIZATIONS
from minisgl.quant import cpu_int as ci

FORMATS = {"int8": ci.quantize_q8_0, "int4": ci.quantize_q4_1}


def test_q8_0_rounds_half_to_even_per_block():
    steps = torch.tensor([127, -127, 0, 2.5, 3.5, -2.5, 1.4, 126.6] + [1.0] * 24)  # multiples of d = 0.25
    w = torch.stack([torch.cat([steps * 0.25, torch.zeros(32)]), torch.cat([torch.zeros(32), -steps * 0.5])])
    qs, d = ci.quantize_q8_0(w)
    assert qs.dtype == torch.int8 and qs.shape == (2, 64) and d.dtype == torch.float16 and d.shape == (2, 2)
    assert d.float().tolist() == [[0.25, 0.0], [0.0, 0.5]]
    want = torch.tensor([127, -127, 0, 2, 4, -2, 1, 127] + [1] * 24, dtype=torch.int8)
    assert torch.equal(qs[0, :32], want) and torch.equal(qs[1, 32:], -want) and not qs[0, 32:].any()
    assert torch.equal(ci.dequantize(qs, d)[0, :32], want.float() * 0.25)


def test_q4_1_block_min_scale_and_gguf_nibble_order():
    q = torch.tensor(list(range(16)) + [15 - j for j in range(16)], dtype=torch.float32)
    w = -1 + 0.125 * q  # min -1, max 0.875: d = 1.875 / 15 = 0.125, m = -1, exact
    w2 = w.clone()
    w2[3] = -1 + 0.125 * 2.5  # a tie rounds to even: 2
    w2[20] = -1 + 0.125 * 10.5  # 10
    const = torch.full((32,), 0.75)  # max == min: d = 0, q = 0, m = the value
    qs, dm = ci.quantize_q4_1(torch.stack([torch.cat([w, w2]), torch.cat([const, w])]))
    assert qs.dtype == torch.uint8 and qs.shape == (2, 32) and dm.dtype == torch.float16 and dm.shape == (2, 2, 2)
    assert dm[0, 0].float().tolist() == [0.125, -1.0] and dm[1, 0].float().tolist() == [0.0, 0.75]
    assert qs[0, :16].tolist() == [j | (15 - j) << 4 for j in range(16)]  # byte j: element j low, j + 16 high
    assert qs[0, 16 + 3] & 15 == 2 and qs[0, 16 + 4] >> 4 == 10 and not qs[1, :16].any()
    back = ci.dequantize(qs, dm)
    assert torch.equal(back[0, :32], w) and torch.equal(back[1, :32], const) and torch.equal(back[1, 32:], w)


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantization_error_is_within_half_a_step(fmt):
    w = torch.randn(40, 256, generator=torch.Generator().manual_seed(0)) * 0.05
    qs, scales = FORMATS[fmt](w)
    d = scales.float().reshape(40, -1, 1 if fmt == "int8" else 2)[..., :1]
    err = (ci.dequantize(qs, scales) - w).reshape(40, -1, 32).abs()
    assert (err <= d * 0.5 + d * 1e-3 + 1e-6).all() and err.max() > 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_kernels_equal_the_reference_on_every_level(fmt, cpu_isa):
    """De-quantizing: the reference's float32 values bit for bit (and their bf16 rounding). The product,
    float32: small_linear's on the de-quantized weight bit for bit, within a float32 sum's bound of the
    float64 product, and a row's result the same whatever rows come with it; bfloat16 input: the product
    rounded once (past 8 rows: small_linear's on the bf16-rounded weight, bit for bit)."""
    g = torch.Generator().manual_seed(1)
    N, K = 37, 160
    qs, scales = FORMATS[fmt](torch.randn(N, K, generator=g))
    ref = ci.dequantize(qs, scales)
    lib = jit.cpu_module()
    for dtype in (torch.float32, torch.bfloat16):
        w = torch.empty(N, K, dtype=dtype)
        lib.dequantize(qs, scales, w, 2)
        assert torch.equal(w, ref.to(dtype))
    x = torch.randn(20, K, generator=g)
    exact = (x.double() @ ref.double().T).float()
    bound = 1e-6 * (x.abs() @ ref.abs().T) + 1e-6
    for m in (*range(1, 10), 13, 20):  # the streaming rows (<= 8), then the de-quantized tiles
        y, dense = torch.empty(m, N), torch.empty(m, N)
        lib.quant_linear(x[:m], qs, scales, y, 2)
        lib.small_linear(x[:m], ref, dense, 2)
        assert torch.equal(y, dense) and ((y - exact[:m]).abs() <= bound[:m]).all()
        one = torch.empty(1, N)
        lib.quant_linear(x[m - 1 : m], qs, scales, one, 1)
        assert torch.equal(y[m - 1], one[0])  # batch invariance
        yb = torch.empty(m, N, dtype=torch.bfloat16)
        xb = x[:m].bfloat16()
        lib.quant_linear(xb, qs, scales, yb, 2)
        want = (xb.double() @ ref.double().T).float()
        assert ((yb.float() - want).abs() <= (xb.float().abs() @ ref.abs().T) / 128 + 1e-5).all()
        if m > 8:  # the tiles multiply the bf16-rounded weight as small_linear does
            dense = torch.empty(m, N, dtype=torch.bfloat16)
            lib.small_linear(xb, ref.bfloat16(), dense, 2)
            assert torch.equal(yb, dense)


def _layer(kind, g) -> torch.nn.Module:
    layer = ColumnParallelLinear(96, [48, 16], bias=True) if kind == "column" else RowParallelLinear(96, 64)
    layer.weight.data.copy_(torch.randn(64, 96, generator=g))
    if layer.bias is not None:
        layer.bias.data.copy_(torch.randn(64, generator=g))
    return layer


@pytest.mark.parametrize("fmt", FORMATS)
def test_quant_linear_layer_few_and_many_rows_and_without_the_library(fmt, monkeypatch):
    """A layer's output is x times the de-quantized weight plus bias: through the kernel up to 64 rows,
    every row the same bits as alone (float32); through a de-quantized copy past them; in torch without
    the library."""
    g = torch.Generator().manual_seed(2)
    for kind in ("column", "row"):
        layer = ci.QuantLinear(_layer(kind, g), fmt)
        w = ci.dequantize(layer.qs, layer.scales)
        bias = layer.bias if layer.bias is not None else 0
        x = torch.randn(2, 30, 96, generator=g)
        want = x @ w.T + bias
        many = layer(x)
        assert many.shape == (2, 30, 64)
        torch.testing.assert_close(many, want, atol=1e-4, rtol=1e-5)
        alone = torch.cat([layer(x[:, i : i + 1]) for i in range(30)], 1)
        torch.testing.assert_close(alone, want, atol=1e-4, rtol=1e-5)
        assert torch.equal(alone, many)
        big = torch.randn(70, 96, generator=g)  # past 64 rows: the de-quantized copy and torch
        torch.testing.assert_close(layer(big), big @ w.T + bias, atol=1e-4, rtol=1e-5)
        monkeypatch.setattr(ci, "kernels", lambda: jit.CpuKernels("portable", None))
        torch.testing.assert_close(layer(x), want, atol=1e-4, rtol=1e-5)
        monkeypatch.undo()


def _generate(llm: LLM, prompts) -> list[list[int]]:
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    return [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


PROMPTS = [[5, 6, 7, 8, 9] * 6, [100] * 30, list(range(3, 60))]


@pytest.mark.parametrize("fmt", FORMATS)
def test_engine_tokens_equal_the_dequantized_float_model(fmt, tiny_model):
    """``quantization=int8|int4``: every column/row-parallel layer is quantized (embedding and LM head
    stay float32); greedy tokens equal those of the float model whose weights are the de-quantized ones,
    and a request's tokens do not depend on the batch it runs in."""
    llm = LLM(str(tiny_model), dtype="float32", quantization=fmt, num_pages=256)
    model = llm.scheduler.engine.model
    quant = {n: m for n, m in model.named_modules() if isinstance(m, ci.QuantLinear)}
    assert quant and not [m for m in model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    assert model.model.embed_tokens.weight.dtype == torch.float32 and model.lm_head.weight.dtype == torch.float32
    together = _generate(llm, PROMPTS)
    assert model.model._cpu_decode_args or jit.cpu_module() is None  # the C++ decode layer took the blocks
    alone = [_generate(llm, [p])[0] for p in PROMPTS]
    deq = {n: ci.dequantize(m.qs, m.scales) for n, m in quant.items()}
    llm.shutdown()
    ref = LLM(str(tiny_model), dtype="float32", num_pages=256)
    for name, m in ref.scheduler.engine.model.named_modules():
        if name in deq:
            m.weight.data.copy_(deq.pop(name))
    assert not deq
    want = _generate(ref, PROMPTS)
    ref.shutdown()
    assert together == alone == want and all(len(t) == 8 for t in want)


def test_int_formats_are_known_and_a_bad_name_is_refused():
    assert EngineConfig(quantization="int8").quantization == "int8"
    assert QUANTIZATIONS.get("int4") is ci.apply_int4
    with pytest.raises(ValueError, match="quantization must be fp8, int8, int4, auto or None, got 'int16'"):
        EngineConfig(quantization="int16")


def test_auto_keeps_the_embedded_gguf_blocks_as_they_are():
    """``quantization=auto`` on the embedded model: each linear layer holds the GGUF's own Q4_1 bytes and
    scales (q/k rows back in HF's order), and its greedy tokens equal the plain float32 engine's, whose
    weights are the same file de-quantized at conversion."""
    from gguf import GGUFReader

    from minisgl.models.embedded import gguf_path

    raw = {t.name: t.data for t in GGUFReader(str(gguf_path())).tensors}
    llm = LLM(None, dtype="float32", quantization="auto", num_pages=64)
    model = llm.scheduler.engine.model
    down = model.model.layers[3].mlp.down_proj
    file = torch.from_numpy(raw["blk.3.ffn_down.weight"].copy()).reshape(576, -1, 20)
    assert isinstance(down, ci.QuantLinear) and torch.equal(down.qs, file[..., 4:].reshape(576, -1))
    assert torch.equal(down.scales.view(torch.uint8).reshape(576, -1, 4), file[..., :4])
    assert sum(isinstance(m, ci.QuantLinear) for m in model.modules()) == 4 * len(model.model.layers)
    prompt = list(range(100, 130))
    got = _generate(llm, [prompt])
    llm.shutdown()
    ref = LLM(None, dtype="float32", num_pages=64)
    assert got == _generate(ref, [prompt])
    ref.shutdown()


def test_auto_refuses_weights_that_are_not_the_embedded_models(tiny_llama):
    with pytest.raises(ValueError, match="quantization auto: layer 0 qkv_proj is not the embedded model's"):
        LLM(str(tiny_llama), dtype="float32", quantization="auto", num_pages=64)
