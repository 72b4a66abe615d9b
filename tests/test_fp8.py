"""FP8 on the CPU. The KV cache (``--kv-cache-dtype fp8_e4m3``): what the pool stores, that attention
reads it back, memory accounting. The weights (``--quantization fp8``): the per-row quantization's
error bound, which layers are quantized, the engine running on them. Bad values refused. The GPU paths
(FlashInfer reading FP8 pages, ``torch._scaled_mm``) are in test_gpu.py; the quality on real weights is
measured by ``python -m minisgl.benchmark.quality`` (docs/fp8.md)."""

from __future__ import annotations

import re

import pytest
import torch
from greedy_compare import LogitRecorder

from minisgl import LLM, SamplingParams
from minisgl.engine.config import EngineConfig
from minisgl.kvcache import KVPool
from minisgl.kvcache.pool import head_scales
from minisgl.layers.linear import ColumnParallelLinear, RowParallelLinear
from minisgl.quant.fp8 import FP8Linear, fp8_rows, quantize_linears
from minisgl.quant.kv_calibrate import calibration_ids

FP8 = torch.float8_e4m3fn
PROMPTS = [[5, 6, 7, 8, 9] * 6, [100] * 30, list(range(3, 60))]


def test_the_pool_stores_fp8_clamped_to_its_range():
    """A cast of a value past +-448 gives NaN: the pool clamps first; the slots not written stay 0."""
    pool = KVPool(2, 4, 2, 2, 4, FP8, torch.device("cpu"), compute_dtype=torch.bfloat16)
    assert pool.quantized and pool.compute_dtype == torch.bfloat16 and pool.buffer.dtype == FP8
    k = torch.tensor([[0.1234, -3.3, 1000.0, -1e4], [2.0, 447.0, 449.0, -0.001]]).repeat(3, 1, 1)[:, :2]
    k = k.to(torch.bfloat16)  # [3 tokens, 2 heads, 4]
    v = -k
    loc = torch.tensor([1, 4, 6])
    pool.store(1, loc, k, v)
    got_k, got_v = pool.k_slots(1)[loc].float(), pool.v_slots(1)[loc].float()
    assert not got_k.isnan().any() and got_k.max() == 448 and got_k.min() == -448
    assert torch.equal(got_k, k.float().clamp(-448, 448).to(FP8).float())
    assert torch.equal(got_v, -got_k)
    assert (got_k[0, 0, 0] - 0.1234).abs() < 0.1234 / 8  # 3 mantissa bits: within 1/16 relative, rounded
    untouched = torch.ones(pool.num_slots + pool.page_size, dtype=torch.bool)
    untouched[loc] = False
    assert not pool.k_slots(1)[untouched].float().any() and not pool.buffer[0].float().any()


def test_fp8_halves_the_bytes_per_token_and_doubles_the_default_pool(tiny_qwen3):
    bf16 = KVPool.bytes_per_token(4, 2, 64, torch.bfloat16)
    assert KVPool.bytes_per_token(4, 2, 64, FP8) * 2 == bf16
    sizes = {}
    for kv in ("auto", "fp8_e4m3"):
        llm = LLM(str(tiny_qwen3), dtype="bfloat16", kv_cache_dtype=kv, max_seq_len=512)
        sizes[kv] = llm.scheduler.engine.kv_pool.num_slots
        # the tokenizer is read once: by the engine for an FP8 pool's calibration text, then shared
        engine_tok = llm.scheduler.engine.tokenizer
        assert llm.tokenizer is not None and (engine_tok is llm.tokenizer if kv != "auto" else engine_tok is None)
        llm.shutdown()
    # the CPU default is 1 GiB of KV capped at 64k tokens: the tiny model reaches the cap either way
    assert sizes["fp8_e4m3"] >= sizes["auto"]


def _fp8_round(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` ([n, heads, dim]) stored in FP8 with per-head ``scale`` and read back."""
    s = scale[:, None].to(x.dtype)
    return ((x / s).clamp(-448, 448).to(FP8).to(x.dtype)) * s


def _run(path, simulate_fp8: tuple[torch.Tensor, torch.Tensor] | None = None, **kw):
    """Tokens, recorded logits and the pool of two waves: chunked prefills, then prefix hits.
    ``simulate_fp8``: per-layer, per-head (K, V) scales of a float32 pool whose stores round through
    FP8 with them (the oracle)."""
    llm = LLM(str(path), dtype="float32", num_pages=1024, max_prefill_length=16, **kw)
    pool = llm.scheduler.engine.kv_pool
    if simulate_fp8 is not None:
        store, (ks, vs) = pool.store, simulate_fp8
        pool.store = lambda layer, loc, k, v: store(layer, loc, _fp8_round(k, ks[layer]), _fp8_round(v, vs[layer]))
        # the pool no longer holds exactly what a pass computes, as an FP8 pool does not: attention must
        # read it back (a fresh prompt's prefill would otherwise attend over its unrounded K/V)
        pool.quantized = True
        llm.scheduler.engine.model.model._cpu_decode_args = []  # the C++ decode layer stores past this hook
    rec = LogitRecorder(llm.scheduler.engine)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    first = llm.generate(PROMPTS, params, use_tqdm=False)  # chunked prefills (16-token chunks)
    again = llm.generate([p + [11, 12] for p in PROMPTS], params, use_tqdm=False)  # prefix hits
    llm.scheduler.check_memory()
    llm.shutdown()
    return [o.token_ids for o in first + again], rec, pool


def _max_diff(a: LogitRecorder, b: LogitRecorder) -> float:
    rows = [(x, y) for p in PROMPTS + [p + [11, 12] for p in PROMPTS] for x, y in zip(a.of(p, 8), b.of(p, 8))]
    assert len(rows) == 48
    return max(float((x - y).abs().max()) for x, y in rows)


def test_attention_reads_the_fp8_cache(tiny_model):
    """Prefill (chunked, and after prefix hits) and decode read K/V back from the FP8 pool, with its
    per-head scales: every logit equals that of a float32 pool whose stores round through FP8 with
    the same scales (to float32 precision), and differs from the unrounded cache's."""
    tokens, got, pool = _run(tiny_model, kv_cache_dtype="fp8_e4m3")
    assert pool.dtype == FP8 and pool.compute_dtype == torch.float32
    assert (pool.k_scale != 1).any() and (pool.v_scale != 1).any(), "the test needs scales other than 1"
    sim_tokens, sim, sim_pool = _run(tiny_model, simulate_fp8=(pool.k_scale, pool.v_scale))
    assert sim_pool.dtype == torch.float32
    _, plain, _ = _run(tiny_model)
    assert tokens == sim_tokens
    assert _max_diff(got, sim) < 1e-4
    assert _max_diff(got, plain) > 1e-2  # the rounding is real: it moves these O(1) logits


def test_head_scales_are_the_smallest_powers_of_two_that_fit():
    """448 * 2^k fits 2^k exactly; a hair more needs 2^(k+1); an all-zero head keeps 1; each head alone."""
    x = torch.zeros(3, 5, 4)
    x[1, 0, 2] = 448 * 2.0**-7  # exactly at the boundary
    x[0, 1, 3] = -(448 * 2.0**-7) * (1 + 2**-6)  # just past it (and still past it in bfloat16)
    x[2, 2, 0] = 3.0  # 3 / 448 in (2^-8, 2^-7]
    x[:, 4] = 1e4  # larger than the range: a scale above 1
    s = head_scales(x, FP8)
    assert s.tolist() == [2.0**-7, 2.0**-6, 2.0**-7, 1.0, 2.0**5]
    assert s.dtype == torch.float32 and torch.equal(head_scales(x.bfloat16(), FP8), s)


def test_calibration_puts_each_heads_largest_value_just_under_448(tiny_qwen3):
    """At load, an FP8 pool's scales come from one prefill of a text: per layer and KV head, the largest
    |value| stored by that pass (still in the pool's first pages) is in (224, 448], as the smallest
    power of two that fits gives; the pass returns its request-table row."""
    llm = LLM(str(tiny_qwen3), dtype="bfloat16", kv_cache_dtype="fp8_e4m3", max_seq_len=512)
    pool = llm.scheduler.engine.kv_pool
    n = len(calibration_ids(None, llm.scheduler.engine.model_config.vocab_size, 512))  # no tokenizer here
    for scales, slots in ((pool.k_scale, pool.k_slots), (pool.v_scale, pool.v_slots)):
        assert torch.equal(scales, torch.exp2(scales.log2().round())), "scales must be powers of two"
        assert (scales != 1).all(), scales  # this model's K/V are far from FP8's range
        for layer in range(pool.num_layers):
            top = slots(layer)[:n].float().abs().amax(dim=(0, 2))
            assert ((top > 224) & (top <= 448)).all(), (layer, top, scales[layer])
    assert not pool.calibrating and llm.scheduler.engine.table.num_free_rows == llm.scheduler.engine.max_running
    assert llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, ignore_eos=True))[0].token_ids
    llm.shutdown()


def test_a_pool_smaller_than_the_calibration_text_calibrates_on_what_fits(tiny_qwen3, caplog):
    """Two 16-token pages hold 32 of the calibration text's ~190 tokens: the engine starts, its scales come from
    those 32 (the largest stored value of each head in [224, 448]: just over 224 rounds to 224 in FP8), and
    it says so."""
    with caplog.at_level("WARNING", logger="minisgl.quant.kv_calibrate"):
        llm = LLM(str(tiny_qwen3), dtype="bfloat16", kv_cache_dtype="fp8_e4m3", num_pages=2, page_size=16)
    said = re.search(r"the KV pool holds 32 of the (\d+) calibration tokens: calibrating on those", caplog.text)
    assert said and int(said.group(1)) > 100
    pool = llm.scheduler.engine.kv_pool
    for scales, slots in ((pool.k_scale, pool.k_slots), (pool.v_scale, pool.v_slots)):
        top = slots(0)[:32].float().abs().amax(dim=(0, 2))
        assert (scales != 1).all() and ((top >= 224) & (top <= 448)).all(), (top, scales[0])
    assert llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, ignore_eos=True))[0].token_ids
    llm.shutdown()


@pytest.mark.parametrize("magnitude", [1e-3, 30.0, 3e3])
def test_per_head_scales_keep_fp8_relative_error_at_any_magnitude(magnitude):
    """Values stored with their head's scale come back within FP8's rounding (half a step of 3 mantissa
    bits: 1/16 relative) whether they are tiny (subnormal at a scale of 1: most bits lost), ordinary or
    past 448 (saturated at a scale of 1); through the pool's store and the query/output scaling."""
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(64, 4, 8, generator=gen) * magnitude * torch.tensor([1.0, 0.1, 10.0, 0.5])[:, None]
    pool = KVPool(1, 8, 16, 4, 8, FP8, torch.device("cpu"), compute_dtype=torch.float32)
    pool.set_scales(0, head_scales(k, FP8), head_scales(k, FP8))
    loc = torch.arange(64)
    pool.store(0, loc, k, k)
    scale = pool.k_scale[0][:, None]
    back = pool.k_slots(0)[loc].float() * scale
    rel = ((back - k).abs() / k.abs()).max()
    assert rel <= 1 / 16, rel
    unscaled = pool.quantize(k, torch.ones(4)).float()
    worst = ((unscaled - k).abs() / k.abs()).max()
    if magnitude != 30.0:
        assert worst > 0.25, worst  # what a scale of 1 did to these values
    # attention never dequantizes: the queries of a KV head's group carry its K scale, the output its V scale
    q = torch.randn(5, 8, 8, generator=gen)  # 8 query heads over 4 KV heads: groups of 2
    qs = pool.scale_queries(0, q)
    assert torch.equal(qs, q * scale.repeat_interleave(2, 0)[None])
    out = torch.randn(5, 8 * 8, generator=gen)
    assert torch.equal(pool.scale_output(0, out).view(5, 8, 8), out.view(5, 8, 8) * scale.repeat_interleave(2, 0)[None])


def test_unknown_kv_cache_dtype_is_refused():
    with pytest.raises(ValueError, match="kv_cache_dtype must be auto or fp8_e4m3, got 'int4'"):
        EngineConfig(kv_cache_dtype="int4")


# ---- FP8 weights --------------------------------------------------------------------------------


def test_fp8_rows_error_is_bounded_per_row():
    """One scale per row: rows a million times apart in magnitude keep the same relative precision (3
    mantissa bits: half an ulp is 1/16 of a value) down to the format's subnormal step; a zero row
    stays zero."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 256, generator=g) * torch.tensor([1e-3, 1e-1, 1.0, 10.0, 1e3, 0.0])[:, None]
    q, scale = fp8_rows(x)
    assert q.dtype == FP8 and scale.shape == (6, 1) and not q.float().isnan().any()
    back = q.float() * scale
    bound = x.abs() / 16 + scale * 2.0**-10  # e4m3's subnormal step is 2^-9 (times the row's scale)
    assert ((back - x).abs() <= bound + 1e-12).all()
    assert (back[:5].abs().amax(1) / x[:5].abs().amax(1) - 1).abs().max() < 1e-6  # each row's max is exact
    assert not back[5].any()


def test_fp8_weights_quantize_the_linear_layers_only(tiny_qwen3):
    llm = LLM(str(tiny_qwen3), dtype="float32", quantization="fp8", num_pages=256)
    model = llm.scheduler.engine.model
    linear = [m for m in model.modules() if isinstance(m, FP8Linear)]
    assert linear and all(m.weight.dtype == FP8 and m.weight_scale.shape == (1, m.weight.shape[0]) for m in linear)
    assert not [m for m in model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    assert model.model.embed_tokens.weight.dtype == torch.float32 and model.lm_head.weight.dtype == torch.float32
    (out,) = llm.generate([list(range(3, 40))], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(out.token_ids) == 4
    llm.shutdown()


def test_an_fp8_layer_computes_w8a8():
    """A quantized layer's output is the product of the per-row-rounded input and weight (rows of
    both scaled so their largest magnitude is 448), bias added after."""
    g = torch.Generator().manual_seed(1)
    layer = ColumnParallelLinear(64, [48], bias=True)
    w, b = torch.randn(48, 64, generator=g), torch.randn(48, generator=g)
    layer.weight.data.copy_(w), layer.bias.data.copy_(b)
    x = torch.randn(2, 5, 64, generator=g) * 3
    full = layer(x)
    model = torch.nn.Sequential(layer)
    assert quantize_linears(model) == 1 and model[0].weight.dtype == FP8
    layer = model[0]

    def rounded(t):  # per row: scale to 448, round to e4m3, scale back
        s = t.abs().amax(-1, keepdim=True) / 448
        return (t / s).to(FP8).float() * s

    want = rounded(x.reshape(10, 64)) @ rounded(w).T + b
    got = layer(x)
    assert got.shape == (2, 5, 48)
    torch.testing.assert_close(got.reshape(10, 48), want, atol=1e-5, rtol=1e-5)
    assert (got - full).abs().max() > 1e-2  # and it is not the unrounded product


def test_fp8_weights_move_the_logits_boundedly(tiny_model):
    """The whole engine on W8A8 layers: the first logits of every request move (rounding in every
    layer) but stay near float32's: 0.19 of the largest logit at most on these random models, whose
    errors compound over layers with no trained structure to absorb them."""
    _, ref, _ = _run(tiny_model)
    _, got, _ = _run(tiny_model, quantization="fp8")
    rows = [(x, y) for p in PROMPTS for x, y in zip(got.of(p, 1), ref.of(p, 1))]
    rel = max(float((x - y).abs().max() / y.abs().max()) for x, y in rows)
    assert 1e-3 < rel < 0.3, rel


def test_unknown_quantization_is_refused():
    with pytest.raises(ValueError, match="quantization must be fp8, int8, int4, auto or None, got .int3."):
        EngineConfig(quantization="int3")
