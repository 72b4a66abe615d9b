"""The GPU K/V store three ways: torch's two scatters, our Triton kernel, our CUDA kernel through TVM FFI.

    python -m minisgl.benchmark.kv_store --json minisgl/benchmark/results/h200-kv-store-ab.json

For each number of tokens (1 and 64: decode steps; 4,096 and 16,384: prefill chunks), the K and V rows
are views into a fused qkv tensor, as in the engine, stored into one layer's pool at random slots. Each
store is timed inside a CUDA graph (kernel time only: how decode runs) and eagerly (with the host's
launch cost: how prefill runs), and the bytes moved (read + write of K and V) give GB/s.
CUDA only.
"""

from __future__ import annotations

import argparse
import json

import torch

from minisgl.benchmark.decode_ops import graph_us
from minisgl.kernels import jit_store, triton_kernels


def eager_us(fn, iters: int = 200) -> float:
    for _ in range(10):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3


def row(tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, slots: int) -> dict:
    dev = torch.device("cuda")
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=dev).to(dtype)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim :].view(tokens, kv_heads, head_dim)
    loc = torch.randperm(slots, device=dev)[:tokens]
    pools = {name: [torch.zeros(slots, kv_heads, head_dim, device=dev, dtype=dtype) for _ in "kv"] for name in "abc"}

    def torch_store(kp=pools["a"][0], vp=pools["a"][1]):
        kp[loc] = k
        vp[loc] = v

    stores = {
        "torch": torch_store,
        "triton": lambda: triton_kernels.store_kv(*pools["b"], loc, k, v),
        "tvm_ffi": lambda: jit_store.store_kv(*pools["c"], loc, k, v),
    }
    out = dict(tokens=tokens, kv_heads=kv_heads, head_dim=head_dim, dtype=str(dtype).removeprefix("torch."))
    for name, fn in stores.items():
        out[f"{name}_us"] = round(graph_us(fn, iters=50), 2)
        out[f"{name}_eager_us"] = round(eager_us(fn), 2)
    for name in ("b", "c"):  # every store wrote the same bytes
        assert torch.equal(pools[name][0], pools["a"][0]) and torch.equal(pools[name][1], pools["a"][1]), name
    moved = 2 * 2 * k.numel() * k.element_size()  # K and V, read and written
    for name in stores:
        out[f"{name}_gbps"] = round(moved / out[f"{name}_us"] / 1e3, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="1,64,256,4096,16384")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    assert jit_store.available(), "the TVM FFI kernel did not build here"
    rows = []
    # Qwen3-0.6B / Llama-3.1-8B (8 KV heads x 128) and Qwen3-14B at TP=2 (4 x 128), bfloat16
    for heads, kv_heads in ((16, 8), (20, 4)):
        for tokens in map(int, args.tokens.split(",")):
            rows.append(row(tokens, heads, kv_heads, 128, torch.bfloat16, slots=65536))
            print(json.dumps(rows[-1]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
