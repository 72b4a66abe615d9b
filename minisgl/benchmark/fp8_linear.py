"""One linear layer four ways on a Hopper GPU: bf16 ``F.linear``; FP8 with the input quantized by torch
(``fp8_rows``: six kernels) or by one Triton kernel (``fp8_quant.quant_rows``), each then
``torch._scaled_mm`` with a scale per token and per output row (CUTLASS); and the engine's path, the
Triton quantization, ``_scaled_mm`` with unit scales (cuBLASLt) and one rescaling pass
(``fp8_quant.scaled_linear``); and that GEMM alone, which is all a decode layer runs when its neighbours
quantize its input and apply its scales (``minisgl/quant/fp8.py``).

    python -m minisgl.benchmark.fp8_linear --model Qwen3-14B --json minisgl/benchmark/results/h200-fp8-linear.json

For each layer of the model's decoder block (qkv, o, gate_up, down) and each number of tokens (decode
batches 1-256, prefill chunks), microseconds per call inside a CUDA graph (kernel time: how decode
runs) and the speed-up of each FP8 row over bf16. CUDA only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from minisgl.benchmark.decode_ops import graph_us
from minisgl.models.config import ModelConfig
from minisgl.models.resolve import resolve_model
from minisgl.quant.fp8 import fp8_rows
from minisgl.quant.fp8_kernels import quant_rows, scaled_linear


def shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """``name -> (in, out)`` of a decoder block's linear layers (TP=1)."""
    h, d = cfg.hidden_size, cfg.head_dim
    qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * d
    return {
        "qkv": (h, qkv),
        "o": (cfg.num_heads * d, h),
        "gate_up": (h, 2 * cfg.intermediate_size),
        "down": (cfg.intermediate_size, h),
    }


def row(name: str, k: int, n: int, m: int) -> dict:
    dev = torch.device("cuda")
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5
    wq, ws = fp8_rows(w)
    wt, ws = wq.t(), ws.view(1, -1)
    one = torch.ones((), device=dev)
    xq, _ = quant_rows(x)
    mm = lambda q, s: torch._scaled_mm(q, wt, s, ws, out_dtype=torch.bfloat16)
    us = {
        "bf16": graph_us(lambda: F.linear(x, w), 50),
        "fp8 torch quant": graph_us(lambda: mm(*fp8_rows(x)), 50),
        "fp8 fused quant": graph_us(lambda: mm(*quant_rows(x)), 50),
        "fp8 fused, cuBLASLt": graph_us(lambda: scaled_linear(*quant_rows(x), wt, ws, one, torch.bfloat16), 50),
        "quant alone": graph_us(lambda: quant_rows(x), 50),
        # with its neighbours fused a decode layer is this alone: its input comes quantized, its scales go to the next
        # kernel, its product rounded to bf16 (FP8Linear.acc_dtype; the 2026-12-03 record kept float32)
        "fp8 GEMM alone": graph_us(lambda: torch._scaled_mm(xq, wt, one, one, out_dtype=torch.bfloat16), 50),
    }
    return dict(layer=name, k=k, n=n, tokens=m, us=us)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="Qwen3-14B", help="an architecture name (dummy config)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 64, 128, 256, 1024, 8192])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cfg = resolve_model(args.model, dummy_weight=True)[1]
    rows = []
    for name, (k, n) in shapes(cfg).items():
        for m in args.tokens:
            r = row(name, k, n, m)
            rows.append(r)
            u = r["us"]
            print(
                f"{args.model:>10} {name:>8} {k:>6}->{n:<6} tokens {m:>5}: bf16 {u['bf16']:8.1f} us  "
                f"fp8+torch {u['fp8 torch quant']:8.1f} ({u['bf16'] / u['fp8 torch quant']:.2f}x)  "
                f"fp8+fused {u['fp8 fused quant']:8.1f} ({u['bf16'] / u['fp8 fused quant']:.2f}x)  "
                f"cuBLASLt+rescale {u['fp8 fused, cuBLASLt']:8.1f} ({u['bf16'] / u['fp8 fused, cuBLASLt']:.2f}x)  "
                f"quant {u['quant alone']:6.1f}  GEMM alone {u['fp8 GEMM alone']:6.1f} "
                f"({u['bf16'] / u['fp8 GEMM alone']:.2f}x)",
                flush=True,
            )
    if args.json:  # a list of one record per model: a run appends its own
        path = Path(args.json)
        records = json.loads(path.read_text()) if path.exists() else []
        records.append(dict(model=args.model, device=torch.cuda.get_device_name(), rows=rows))
        path.write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
