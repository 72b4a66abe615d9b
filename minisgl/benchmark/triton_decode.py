"""The project's Triton decode kernel (``kernels/triton_attention.py``) against FlashInfer's, one layer of
decode attention at a time:

    python -m minisgl.benchmark.triton_decode --batch-size 1,16,64,256 --context 512,4096,32768

For each shape (Qwen3-0.6B's 16 query / 8 KV heads and Qwen3-14B's 40 / 8, head_dim 128, bfloat16) both
kernels read the same K/V: pages of 64 tokens in shuffled order (FlashInfer reads them through its
page list, the Triton kernel through a ``[batch, positions]`` page table of slots). FlashInfer runs as
the ``fi`` backend configures it (tensor-core decode; planned with split-KV, and without it from 32
requests up as the CUDA-graph plans are): the faster of the two is its time. ``triton.testing.do_bench``
times each (the L2 cache flushed between runs). Bandwidth = K and V bytes read / time. CUDA only.
"""

from __future__ import annotations

import argparse
import json

import torch

SHAPES = {"Qwen3-0.6B": (16, 8, 128), "Qwen3-14B": (40, 8, 128)}
PAGE = 64


def pool(bs: int, ctx: int, kv: int, dim: int, seed: int = 0):
    """K/V pages for ``bs`` requests of ``ctx`` tokens, in shuffled order, and the page ids per request."""
    pages_per = -(-ctx // PAGE)
    g = torch.Generator(device="cuda").manual_seed(seed)
    order = torch.randperm(bs * pages_per, device="cuda", generator=g)
    k = torch.randn(bs * pages_per, PAGE, kv, dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    return k, v, order.view(bs, pages_per)


def time_flashinfer(q, k, v, pages, ctx: int, no_split: bool) -> tuple[float, torch.Tensor]:
    import flashinfer

    from minisgl.attention.flashinfer_backend import unsplit_graph_plan

    bs, heads, dim = q.shape
    kv = k.shape[2]
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True, backend="fa2")
    indptr = torch.arange(bs + 1, dtype=torch.int32) * pages.shape[1]
    last = torch.full((bs,), ctx - (pages.shape[1] - 1) * PAGE, dtype=torch.int32)
    common = dict(q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=dim**-0.5)
    w.plan(indptr, pages.flatten().int(), last, heads, kv, dim, PAGE, **common, disable_split_kv=no_split)
    if no_split:
        unsplit_graph_plan(w, bs)
    return do_bench(lambda: w.run(q, (k, v))), w.run(q, (k, v))


def time_triton(q, k, v, pages, ctx: int) -> tuple[float, int, torch.Tensor]:
    from minisgl.kernels import triton_attention as ta

    bs, heads, dim = q.shape
    kv = k.shape[2]
    slots = (pages[:, :, None] * PAGE + torch.arange(PAGE, device="cuda")).view(bs, -1)[:, :ctx].int()
    rows = torch.arange(bs, device="cuda", dtype=torch.int32)
    lens = torch.full((bs,), ctx, dtype=torch.int32, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = ta.num_splits(bs, kv, ctx, 2 * sms)
    ks, vs = k.view(-1, kv, dim), v.view(-1, kv, dim)
    out = torch.empty_like(q)
    part = (torch.empty(bs * heads * splits, dim, device="cuda"), torch.empty(bs * heads * splits, device="cuda"))
    run = lambda: ta.decode(q, ks, vs, slots, rows, lens, dim**-0.5, splits, out, part)  # noqa: E731
    return do_bench(run), splits, run().clone()


def do_bench(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200) / 1e3  # seconds


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-size", default="1,16,64,256")
    ap.add_argument("--context", default="512,4096,32768")
    ap.add_argument("--models", default=",".join(SHAPES))
    ap.add_argument("--max-gib", type=float, default=40.0, help="skip a shape whose K/V would exceed this")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    args = ap.parse_args(argv)
    rows = []
    k, v, pages = pool(4, 1024, 8, 128)  # a first, untimed pass: the GPU's clocks up, the kernels compiled
    q = torch.randn(4, 16, 128, device="cuda", dtype=torch.bfloat16)
    time_flashinfer(q, k, v, pages, 1024, False), time_triton(q, k, v, pages, 1024)
    print(f"{torch.cuda.get_device_name()}; bfloat16, pages of {PAGE}, one layer")
    print(
        f"{'model':12} {'batch':>5} {'context':>7} {'splits':>6} {'triton us':>9} {'FI us':>8} {'ratio':>6} {'TB/s':>5}"
    )
    for model in args.models.split(","):
        heads, kv, dim = SHAPES[model]
        for ctx in map(int, args.context.split(",")):
            for bs in map(int, args.batch_size.split(",")):
                nbytes = 2 * bs * ctx * kv * dim * 2
                if nbytes > args.max_gib * 2**30:
                    continue
                k, v, pages = pool(bs, ctx, kv, dim)
                q = torch.randn(bs, heads, dim, device="cuda", dtype=torch.bfloat16)
                fi, want = min(
                    (time_flashinfer(q, k, v, pages, ctx, ns) for ns in {False, bs >= 32}), key=lambda t: t[0]
                )
                tri, splits, got = time_triton(q, k, v, pages, ctx)
                err = (got.float() - want.float()).abs().max().item()
                assert err < 3e-2, f"{model} batch {bs} context {ctx}: Triton and FlashInfer differ by {err}"
                row = dict(model=model, batch=bs, context=ctx, splits=splits, triton_s=tri, flashinfer_s=fi, err=err)
                rows.append(row)
                print(
                    f"{model:12} {bs:5d} {ctx:7d} {splits:6d} {tri * 1e6:9.1f} {fi * 1e6:8.1f} {fi / tri:6.2f} "
                    f"{nbytes / tri / 1e12:5.2f}"
                )
                del k, v, pages
                torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
