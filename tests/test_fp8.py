"""FP8 on the CPU. The KV cache (``--kv-cache-dtype fp8_e4m3``): what the pool stores, that attention
reads it back, memory accounting. The weights (``--quantization fp8``): the per-row quantization's
error bound, which layers are quantized, the engine running on them. Bad values refused. The GPU paths
(FlashInfer reading FP8 pages, ``torch._scaled_mm``) are in test_gpu.py; the quality on real weights is
measured by ``python -m minisgl.benchmark.quality`` (engine manual, "FP8")."""

from __future__ import annotations

import pytest
import torch
from greedy_compare import LogitRecorder

from minisgl import LLM, SamplingParams
from minisgl.engine.config import EngineConfig
from minisgl.kvcache import KVPool
from minisgl.layers.linear import ColumnParallelLinear, RowParallelLinear, fp8_rows, quantize_fp8

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
        llm.shutdown()
    # the CPU default is 1 GiB of KV capped at 64k tokens: the tiny model reaches the cap either way
    assert sizes["fp8_e4m3"] >= sizes["auto"]


def _fp8_round(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-448, 448).to(FP8).to(x.dtype)


def _run(path, simulate_fp8: bool = False, **kw):
    """Tokens, recorded logits and the pool of two waves: chunked prefills, then prefix hits.
    ``simulate_fp8``: a float32 pool whose stores round through FP8 (the oracle)."""
    llm = LLM(str(path), dtype="float32", num_pages=1024, max_prefill_length=16, **kw)
    pool = llm.scheduler.engine.kv_pool
    if simulate_fp8:
        store = pool.store
        pool.store = lambda layer, loc, k, v: store(layer, loc, _fp8_round(k), _fp8_round(v))
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
    """Prefill (chunked, and after prefix hits) and decode read K/V back from the FP8 pool: every
    logit equals that of a float32 pool whose stores round through FP8 (to float32 precision), and
    differs from the unrounded cache's."""
    tokens, got, pool = _run(tiny_model, kv_cache_dtype="fp8_e4m3")
    assert pool.dtype == FP8 and pool.compute_dtype == torch.float32
    sim_tokens, sim, sim_pool = _run(tiny_model, simulate_fp8=True)
    assert sim_pool.dtype == torch.float32
    _, plain, _ = _run(tiny_model)
    assert tokens == sim_tokens
    assert _max_diff(got, sim) < 1e-4
    assert _max_diff(got, plain) > 1e-2  # the rounding is real: it moves these O(1) logits


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
    linear = [m for m in model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    assert linear and all(m.weight.dtype == FP8 and m.weight_scale.shape == (1, m.weight.shape[0]) for m in linear)
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
    assert quantize_fp8(layer) == 1 and layer.weight.dtype == FP8

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
    with pytest.raises(ValueError, match="quantization must be fp8 or None, got 'int4'"):
        EngineConfig(quantization="int4")
