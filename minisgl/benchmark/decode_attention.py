"""How close does FlashInfer's paged decode kernel get to the GPU's memory bandwidth?

    python -m minisgl.benchmark.decode_attention --batch-size 16,64,128,256 --context 800

Times one layer of decode attention (Qwen3-0.6B's shape by default: 16 query heads, 8 KV heads,
head_dim 128, bfloat16) for each variant the engine could use: CUDA-core or tensor-core kernel,
split-KV as planned for CUDA graphs or not, page size 1 or 16, ``NHD`` or ``HND`` layout. Pages are
shuffled and several layers' caches are cycled, so neither locality nor the L2 cache flatters the
result. Bandwidth = K and V bytes read / kernel time. CUDA + FlashInfer only.

Two other kernels FlashInfer ships are timed next to its decode kernels: XQA (TensorRT-LLM's decode
kernel; it reads a ``[batch, pages]`` page table directly, so it needs no plan, pages of 16-128),
the FlashAttention-3 prefill kernel with one query per request, and ``BatchAttention`` (one persistent
grid whose plan splits the KV evenly over the SMs). ``--ragged`` draws each request's
context uniformly from [100, 2 * context - 100] (same mean), as in a real batch.
"""

from __future__ import annotations

import argparse

import torch

from minisgl.attention.flashinfer_backend import unsplit_graph_plan

# (label, page size, layout, tensor cores, planned for CUDA graphs, disable split-KV)
VARIANTS = [
    ("tensor cores, page 16, NHD, graph plan (engine, batch < 32)", 16, "NHD", True, True, False),
    ("tensor cores, page 16, NHD, graph plan, no split (engine)", 16, "NHD", True, True, True),
    ("tensor cores, page 16, HND, graph plan", 16, "HND", True, True, False),
    ("tensor cores, page 16, HND, graph plan, no split", 16, "HND", True, True, True),
    ("tensor cores, page 64, NHD, graph plan, no split", 64, "NHD", True, True, True),
    ("tensor cores, page 256, NHD, graph plan, no split", 256, "NHD", True, True, True),
    ("tensor cores, page 1, NHD, graph plan", 1, "NHD", True, True, False),
    ("CUDA cores, page 1, NHD, graph plan", 1, "NHD", False, True, False),
    ("CUDA cores, page 1, NHD, eager plan", 1, "NHD", False, False, False),
    ("CUDA cores, page 16, NHD, graph plan", 16, "NHD", False, True, False),
    ("CUDA cores, page 16, HND, graph plan", 16, "HND", False, True, False),
]
# (label, kernel, page size, layout): kernels with their own entry points
OTHERS = [
    ("XQA, page 16, NHD", "xqa", 16, "NHD"),
    ("XQA, page 32, NHD", "xqa", 32, "NHD"),
    ("FA3 prefill kernel, page 1, NHD", "fa3", 1, "NHD"),
    ("FA3 prefill kernel, page 16, NHD", "fa3", 16, "NHD"),
    ("BatchAttention (persistent), page 16, NHD", "persistent", 16, "NHD"),
]


def context_lengths(args, bs: int) -> list[int]:
    if not args.ragged:
        return [args.context] * bs
    g = torch.Generator().manual_seed(bs)
    return torch.randint(100, 2 * args.context - 99, (bs,), generator=g).tolist()


def _paged(args, bs: int, page: int, layout: str):
    """Shuffled pages for ``bs`` requests: ``(caches, page ids, kv_indptr (host), last_page_len (host),
    context lengths)``; request ``i``'s pages are ``page_ids[kv_indptr[i] : kv_indptr[i + 1]]``."""
    dev, dt = "cuda", torch.bfloat16
    lens = context_lengths(args, bs)
    npages = [-(-n // page) for n in lens]
    total = sum(npages)
    kv, d = args.kv_heads, args.head_dim
    shape = (total, page, kv, d) if layout == "NHD" else (total, kv, page, d)
    caches = [(torch.randn(shape, dtype=dt, device=dev), torch.randn(shape, dtype=dt, device=dev)) for _ in range(4)]
    perm = torch.randperm(total, device=dev, dtype=torch.int32)
    indptr = torch.zeros(bs + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor(npages).cumsum(0)
    last = torch.tensor([n - (p - 1) * page for n, p in zip(lens, npages)], dtype=torch.int32)
    return caches, perm, indptr, last, lens


def _time(fn, iters: int) -> float:
    for i in range(20):  # also lets the clocks rise from idle
        fn(i)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(iters):
        fn(i)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def time_other(args, bs: int, kind: str, page: int, layout: str) -> float:
    """Microseconds per call of one layer's decode attention with XQA, the FA3 prefill kernel or the
    persistent ``BatchAttention``."""
    import flashinfer

    dev, dt = "cuda", torch.bfloat16
    h, d = args.heads, args.head_dim
    caches, perm, indptr, last, lens = _paged(args, bs, page, layout)
    starts = indptr.tolist()
    q = torch.randn(bs, h, d, dtype=dt, device=dev)
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=dev)
    if kind == "xqa":
        width = max(b - a for a, b in zip(starts, starts[1:]))
        table = torch.zeros(bs, width, dtype=torch.int32, device=dev)
        for r in range(bs):
            table[r, : starts[r + 1] - starts[r]] = perm[starts[r] : starts[r + 1]]
        seq = torch.tensor(lens, dtype=torch.int32, device=dev).view(torch.uint32)
        out = torch.empty_like(q)
        return _time(
            lambda i: flashinfer.decode.xqa_batch_decode_with_kv_cache(
                q, caches[i % 4], ws, table, seq, width * page, bmm1_scale=d**-0.5, out=out, kv_layout=layout
            ),
            args.iters,
        )
    qo = torch.arange(bs + 1, dtype=torch.int32)
    if kind == "persistent":  # one persistent grid, KV split evenly over the SMs at plan time
        attn = flashinfer.BatchAttention(layout)
        lens_t = torch.tensor(lens, dtype=torch.int32)
        pages = perm.to(torch.int32)
        attn.plan(qo.cuda(), indptr.cuda(), pages, lens_t.cuda(), h, args.kv_heads, d, d, page, q_data_type=dt)
        return _time(lambda i: attn.run(q, caches[i % 4]), args.iters)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, layout, backend=kind)
    wrapper.plan(qo, indptr, perm, last, h, args.kv_heads, d, page, causal=True, q_data_type=dt, kv_data_type=dt)
    return _time(lambda i: wrapper.run(q, caches[i % 4]), args.iters)


def time_variant(args, bs: int, page: int, layout: str, tensor_cores: bool, graph: bool, no_split: bool) -> float:
    """Microseconds per call of one layer's decode attention."""
    import flashinfer

    dev, dt = "cuda", torch.bfloat16
    h, kv, d = args.heads, args.kv_heads, args.head_dim
    caches, indices, indptr, last, _ = _paged(args, bs, page, layout)
    total = int(indptr[-1])
    extra = {}
    if graph:  # the fixed-size buffers a CUDA-graph wrapper plans into
        extra = dict(
            use_cuda_graph=True,
            paged_kv_indptr_buffer=torch.empty(bs + 1, dtype=torch.int32, device=dev),
            paged_kv_indices_buffer=torch.empty(total, dtype=torch.int32, device=dev),
            paged_kv_last_page_len_buffer=torch.empty(bs, dtype=torch.int32, device=dev),
        )
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=dev)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws, layout, use_tensor_cores=tensor_cores, backend="fa2", **extra
    )
    plan = dict(q_data_type=dt, kv_data_type=dt)
    if no_split:  # honoured by the tensor-core kernel only
        plan["disable_split_kv"] = True
    wrapper.plan(indptr, indices, last, h, kv, d, page, **plan)
    if no_split and graph:
        unsplit_graph_plan(wrapper, bs)
    q = torch.randn(bs, h, d, dtype=dt, device=dev)
    return _time(lambda i: wrapper.run(q, caches[i % 4]), args.iters)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-size", default="16,64,128,256")
    ap.add_argument("--context", type=int, default=800)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--ragged", action="store_true", help="contexts uniform in [100, 2 * context - 100]")
    ap.add_argument("--only", default="", help="time only variants whose label holds one of these ';'-separated texts")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("decode_attention needs a CUDA GPU with FlashInfer")
    torch.manual_seed(0)
    print(f"{'batch':>5}  {'variant':50}  {'us/layer':>9}  {'TB/s':>5}")
    for bs in (int(b) for b in args.batch_size.split(",")):
        kv_bytes = sum(context_lengths(args, bs)) * args.kv_heads * args.head_dim * 2 * 2  # K and V, bf16
        runs = [(label, time_variant, v) for label, *v in VARIANTS] + [(label, time_other, v) for label, *v in OTHERS]
        for label, timer, variant in runs:
            if not any(part in label for part in args.only.split(";")):
                continue
            try:
                us = timer(args, bs, *variant)
                print(f"{bs:>5}  {label:50}  {us:9.1f}  {kv_bytes / us / 1e6:5.2f}", flush=True)
            except Exception as e:  # a variant this FlashInfer build lacks: say so, time the others
                print(f"{bs:>5}  {label:50}  failed: {type(e).__name__}: {str(e)[:120]}", flush=True)


if __name__ == "__main__":
    main()
