"""GPU correctness (run by hand on a CUDA machine; skipped elsewhere).

Every backend (torch, fi, fa3, fa3+fi) in bfloat16 against the torch backend on tiny random
Llama / Qwen3 models with head_dim 128, across page sizes, prefix-cache hits, chunked prefill,
CUDA graphs on/off and overlap scheduling on/off: the first pass's logits agree within a stated
tolerance and the greedy tokens are equal. HF parity on the GPU in float32 with the torch backend.
"""

from __future__ import annotations

import random
import time

import pytest
import torch
from greedy_compare import LogitRecorder, compare_greedy
from hf_ref import hf_greedy
from tiny_models import HEAD_DIM_128, save_tiny_model

from minisgl import LLM, SamplingParams
from minisgl.env import ENV

PLAIN, OVERLAP = {"loop": "plain"}, {"loop": "overlap"}  # the scheduler loops

pytestmark = pytest.mark.gpu

# bf16 logits of these models are O(10) (an ulp is 0.06): kernels that sum in different orders differ
# by a few ulps (0.28 seen between fi and torch on an H200). The two best logits of a random model
# are often closer than that (0.011 at one step of the tiny Llama), so greedy tokens may split there.
LOGIT_ATOL = 0.5
# The fused kernels change more than summation order: norms and rope in float32 with one rounding, rope
# from the float32 table. Each bf16 path is up to 0.42 (unfused) / 0.57 (fused) from the float32 logits
# at the tiny Llama's first pass (measured on CPU with the Triton interpreter, whose float32 -> bf16
# conversion truncates where a GPU rounds to nearest, so the fused figure is pessimistic), so two of them
# can be ~1 apart; a wrong rope or norm is off by several units and splits tokens that are not near-ties.
FUSED_LOGIT_ATOL = 1.0


@pytest.fixture(scope="module")
def gpu_models(tmp_path_factory):
    return {
        "llama": save_tiny_model("llama", tmp_path_factory.mktemp("gpu-llama"), tokenizer=False, **HEAD_DIM_128),
        "qwen3": save_tiny_model("qwen3", tmp_path_factory.mktemp("gpu-qwen3"), tokenizer=False, **HEAD_DIM_128),
    }


def prompts() -> list[list[int]]:
    rng = random.Random(0)
    r = lambda n: [rng.randrange(3, 4096) for _ in range(n)]
    base = r(80)  # prefix hits of a 64-token page too
    return [base + r(20), base + r(5), r(7), base[:30], r(150), list(base + r(3))]


def run(path, **cfg):
    """Greedy tokens of ``prompts()`` in two waves (the second hits the prefix cache), the logits
    of every sampled token, and the LLM."""
    llm = LLM(str(path), dtype=cfg.pop("dtype", "bfloat16"), device="cuda", num_pages=4096, **cfg)
    rec = LogitRecorder(llm.scheduler.engine)
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    ps = prompts()
    first = llm.generate(ps[:3], params, use_tqdm=False)  # ragged prefill batches, a chunked prompt
    second = llm.generate(ps[3:], params, use_tqdm=False)  # prefix hits (radix), a chunked prompt
    llm.scheduler.check_memory()
    return [o.token_ids for o in first + second], rec, llm


def assert_same_greedy(got, ref, atol: float = LOGIT_ATOL) -> None:
    """Tokens and logits agree up to bf16 near-ties (see greedy_compare)."""
    share = compare_greedy(prompts(), got[0], got[1], ref[0], ref[1], atol)
    assert share >= 0.25, f"near-ties cut the comparison to {share:.0%} of the tokens"


@pytest.fixture(scope="module")
def references(gpu_models):
    return {
        k: run(p, attention_backend="torch", cuda_graph_max_bs=0, components=PLAIN, max_prefill_length=64)[:2]
        for k, p in gpu_models.items()
    }


CASES = [
    (backend, page, graphs, overlap)
    for backend in ("torch", "fi", "fa3", "fa3,fi")
    for page in (1, 16, 64)
    for graphs, overlap in ((8, True), (0, False))
]


@pytest.mark.parametrize("model", ["llama", "qwen3"])
@pytest.mark.parametrize("backend,page,graphs,overlap", CASES)
def test_backend_matches_torch(gpu_models, references, model, backend, page, graphs, overlap):
    tokens, logits, llm = run(
        gpu_models[model],
        attention_backend=backend,
        page_size=page,
        cuda_graph_max_bs=graphs,
        components=OVERLAP if overlap else PLAIN,
        max_prefill_length=64,
    )
    assert llm.scheduler.engine.attn_backend.name == backend
    assert (llm.scheduler.engine.graph_runner is not None) == (graphs > 0 and backend != "torch")
    assert llm.cache_stats.hit_tokens > 0
    assert_same_greedy((tokens, logits), references[model])


@pytest.mark.parametrize("page", [1, 16])
def test_cuda_core_decode_matches_torch(gpu_models, references, page, monkeypatch):
    """The CUDA-core decode kernel (``MINISGL_FI_TENSOR_CORES=0``; tensor cores are the default)."""
    monkeypatch.setattr(ENV, "fi_tensor_cores", False)
    tokens, logits, llm = run(gpu_models["qwen3"], attention_backend="fi", page_size=page, cuda_graph_max_bs=8)
    assert not llm.scheduler.engine.attn_backend.tensor_cores
    assert_same_greedy((tokens, logits), references["qwen3"])


@pytest.mark.parametrize("model", ["llama", "qwen3"])
@pytest.mark.parametrize("page", [1, 16, 64])
def test_unsplit_decode_graphs_match_torch(gpu_models, references, model, page, monkeypatch):
    """Captured decode sizes from 4 up plan without split-KV (the engine does so from 32 up), smaller
    ones with it, in one process: batches of 3 run in the graph of 4 with a dummy request."""
    monkeypatch.setattr(ENV, "fi_no_split_min_bs", 4)
    tokens, logits, llm = run(gpu_models[model], attention_backend="fa3,fi", page_size=page, cuda_graph_max_bs=8)
    decode = llm.scheduler.engine.attn_backend.decode
    assert decode.no_split_min_bs == 4 and sorted(decode.graph_wrappers) == [1, 2, 4, 8]
    for bs, wrapper in decode.graph_wrappers.items():
        if bs >= 4:  # the grid is one block per request: no padding blocks
            assert int(wrapper._plan_info[0]) == bs
    assert_same_greedy((tokens, logits), references[model])


def test_speculative_verify_replays_decode_graphs(gpu_models):
    """A verify pass runs as a decode batch with one row per position (``decode_rows`` in
    speculative/feature.py), so with CUDA graphs on it replays the decode graph of that many rows. Drafts
    are the plain engine's tokens with every third one wrong (steps accept all, some or none); the greedy
    tokens equal the plain engine's (same flags) until a bf16 near-tie of the plain run's logits."""
    from minisgl.speculative import DRAFTERS, Drafter

    path = gpu_models["qwen3"]
    cfg = dict(attention_backend="fi", cuda_graph_max_bs=16, components=OVERLAP)
    ref_tokens, ref_rows, _ = run(path, **cfg)
    ps = prompts()
    refs = {tuple(p): t for p, t in zip(ps, ref_tokens)}

    class Oracle(Drafter):
        def propose(self, req, k):
            n = len(req.output_ids)
            return [t if (n + j) % 3 else (t + 1) % 4096 for j, t in enumerate(refs[tuple(req.input_ids)][n : n + k])]

    params = SamplingParams(max_tokens=10, ignore_eos=True)
    with DRAFTERS.registered("test-gpu-oracle", Oracle):
        llm = LLM(
            str(path), dtype="bfloat16", device="cuda", num_pages=4096, speculative_algorithm="test-gpu-oracle",
            **cfg,
        )  # fmt: skip
        runner, replayed = llm.scheduler.engine.graph_runner, []
        replay = runner.replay
        runner.replay = lambda batch: replayed.append(batch.label == "verify") or replay(batch)
        outs = llm.generate(ps[:3], params, use_tqdm=False) + llm.generate(ps[3:], params, use_tqdm=False)
    llm.scheduler.check_memory()
    stats = llm.scheduler.feature("speculative").stats
    assert sum(replayed) > 0, "no verify pass replayed a decode graph"
    assert 0 < stats.accepted_tokens < stats.draft_tokens, stats
    for p, o, want in zip(ps, outs, ref_tokens):
        got = o.token_ids
        t = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if t is not None:  # only where the plain run's two choices were within bf16 rounding
            row = ref_rows.of(p, len(want))[t]
            gap = float(row[want[t]] - row[got[t]])
            assert gap < LOGIT_ATOL, f"prompt of {len(p)} tokens, output {t}: {got[t]} for {want[t]} (led by {gap:.3f})"


def test_flashinfer_refuses_float32(gpu_models):
    with pytest.raises(ValueError, match="bfloat16"):
        LLM(str(gpu_models["llama"]), dtype="float32", attention_backend="fi", device="cuda", num_pages=64)


def test_auto_picks_fa3_fi_on_hopper(gpu_models):
    llm = LLM(str(gpu_models["qwen3"]), device="cuda", cuda_graph_max_bs=4, num_pages=1024)
    expected = "fa3,fi" if torch.cuda.get_device_capability()[0] == 9 else "fi"
    assert llm.scheduler.engine.attn_backend.name == expected
    backend = llm.scheduler.engine.attn_backend
    assert getattr(backend, "decode", backend).tensor_cores
    assert llm.scheduler.engine.dtype == torch.bfloat16 and llm.scheduler.config.loop == "overlap"
    assert llm.scheduler.page_size == llm.scheduler.engine.kv_pool.page_size == 64


@pytest.mark.parametrize("model", ["llama", "qwen3"])
def test_hf_parity_on_gpu_float32(gpu_models, model):
    path = gpu_models[model]
    llm = LLM(
        str(path),
        dtype="float32",
        device="cuda",
        attention_backend="torch",
        components={"loop": "overlap"},
        num_pages=4096,
    )
    ps = prompts()
    outs = llm.generate(ps, SamplingParams(max_tokens=12, ignore_eos=True), use_tqdm=False)
    for p, o in zip(ps, outs):
        assert o.token_ids == hf_greedy(path, p, 12, device="cuda")


def test_graph_replay_is_used_and_padding_is_harmless(gpu_models):
    """Batches of 3 and 5 run through the graphs of 4 and 8 and give the eager tokens (up to near-ties)."""
    llama = gpu_models["llama"]
    eager = run(llama, attention_backend="fi", cuda_graph_max_bs=0, components=PLAIN)[:2]
    tokens, logits, llm = run(llama, attention_backend="fi", cuda_graph_max_bs=8, components=PLAIN)
    runner = llm.scheduler.engine.graph_runner
    assert runner.sizes == [1, 2, 4, 8]
    assert_same_greedy((tokens, logits), eager)


def test_a_registered_graph_plan_is_what_runs(gpu_models):
    """The CUDA-graph plan is a seam (``components={"graph_plan": name}``): a recording plan selected by
    name pads every replayed batch, and the tokens are the eager ones (up to near-ties)."""
    import seam_impls
    from seam_impls import CALLS

    from minisgl.engine.graph import GRAPH_PLANS

    llama = gpu_models["llama"]
    eager = run(llama, attention_backend="fi", cuda_graph_max_bs=0, components=PLAIN)[:2]
    CALLS.clear()
    with GRAPH_PLANS.registered("recording", seam_impls.GraphPlan):
        tokens, logits, llm = run(
            llama, attention_backend="fi", cuda_graph_max_bs=8, components={**PLAIN, "graph_plan": "recording"}
        )
    assert isinstance(llm.scheduler.engine.graph_runner.plan, seam_impls.GraphPlan) and CALLS["graph_plan"] > 0
    assert_same_greedy((tokens, logits), eager)


# ---- fused kernels in the whole engine (kernel-level tests: test_triton_kernels.py) --------------


@pytest.mark.parametrize("model", ["llama", "qwen3"])
def test_fused_kernels_keep_the_unfused_tokens(gpu_models, model, monkeypatch):
    """The whole engine with FlashInfer's and our Triton kernels off gives the same greedy tokens (up to
    near-ties)."""
    import minisgl.kernels as kernels

    fused, fused_logits, _ = run(gpu_models[model], attention_backend="fa3,fi", cuda_graph_max_bs=8)
    monkeypatch.setattr(ENV, "fused_kernels", False)
    kernels._triton.cache_clear(), kernels._flashinfer.cache_clear()
    try:
        plain, plain_logits, _ = run(gpu_models[model], attention_backend="fa3,fi", cuda_graph_max_bs=8)
    finally:
        monkeypatch.setattr(ENV, "fused_kernels", True)
        kernels._triton.cache_clear(), kernels._flashinfer.cache_clear()
    assert kernels.triton_ops(torch.zeros(1, device="cuda")) is not None
    assert_same_greedy((fused, fused_logits), (plain, plain_logits), FUSED_LOGIT_ATOL)


@pytest.mark.parametrize("store", ["triton", "torch"])
def test_kv_stores_give_identical_logits(gpu_models, store, monkeypatch):
    """The K/V store is a copy: the engine with the TVM FFI kernel (the default), the Triton kernel or
    torch's scatters computes bit-identical logits, with graphs and overlap on."""
    from minisgl.kernels import jit_store

    assert ENV.kv_store == "tvm_ffi" and jit_store.available()
    base_tokens, base_logits, _ = run(gpu_models["qwen3"], attention_backend="fa3,fi", cuda_graph_max_bs=8)
    monkeypatch.setattr(ENV, "kv_store", store)
    tokens, logits, _ = run(gpu_models["qwen3"], attention_backend="fa3,fi", cuda_graph_max_bs=8)
    assert tokens == base_tokens
    for p in prompts():
        for a, b in zip(logits.of(p, 10), base_logits.of(p, 10), strict=True):
            assert torch.equal(a, b)


def _qkv_rows(tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
    """K and V as the engine has them: strided views into one fused qkv row per token."""
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device="cuda").to(dtype)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    return k, qkv[:, (heads + kv_heads) * head_dim :].view(tokens, kv_heads, head_dim)


# (kv heads, head_dim): 2 KB rows (16-byte accesses), 12-byte rows at 4-byte-aligned offsets, and a
# 3-element row of one-byte floats (byte accesses)
KV_SHAPES = [(8, 128), (3, 2), (1, 3)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn])
@pytest.mark.parametrize("kv_heads,head_dim", KV_SHAPES)
@pytest.mark.parametrize("tokens", [0, 1, 37, 4096])
def test_tvm_ffi_kv_store_equals_index_put(dtype, kv_heads, head_dim, tokens):
    from minisgl.kernels import jit_store

    k, v = _qkv_rows(tokens, 3, kv_heads, head_dim, dtype)
    slots = 8192
    loc = torch.randperm(slots, device="cuda")[:tokens]
    want = [torch.zeros(slots, kv_heads, head_dim, device="cuda", dtype=dtype) for _ in "kv"]
    got = [torch.zeros_like(want[0]) for _ in "kv"]
    want[0][loc], want[1][loc] = k, v
    jit_store.store_kv(got[0], got[1], loc, k, v)
    for g, w in zip(got, want):  # bytes, so float8 compares too
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tvm_ffi_kv_store_quantizes_into_fp8_as_the_pool_does(dtype):
    """Into a float8_e4m3fn cache, the kernel divides each value by its KV head's scale, rounds and
    saturates exactly as ``KVPool.quantize`` (torch's divide, clamp to +-448, cast) does, including
    values past the range and scales that differ per head."""
    from minisgl.kernels import jit_store
    from minisgl.kvcache import KVPool

    pool = KVPool(1, 512, 16, 8, 128, torch.float8_e4m3fn, torch.device("cuda"), compute_dtype=dtype)
    k, v = _qkv_rows(1000, 16, 8, 128, dtype)
    k.mul_(200), v.mul_(-300)  # many values past +-448 at a scale of 1
    ks = torch.exp2(torch.arange(-4.0, 4.0, device="cuda"))  # 1/16 .. 8: heads saturate or go subnormal
    vs = ks.flip(0).contiguous()
    pool.set_scales(0, ks, vs)
    loc = torch.randperm(pool.num_slots, device="cuda")[:1000]
    got = [torch.zeros_like(pool.k_slots(0)) for _ in "kv"]
    jit_store.store_kv(got[0], got[1], loc, k, v, ks, vs)
    assert torch.equal(got[0][loc].view(torch.uint8), pool.quantize(k, ks).view(torch.uint8))
    assert torch.equal(got[1][loc].view(torch.uint8), pool.quantize(v, vs).view(torch.uint8))
    assert not torch.equal(pool.quantize(k, ks), pool.quantize(k, torch.ones_like(ks)))  # the scales mattered
    pool.store(0, loc, k, v)  # the pool's own store takes the kernel, quantizing inside it
    assert torch.equal(pool.k_slots(0).view(torch.uint8), got[0].view(torch.uint8))
    with pytest.raises(ValueError, match="needs k_scale and v_scale"):
        jit_store.store_kv(got[0], got[1], loc, k, v)
    with pytest.raises(Exception, match="float32 \\[kv_heads\\]"):
        jit_store.store_kv(got[0], got[1], loc, k, v, ks[:4], vs)


def test_tvm_ffi_kv_store_runs_on_the_current_stream_and_in_graphs():
    """Launched on torch's current stream: it is captured into a CUDA graph (on the capture's side
    stream) and replays with the inputs of the moment."""
    from minisgl.kernels import jit_store

    k, v = _qkv_rows(16, 16, 8, 128, torch.bfloat16)
    loc = torch.arange(16, device="cuda") * 3
    pools = [torch.zeros(64, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in "kv"]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        jit_store.store_kv(pools[0], pools[1], loc, k, v)
    assert not pools[0].any(), "the capture ran the kernel instead of recording it"
    k.add_(1), v.sub_(1), loc.add_(1)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(pools[0][loc], k) and torch.equal(pools[1][loc], v)
    assert torch.count_nonzero(pools[0].sum((1, 2))) == 16


def test_tvm_ffi_kv_store_refuses_bad_inputs():
    from minisgl.kernels import jit_store

    k, v = _qkv_rows(4, 2, 2, 64, torch.bfloat16)
    pools = [torch.zeros(16, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in "kv"]
    with pytest.raises(Exception, match="loc must be 1-D int64"):
        jit_store.store_kv(*pools, torch.arange(4, device="cuda", dtype=torch.int32), k, v)
    with pytest.raises(Exception, match="the caches must have k's dtype"):
        jit_store.store_kv(*pools, torch.arange(4, device="cuda"), k.float(), v.float())
    with pytest.raises(Exception, match="must share a dtype"):
        jit_store.store_kv(*pools, torch.arange(4, device="cuda"), k, v.half())
    with pytest.raises(Exception, match="same row size"):
        jit_store.store_kv(*pools, torch.arange(4, device="cuda"), k[:, :1], v[:, :1])


# ---- FP8 KV cache and weights (CPU tests: test_fp8.py) -------------------------------------------------


def test_fp8_kv_cache_on_flashinfer_matches_the_torch_backend(gpu_models):
    """With ``--kv-cache-dtype fp8_e4m3``, ``auto`` picks ``fi`` (FA3 does not read FP8 pages next to
    bf16 queries, and says so), and FlashInfer's FP8 reads (prefill and decode, graphs and overlap on)
    give the torch backend's tokens on the same FP8 cache, up to near-ties. Both calibrate the same
    per-head scales at load (one prefill pass through their own kernels), and apply them the same way."""
    from minisgl.attention.flashinfer_backend import FA3Backend, FlashInferBackend

    for model in ("llama", "qwen3"):
        ref = run(gpu_models[model], attention_backend="torch", cuda_graph_max_bs=0, kv_cache_dtype="fp8_e4m3")
        tokens, logits, llm = run(gpu_models[model], cuda_graph_max_bs=8, kv_cache_dtype="fp8_e4m3")
        engine, ref_pool = llm.scheduler.engine, ref[2].scheduler.engine.kv_pool
        assert engine.kv_pool.dtype == torch.float8_e4m3fn and engine.graph_runner is not None
        for name in ("k_scale", "v_scale"):
            assert torch.equal(getattr(engine.kv_pool, name), getattr(ref_pool, name)), name
        assert (engine.kv_pool.v_scale != 1).any()
        assert type(engine.attn_backend) is FlashInferBackend
        assert_same_greedy((tokens, logits), ref[:2])
    with pytest.raises(ValueError, match="does not read an FP8 KV cache"):
        FA3Backend(engine.kv_pool, engine.table, 4, 128)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fp8_quant_kernel_is_bit_equal_to_torch(dtype):
    """The Triton per-token quantization (one kernel) returns fp8_rows' bytes and scales exactly: widths
    below, at and across its 4,096-column block, strided rows, a zero row (scale 1e-12), rows whose
    values saturate or underflow FP8, and no rows at all."""
    from minisgl.quant.fp8 import fp8_rows
    from minisgl.quant.fp8_kernels import quant_rows

    gen = torch.Generator(device="cuda").manual_seed(0)
    for k in (3, 128, 4096, 5120, 17408):
        wide = torch.randn(9, k + 24, device="cuda", generator=gen).to(dtype)
        x = wide[:, 8 : 8 + k]  # rows strided: the engine quantizes views
        x[1] = 0
        x[2] *= 1e4
        x[3] *= 1e-6
        for rows in (x, x[:0]):
            q, s = quant_rows(rows)
            wq, ws = fp8_rows(rows)
            assert q.dtype == torch.float8_e4m3fn and s.shape == (rows.shape[0], 1)
            assert torch.equal(s, ws), (k, dtype)
            assert torch.equal(q.view(torch.uint8), wq.view(torch.uint8)), (k, dtype)


def test_fp8_scaled_linear_equals_the_rowwise_scaled_mm():
    """The engine's FP8 product (cuBLASLt with unit scales, then both scales in one float32 pass) is
    torch's rowwise-scaled ``_scaled_mm`` up to one rounding to bf16."""
    from minisgl.quant.fp8 import fp8_rows
    from minisgl.quant.fp8_kernels import quant_rows, scaled_linear

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("FP8 tensor cores need Hopper")
    gen = torch.Generator(device="cuda").manual_seed(1)
    one = torch.ones((), device="cuda")
    for m, k, n in ((1, 1024, 4096), (37, 5120, 1056), (256, 3072, 1024)):
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        wq, ws = fp8_rows(torch.randn(n, k, device="cuda", generator=gen).to(torch.bfloat16))
        xq, xs = quant_rows(x)
        got = scaled_linear(xq, xs, wq.t(), ws.view(1, -1), one, torch.bfloat16)
        want = torch._scaled_mm(xq, wq.t(), xs, ws.view(1, -1), out_dtype=torch.bfloat16)
        assert got.shape == (m, n) and got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-3)


def test_fp8_weights_use_scaled_mm_on_hopper_and_match_the_emulation(gpu_models):
    """``--quantization fp8`` on an H100/H200: each layer is one ``torch._scaled_mm`` whose output is
    the CPU's emulation of the same rounding, up to bf16 output rounding and summation order; the engine
    runs on it with graphs and overlap."""
    from minisgl.layers.linear import ColumnParallelLinear
    from minisgl.quant.fp8 import CUBLASLT_UP_TO, quantize_linears

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("FP8 tensor cores need Hopper")
    with torch.device("cuda"):
        layer = ColumnParallelLinear(256, [512]).to(torch.bfloat16)
    layer.weight.data.normal_()
    model = torch.nn.Sequential(layer)
    quantize_linears(model)
    layer = model[0]
    assert layer.scaled_mm
    # both GEMMs: cuBLASLt with the rescaling pass up to CUBLASLT_UP_TO rows, the rowwise-scaled one above
    for rows in (37, CUBLASLT_UP_TO, CUBLASLT_UP_TO + 1):
        x = torch.randn(rows, 256, device="cuda", dtype=torch.bfloat16)
        layer.scaled_mm = True
        got = layer(x)
        layer.scaled_mm = False
        want = layer(x)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2 * float(want.abs().max()))
    tokens, logits, llm = run(gpu_models["qwen3"], cuda_graph_max_bs=8, quantization="fp8")
    assert llm.scheduler.engine.model.model.layers[0].mlp.down_proj.weight.dtype == torch.float8_e4m3fn
    eager = run(gpu_models["qwen3"], cuda_graph_max_bs=0, quantization="fp8", components=PLAIN)[:2]
    assert_same_greedy((tokens, logits), eager)


@pytest.mark.parametrize("model", ["llama", "qwen3"])
def test_fp8_fused_neighbours_match_the_unfused_engine(gpu_models, model, monkeypatch):
    """``fuse_neighbours``: the norms and SwiGLU quantize the next FP8 layer's input, o_proj / gate_up / down
    leave their scales to the next kernel. The engine (graphs, overlap) gives the unfused engine's
    tokens (``MINISGL_FP8_FUSED=0``) up to near-ties, and a decode batch really takes the fused path."""
    from minisgl.quant.fp8 import FP8DecoderMLP, QuantRows, Unscaled

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("FP8 tensor cores need Hopper")
    monkeypatch.setattr(ENV, "fp8_fused", False)
    unfused = run(gpu_models[model], cuda_graph_max_bs=8, quantization="fp8")[:2]
    monkeypatch.setattr(ENV, "fp8_fused", True)
    tokens, logits, llm = run(gpu_models[model], cuda_graph_max_bs=8, quantization="fp8")
    # the fused kernels' float32 sums and exp differ from FlashInfer's in the last bit, which flips an
    # occasional bf16 rounding and then the FP8 value it quantizes to (1/16 of it): 0.56 seen at the tiny
    # Llama's 9th token on an H200; a wrong scale or norm is off by several units
    assert_same_greedy((tokens, logits), unfused, atol=FUSED_LOGIT_ATOL)
    layers = llm.scheduler.engine.model.model.layers
    block = layers[0]
    assert block.input_layernorm.quantize and isinstance(block.mlp, FP8DecoderMLP) and block.mlp.down_proj.defer
    x = torch.randn(3, block.input_layernorm.weight.shape[0], device="cuda", dtype=torch.bfloat16)
    q = block.input_layernorm(x)
    assert isinstance(q, QuantRows) and q.q.dtype == torch.float8_e4m3fn
    assert isinstance(block.mlp.gate_up_proj(q), Unscaled)


# ---- tensor parallelism over NCCL (needs as many GPUs as ranks) -----------------------------------

# float32 ranks sum a row-parallel product in two halves where one rank sums it whole: ~1e-6 relative
TP_FP32_ATOL = 1e-3


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("model", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("communicator", ["nccl", "symm-mem"])
def test_tp_matches_tp1(gpu_models, model, dtype, tp, communicator):
    """TP=N gives TP=1's greedy tokens (up to near-ties) with graphs and overlap on: ``fa3,fi`` in
    bfloat16; FlashInfer has no float32 kernels, so float32 runs the torch backend (eager). Both
    all-reduces: NCCL's, and the one-shot kernel over symmetric memory (eager and in graphs)."""
    if torch.cuda.device_count() < tp:
        pytest.skip(f"needs {tp} GPUs, this machine has {torch.cuda.device_count()}")
    backend = "fa3,fi" if dtype == "bfloat16" else "torch"
    if backend == "fa3,fi" and torch.cuda.get_device_capability()[0] != 9:
        backend = "fi"
    cfg = dict(
        dtype=dtype, attention_backend=backend, cuda_graph_max_bs=8, components={"loop": "overlap"}, page_size=16
    )
    ref = run(gpu_models[model], **cfg)[:2]
    cfg["components"]["communicator"] = communicator
    tokens, logits, llm = run(gpu_models[model], tp_size=tp, **cfg)
    try:
        engine = llm.scheduler.engine
        assert engine.tp.size == tp and llm.scheduler.config.loop == "overlap"
        assert (engine.graph_runner is not None) == (backend != "torch")
        assert engine.model.model.layers[0].self_attn.num_heads == 4 // tp  # the tiny models' 4 heads, split
        assert_same_greedy((tokens, logits), ref, LOGIT_ATOL if dtype == "bfloat16" else TP_FP32_ATOL)
    finally:
        llm.shutdown()
    assert not any(p.is_alive() for p in llm.scheduler.processes), "a rank outlived shutdown()"


@pytest.mark.slow
def test_first_requests_after_ready_run_at_speed(gpu_models, tmp_path):
    """A server whose kernel caches are empty, as right after an install (a fresh install also makes
    FlashInfer's existing cache stale: its sources are newer), compiles every kernel the serving path
    uses before ``/health`` says 200: the first requests after that take no compile time. Before the
    warm-up, the first prefill after "ready" compiled FlashInfer's prefill kernels (70-95 s on an H200)."""
    import httpx
    from server_utils import ServerProcess

    caches = dict(FLASHINFER_WORKSPACE_BASE=str(tmp_path / "fi"), TRITON_CACHE_DIR=str(tmp_path / "triton"))
    args = ["--model", str(gpu_models["qwen3"]), "--dtype", "bfloat16", "--cuda-graph-max-bs", "8"]
    server = ServerProcess(args, tmp_path, env=caches)
    try:
        t = time.monotonic()
        server.wait_ready(timeout=900)
        print(f"ready after {time.monotonic() - t:.0f} s")
        rng = random.Random(1)
        bodies = [
            dict(prompt=[rng.randrange(3, 4096) for _ in range(n)], max_tokens=6, ignore_eos=True, **extra)
            for n, extra in [(45, {}), (130, dict(temperature=0.8, seed=1)), (9, dict(temperature=0.7, top_p=0.9))]
        ]
        seconds = []
        for body in bodies:
            t = time.monotonic()
            r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=600)
            seconds.append(time.monotonic() - t)
            assert r.status_code == 200, r.text
        assert max(seconds) < 3.0, f"the first requests took {[round(s, 1) for s in seconds]} s: something compiled"
    finally:
        server.stop()
