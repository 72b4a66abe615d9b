"""Lab 12, hidden tests: streams whose chunks carry several tokens at one time (gaps of 0 are ITL
samples too), and tensor parallelism past the KV heads (replicated: each GPU holds one) and over a
vocabulary that does not divide (the last shard is padded: ceil). Each calls the lab first, so a stub
fails at once with its hint."""

from __future__ import annotations

from autograder.adapters import lab12 as lab
from autograder.points import points
from autograder.test_lab12_benchmark import R, check_bytes, check_trace
from minisgl.models.config import KNOWN_CONFIGS, ModelConfig


@points(5)
def test_tokens_at_the_same_time():
    """Tokens that arrive together (one chunk, several tokens) give ITL samples of 0, kept in the pool."""
    lab.latency_metrics([R(0.0, [1.0])])  # a stub fails here
    trace = [
        R(0.0, [0.5, 0.5, 0.5, 1.0, 1.0, 1.5]),
        R(0.25, [1.0, 1.0], finish=1.25),
        R(0.5, [1.5, 2.0, 2.0, 2.0, 2.5]),
        R(0.75, [1.0, 1.0, 1.0], aborted=True),
    ]
    check_trace(trace, what="a trace of streamed chunks carrying several tokens (gaps of 0)")
    check_trace(trace, duration=3.0, what="a trace of streamed chunks carrying several tokens (gaps of 0)")


@points(5)
def test_tp_beyond_kv_heads_and_odd_vocab():
    """tp = 16 on Llama-3.1-8B (8 KV heads: one replicated per GPU) and a vocabulary of 1,001 over 2 and 4 GPUs."""
    llama = ModelConfig.from_dict(KNOWN_CONFIGS["Llama-3.1-8B"])
    lab.decode_step_bytes(llama, 1, 1)  # a stub fails here
    check_bytes("Llama-3.1-8B", llama, 64, 800, tp=16)
    odd = ModelConfig.from_dict({**KNOWN_CONFIGS["Qwen3-0.6B"], "vocab_size": 1001})
    for tp in (2, 4):
        check_bytes("Qwen3-0.6B with a vocabulary of 1,001", odd, 16, 256, tp=tp)
