"""The decode roofline: how fast a decode step could be if it only had to read its bytes.

A decode step computes one token for each of ``batch_size`` requests. Its matrix products are
matrix-vector products in disguise (a few rows each), so the step's time is bounded below by the
bytes it must read from memory, over the memory bandwidth:

* every weight matrix of every layer (q, k, v, o; gate, up, down) and the LM head
  (``vocab x hidden``), once per step whatever the batch; tied or not, the LM head is read
  (tied, it *is* the embedding table). Norms and biases (< 0.1% of the bytes) and the embedding
  lookup (one row per request) are left out;
* the K and V of every position each request attends to, in every layer:
  ``2 x num_kv_heads x head_dim`` values per position per layer (grouped-query attention: the KV
  heads, not the query heads).

With tensor parallelism over ``tp`` GPUs each reads its shard at the same time: ``num_heads / tp``
query heads, ``ceil(num_kv_heads / tp)`` KV heads (replicated when ``tp > num_kv_heads``),
``intermediate / tp`` MLP columns and ``ceil(vocab / tp)`` LM-head rows; the step takes one GPU's
bytes over one GPU's bandwidth, and produces ``batch_size`` tokens for the group.

``python -m minisgl.benchmark.roofline --model Qwen3-14B --batch-size 256 --context 800`` prints it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import NamedTuple

from minisgl.models.config import ModelConfig


@dataclass(frozen=True)
class GPU:
    name: str
    bandwidth: float  # bytes / s of device memory
    flops: float  # dense bf16 FLOP / s


GPUS = {
    "H200": GPU("H200", 4.8e12, 989e12),
    "H100": GPU("H100 SXM", 3.35e12, 989e12),
    "A100": GPU("A100 80GB", 2.039e12, 312e12),
}


class StepBytes(NamedTuple):
    weights: float  # bytes of weights one GPU reads per decode step
    kv: float  # bytes of K and V one GPU reads per decode step

    @property
    def total(self) -> float:
        return self.weights + self.kv


class Roofline(NamedTuple):
    step_s: float  # the fastest a decode step can be
    tokens_per_s: float  # batch_size tokens per step at that speed


def param_count(cfg: ModelConfig) -> int:
    """The model's parameters (as ``transformers``' ``num_parameters()``): a tied LM head is the
    embedding table, counted once; biases where the config has them."""
    h, d, kv = cfg.hidden_size, cfg.head_dim, cfg.num_kv_heads
    q = cfg.num_heads * d
    attn = h * q + 2 * h * kv * d + q * h + (q + 2 * kv * d + h) * cfg.attention_bias
    mlp = 3 * h * cfg.intermediate_size + (2 * cfg.intermediate_size + h) * cfg.mlp_bias
    norms = 2 * h + 2 * d * cfg.qk_norm
    embed = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    return cfg.num_layers * (attn + mlp + norms) + h + embed


def decode_step_bytes(
    cfg: ModelConfig, batch_size: int, context_len: int, weight_bytes: float = 2, kv_bytes: float = 2, tp: int = 1
) -> StepBytes:
    """Bytes one GPU reads in a decode step of ``batch_size`` requests attending to ``context_len``
    positions each (module docstring); ``weight_bytes`` / ``kv_bytes`` per element (2: bf16, 1: fp8)."""
    h, d = cfg.hidden_size, cfg.head_dim
    q = cfg.num_heads // tp * d
    kv_heads = -(-cfg.num_kv_heads // tp)
    layer = h * q + 2 * h * kv_heads * d + q * h + 3 * h * (cfg.intermediate_size // tp)
    weights = (cfg.num_layers * layer + -(-cfg.vocab_size // tp) * h) * weight_bytes
    kv = batch_size * context_len * cfg.num_layers * 2 * kv_heads * d * kv_bytes
    return StepBytes(weights, kv)


def decode_roofline(
    cfg: ModelConfig,
    gpu: GPU,
    batch_size: int,
    context_len: int,
    weight_bytes: float = 2,
    kv_bytes: float = 2,
    tp: int = 1,
) -> Roofline:
    """The bandwidth bound of a decode step on ``gpu``: one GPU's bytes over its bandwidth."""
    step = decode_step_bytes(cfg, batch_size, context_len, weight_bytes, kv_bytes, tp).total / gpu.bandwidth
    return Roofline(step, batch_size / step)


def main(argv: list[str] | None = None) -> None:
    from minisgl.models.config import KNOWN_CONFIGS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="Qwen3-0.6B", choices=sorted(KNOWN_CONFIGS))
    ap.add_argument("--gpu", default="H200", choices=sorted(GPUS))
    ap.add_argument("--batch-size", default="1,16,64,256", help="one size or a comma-separated list")
    ap.add_argument("--context", type=int, default=800, help="positions each request attends to")
    ap.add_argument("--weight-bytes", type=float, default=2)
    ap.add_argument("--kv-bytes", type=float, default=2)
    ap.add_argument("--tp", type=int, default=1)
    args = ap.parse_args(argv)
    cfg, gpu = ModelConfig.from_dict(KNOWN_CONFIGS[args.model]), GPUS[args.gpu]
    cfg.check_tp_size(args.tp)
    print(f"{args.model} ({param_count(cfg) / 1e9:.2f} B parameters) on {args.tp} x {gpu.name}, context {args.context}")
    for bs in (int(b) for b in args.batch_size.split(",")):
        b = decode_step_bytes(cfg, bs, args.context, args.weight_bytes, args.kv_bytes, args.tp)
        r = decode_roofline(cfg, gpu, bs, args.context, args.weight_bytes, args.kv_bytes, args.tp)
        print(
            f"batch {bs:5}: weights {b.weights / 1e9:7.2f} GB + KV {b.kv / 1e9:7.2f} GB per GPU per step "
            f"-> {r.step_s * 1e3:7.3f} ms, {r.tokens_per_s:10,.0f} tok/s"
        )


if __name__ == "__main__":
    main()
