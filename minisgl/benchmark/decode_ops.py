"""What does each op of a decode step cost, attention aside?

    python -m minisgl.benchmark.decode_ops --model Qwen3-0.6B --dummy-weight --batch-size 16,64,128,256

For each batch size, each kind of op of a decode step runs for every layer (each layer's own weights)
inside one CUDA graph, so launch costs are those of the engine's graphs; the graph is replayed and
timed with CUDA events. The sampler runs eagerly, as in the engine. ``copy`` (one small copy per norm)
is the floor of a kernel in a graph, not part of the sum. Then the four GEMMs of a layer at each batch
size, through cuBLAS, cuBLASLt and with a transposed weight, next to the time reading their weights
at 4.8 TB/s (or doing their FLOPs at 990 TFLOP/s) would take. Attention: ``decode_attention``.
CUDA only.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from minisgl import LLM
from minisgl.engine.config import add_engine_args
from minisgl.engine.sample import SamplingInfo
from minisgl.kernels import triton_ops
from minisgl.layers import silu_and_mul


def graph_us(fn, iters: int = 20) -> float:
    """Microseconds per replay of a CUDA graph of ``fn``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # lazy initialisations happen outside the capture
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3


def op_times(llm: LLM, bs: int) -> dict[str, float]:
    """Microseconds per decode step of each kind of op (all layers), attention aside."""
    eng = llm.scheduler.engine
    model, dev, dt = eng.model, eng.device, eng.dtype
    cfg, layers = model.config, model.model.layers
    attn = layers[0].self_attn
    tri = triton_ops(torch.empty(1, device=dev))
    h = torch.randn(bs, cfg.hidden_size, dtype=dt, device=dev)
    res = torch.randn_like(h)
    qkv = attn.qkv_proj(h)
    attn_out = torch.randn(bs, attn.num_heads * attn.head_dim, dtype=dt, device=dev)
    gate_up = layers[0].mlp.gate_up_proj(h)
    act = torch.randn(bs, gate_up.shape[1] // 2, dtype=dt, device=dev)
    pos = torch.randint(0, 1000, (bs,), device=dev)
    loc = torch.randperm(eng.kv_pool.num_slots, device=dev)[:bs]
    norms = (attn.q_norm.weight, attn.k_norm.weight) if attn.qk_norm else (None, None)
    shape = (attn.num_heads, attn.num_kv_heads, attn.head_dim)

    def rope():
        return tri.qk_norm_rope(qkv, pos, attn.rotary[0].cos_sin, *shape, *norms, 1e-6)

    _, k, v = rope()  # v: a view into qkv, strided as the decoder hands it to the store
    ops = {
        "qkv_proj": lambda: [ly.self_attn.qkv_proj(h) for ly in layers],
        "o_proj": lambda: [ly.self_attn.o_proj(attn_out) for ly in layers],
        "gate_up_proj": lambda: [ly.mlp.gate_up_proj(h) for ly in layers],
        "down_proj": lambda: [ly.mlp.down_proj(act) for ly in layers],
        "lm_head": lambda: model.lm_head(h),
        "add_rmsnorm x2": lambda: [ly.post_attention_layernorm(h.clone(), res) for ly in layers for _ in (0, 1)],
        "qk_norm_rope": lambda: [rope() for _ in layers],
        "store_kv": lambda: [eng.kv_pool.store(i, loc, k, v) for i in range(len(layers))],
        "silu_and_mul": lambda: [silu_and_mul(gate_up) for _ in layers],
    }
    times = {name: graph_us(fn) for name, fn in ops.items()}
    times["add_rmsnorm x2"] -= graph_us(lambda: [h.clone() for _ in layers for _ in (0, 1)])  # its input copies
    logits = torch.randn(bs, cfg.vocab_size, device=dev)
    info = SamplingInfo.plain(bs, 0.6, cfg.vocab_size, dev)
    eng.sampler.sample(logits, info)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(20):
        eng.sampler.sample(logits, info)
    end.record()
    torch.cuda.synchronize()
    times["sampler (eager)"] = start.elapsed_time(end) / 20 * 1e3
    return times


def gemm_times(llm: LLM, bs: int) -> list[str]:
    """Each GEMM of a layer (8 copies of its weight, so L2 does not hold it) in three ways."""
    layer = llm.scheduler.engine.model.model.layers[0]
    weights = {
        "qkv": layer.self_attn.qkv_proj.weight,
        "o": layer.self_attn.o_proj.weight,
        "gate_up": layer.mlp.gate_up_proj.weight,
        "down": layer.mlp.down_proj.weight,
    }
    rows = []
    for name, w0 in weights.items():
        ws = [torch.randn_like(w0) for _ in range(8)]
        wts = [w.t().contiguous() for w in ws]
        x = torch.randn(bs, w0.shape[1], dtype=w0.dtype, device=w0.device)
        got = []
        for lib in ("cublas", "cublaslt"):
            torch.backends.cuda.preferred_blas_library(lib)
            got.append(graph_us(lambda x=x, ws=ws: [F.linear(x, w) for w in ws]) / 8)
        torch.backends.cuda.preferred_blas_library("cublas")
        got.append(graph_us(lambda x=x, wts=wts: [x @ w for w in wts]) / 8)
        floor = max(w0.numel() * w0.element_size() / 4.8e12, 2 * bs * w0.numel() / 990e12) * 1e6
        rows.append(f"{name} {tuple(w0.shape)}: " + " / ".join(f"{t:.1f}" for t in got) + f" (floor {floor:.1f})")
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(ap, ["model", "dummy_weight"], model="Qwen3-0.6B")
    ap.add_argument("--batch-size", default="16,64,128,256")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("decode_ops needs a CUDA GPU")
    sizes = [int(b) for b in args.batch_size.split(",")]
    llm = LLM(args.model, dummy_weight=args.dummy_weight, cuda_graph_max_bs=0, max_running_requests=max(sizes))
    with torch.inference_mode():
        for bs in sizes:
            times = op_times(llm, bs)
            ops = " ".join(f"{k}={v:.0f}" for k, v in times.items())
            print(f"batch {bs}, us per step: {ops} | sum {sum(times.values()):.0f}", flush=True)
        for bs in sizes:
            print(f"GEMM us at batch {bs} [cuBLAS / cuBLASLt / x @ W^T]: " + "; ".join(gemm_times(llm, bs)), flush=True)


if __name__ == "__main__":
    main()
