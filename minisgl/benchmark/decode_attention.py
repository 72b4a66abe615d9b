"""How close does FlashInfer's paged decode kernel get to the GPU's memory bandwidth?

    python -m minisgl.benchmark.decode_attention --batch-size 16,64,128,256 --context 800

Times one layer of decode attention (Qwen3-0.6B's shape by default: 16 query heads, 8 KV heads,
head_dim 128, bfloat16) for each variant the engine could use: CUDA-core or tensor-core kernel,
split-KV as planned for CUDA graphs or not, page size 1 or 16, ``NHD`` or ``HND`` layout. Pages are
shuffled and several layers' caches are cycled, so neither locality nor the L2 cache flatters the
result. Bandwidth = K and V bytes read / kernel time. CUDA + FlashInfer only.
"""

from __future__ import annotations

import argparse

import torch

# (label, page size, layout, tensor cores, planned for CUDA graphs, disable split-KV)
VARIANTS = [
    ("CUDA cores, page 1, NHD, graph plan (the engine's)", 1, "NHD", False, True, False),
    ("CUDA cores, page 1, NHD, eager plan", 1, "NHD", False, False, False),
    ("tensor cores, page 1, NHD, graph plan", 1, "NHD", True, True, False),
    ("tensor cores, page 1, NHD, graph plan, no split", 1, "NHD", True, True, True),
    ("CUDA cores, page 16, NHD, graph plan", 16, "NHD", False, True, False),
    ("CUDA cores, page 16, HND, graph plan", 16, "HND", False, True, False),
    ("tensor cores, page 16, HND, graph plan, no split", 16, "HND", True, True, True),
]


def time_variant(args, bs: int, page: int, layout: str, tensor_cores: bool, graph: bool, no_split: bool) -> float:
    """Microseconds per call of one layer's decode attention."""
    import flashinfer

    dev, dt = "cuda", torch.bfloat16
    h, kv, d = args.heads, args.kv_heads, args.head_dim
    pages_per_req = -(-args.context // page)
    total = bs * pages_per_req
    shape = (total, page, kv, d) if layout == "NHD" else (total, kv, page, d)
    caches = [(torch.randn(shape, dtype=dt, device=dev), torch.randn(shape, dtype=dt, device=dev)) for _ in range(4)]
    indices = torch.randperm(total, device=dev, dtype=torch.int32)
    indptr = torch.arange(0, total + 1, pages_per_req, dtype=torch.int32)
    last = torch.full((bs,), args.context - (pages_per_req - 1) * page, dtype=torch.int32)
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
    q = torch.randn(bs, h, d, dtype=dt, device=dev)
    for i in range(4):
        wrapper.run(q, caches[i % 4])
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(args.iters):
        wrapper.run(q, caches[i % 4])
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / args.iters


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-size", default="16,64,128,256")
    ap.add_argument("--context", type=int, default=800)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=40)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("decode_attention needs a CUDA GPU with FlashInfer")
    torch.manual_seed(0)
    print(f"{'batch':>5}  {'variant':50}  {'us/layer':>9}  {'TB/s':>5}")
    for bs in (int(b) for b in args.batch_size.split(",")):
        kv_bytes = bs * args.context * args.kv_heads * args.head_dim * 2 * 2  # K and V, bf16
        for label, *variant in VARIANTS:
            try:
                us = time_variant(args, bs, *variant)
                print(f"{bs:>5}  {label:50}  {us:9.1f}  {kv_bytes / us / 1e6:5.2f}", flush=True)
            except Exception as e:  # a variant this FlashInfer build lacks: say so, time the others
                print(f"{bs:>5}  {label:50}  failed: {type(e).__name__}: {str(e)[:120]}", flush=True)


if __name__ == "__main__":
    main()
