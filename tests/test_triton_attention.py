"""The ``triton`` attention backend (``minisgl/attention/triton_backend.py``) and its kernels
(``minisgl/kernels/triton_attention.py``): split-KV decode and its merge, and the tiled causal prefill over
a cached prefix, against attention computed in torch from the same pool; then the engine on it, whose
greedy tokens equal the torch backend's. On the CPU the kernels run under Triton's interpreter (small
sizes: it is slow); the GPU tests (marked) run them compiled, with CUDA graphs and the overlap loop."""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are defined, i.e. on first import

from minisgl import LLM, SamplingParams  # noqa: E402
from minisgl.kernels import triton_attention as ta  # noqa: E402

TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def reference(q, keys, values, table, rows, starts, counts, scale):
    """Causal attention in float32 for each request's queries (positions ``start .. start + count - 1``)
    over its keys ``0 .. start + count - 1``, read through the page table: ``[T, H, D]``."""
    heads, kv = q.shape[1], keys.shape[1]
    out, t = torch.empty(q.shape, dtype=torch.float32), 0
    for row, start, n in zip(rows, starts, counts):
        slots = table[row, : start + n].long().cpu()
        k = keys.cpu()[slots].float().repeat_interleave(heads // kv, 1)
        v = values.cpu()[slots].float().repeat_interleave(heads // kv, 1)
        s = torch.einsum("thd,lhd->htl", q[t : t + n].cpu().float(), k) * scale
        future = torch.arange(start + n)[None, None, :] > torch.arange(start, start + n)[None, :, None]
        out[t : t + n] = torch.einsum("htl,lhd->thd", s.masked_fill(future, float("-inf")).softmax(-1), v)
        t += n
    return out


def scattered_pool(num_rows: int, width: int, kv_heads: int, dim: int, dtype, page: int, seed: int):
    """K/V slots and a page table whose rows hold whole pages in shuffled order (a real pool's state)."""
    g = torch.Generator().manual_seed(seed)
    pages = width // page
    order = torch.randperm(num_rows * pages + 3, generator=g)[: num_rows * pages]
    table = (order.view(num_rows, pages, 1) * page + torch.arange(page)).view(num_rows, width).to(torch.int32)
    slots = (num_rows * pages + 3) * page
    keys = torch.randn(slots, kv_heads, dim, generator=g).to(dtype)
    values = torch.randn(slots, kv_heads, dim, generator=g).to(dtype)
    return keys.to(DEVICE), values.to(DEVICE), table.to(DEVICE)


DECODE_CASES = [  # (dtype, query heads per KV head, page size): each value of each in some case
    (torch.float32, 1, 1),
    (torch.bfloat16, 2, 16),
    (torch.float32, 4, 16),
    (torch.bfloat16, 8, 1),
]


@pytest.mark.parametrize("dtype, group, page", DECODE_CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_decode_matches_torch(dtype, group, page):
    """Ragged lengths (1, a length that no split count divides, a whole number of blocks), scattered
    pages, and 1, 3 and 5 splits (more splits than blocks leaves some empty: the merge must skip them)."""
    kv, dim = 2, 32
    keys, values, table = scattered_pool(4, 192, kv, dim, dtype, page, seed=group * page)
    rows, lens = [3, 0, 2, 1], [1, 77, 128, 190]
    g = torch.Generator().manual_seed(7)
    q = torch.randn(len(rows), kv * group, dim, generator=g).to(DEVICE, dtype)
    want = reference(q, keys, values, table, rows, [n - 1 for n in lens], [1] * len(rows), dim**-0.5)
    r, n = torch.tensor(rows, device=DEVICE), torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    for splits in (1, 3, 5):
        got = ta.decode(q, keys, values, table, r, n, dim**-0.5, splits)
        assert got.dtype == dtype and got.shape == q.shape
        err = (got.float().cpu() - want).abs().max().item()
        assert err < TOL[dtype], f"{splits} splits: max error {err}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_extend_matches_torch_over_a_cached_prefix(dtype):
    """A fresh prompt longer than one query block, one decode-like query after a prefix, and a chunk
    after a prefix: each query sees its prefix and the new tokens up to itself, nothing later."""
    kv, heads, dim = 2, 4, 16
    keys, values, table = scattered_pool(4, 224, kv, dim, dtype, 4, seed=3)
    rows, starts, counts = [2, 0, 3], [0, 37, 5], [70, 1, 130]
    g = torch.Generator().manual_seed(8)
    q = torch.randn(sum(counts), heads, dim, generator=g).to(DEVICE, dtype)
    firsts = [0, counts[0], counts[0] + counts[1]]
    block_req, block_first = ta.extend_blocks(counts)
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=DEVICE)  # noqa: E731
    blocks = (i32(block_req), i32(block_first))
    got = ta.extend(q, keys, values, table, blocks, (i32(rows), i32(firsts), i32(starts), i32(counts)), dim**-0.5)
    want = reference(q, keys, values, table, rows, starts, counts, dim**-0.5)
    err = (got.float().cpu() - want).abs().max().item()
    assert err < TOL[dtype], f"max error {err}"


def test_splits_fill_the_gpu_and_stop_at_two_blocks():
    assert ta.num_splits(1, 8, 32768, programs=264) == 32  # one long request: cut into many parts
    assert ta.num_splits(1, 2, 32768, programs=264) == ta.MAX_SPLITS  # and never into more than the most
    assert ta.num_splits(64, 8, 4096, programs=264) == 1  # enough programs without splitting
    assert ta.num_splits(1, 8, 512, programs=264) == 4  # a short one: parts of at least 2 blocks
    assert ta.num_splits(2, 8, 100, programs=264) == 1


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_engine_on_triton_gives_the_torch_backends_tokens(kind, tmp_path):
    """Prefill (one prompt over a block of queries), decode with ragged lengths, a second request whose
    prompt is a cached prefix plus three tokens, at pages of 1 and 16, and triton for prefill only."""
    from tiny_models import save_tiny_model

    path = str(save_tiny_model(kind, tmp_path, tokenizer=False))
    prompts = [list(range(3, 3 + n)) for n in (5, 70)]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    outs = {}
    for backend, page in (("torch", 1), ("triton", 1), ("triton", 16), ("triton,torch", 4)):
        llm = LLM(path, dtype="float32", attention_backend=backend, page_size=page, num_pages=512, device=DEVICE)
        first = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        (again,) = llm.generate([prompts[1] + [7, 8, 9]], params, use_tqdm=False)
        assert again.cached_tokens >= 64, f"{backend}, page {page}: the second prompt should hit the cache"
        outs[(backend, page)] = first + [again.token_ids]
        llm.scheduler.check_memory()
    base = outs[("torch", 1)]
    assert all(v == base for v in outs.values()), outs


@pytest.mark.skipif(DEVICE == "cuda", reason="on a GPU the kernels are compiled: there is nothing to refuse")
def test_the_backend_refuses_the_cpu_without_the_interpreter(tmp_path, monkeypatch):
    from tiny_models import save_tiny_model

    path = save_tiny_model("llama", tmp_path, tokenizer=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        LLM(str(path), dtype="float32", attention_backend="triton", num_pages=64)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_triton_with_cuda_graphs_and_overlap_matches_torch(kind, dtype, tmp_path):
    """On a GPU, head_dim 128: the triton backend with CUDA graphs and the overlap loop gives the torch
    backend's greedy tokens up to near-ties (greedy_compare), at batch sizes that take 1 and several
    splits. In float32 (IEEE products) the logits agree to 1e-3, which any wrong index or mask breaks;
    in bfloat16 the kernels round the probabilities and sum in another order than torch's SDPA, and
    over a few layers and steps that moves a logit by up to about one (test_gpu.py's fused-kernel
    tolerance)."""
    from greedy_compare import LogitRecorder, compare_greedy
    from tiny_models import HEAD_DIM_128, save_tiny_model

    path = save_tiny_model(kind, tmp_path, tokenizer=False, **HEAD_DIM_128)
    prompts = [[(7 * i + j) % 4000 + 3 for j in range(20 + 37 * i)] for i in range(12)]
    runs = {}
    for backend in ("torch", "triton"):
        llm = LLM(str(path), dtype=dtype, attention_backend=backend, num_pages=4096, cuda_graph_max_bs=16)
        rec = LogitRecorder(llm.scheduler.engine)
        outs = llm.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True), use_tqdm=False)
        runs[backend] = ([o.token_ids for o in outs], rec)
        llm.shutdown()
    share = compare_greedy(prompts, *runs["triton"], *runs["torch"], atol=1e-3 if dtype == "float32" else 1.0)
    assert share >= 0.5, f"near-ties cut the comparison to {share:.0%} of the tokens"
