"""Tiny random HF models for the tests (conftest's session fixtures and the tests that need other
shapes, e.g. head_dim 128 for the GPU kernels)."""

from __future__ import annotations

from pathlib import Path

# the tiny models at head_dim 128 (what FlashInfer and the Triton kernels need), for the GPU tests
# and the bf16-vs-float32 test
HEAD_DIM_128 = dict(vocab_size=4096, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=128)


def save_tiny_model(kind: str, path: Path, tokenizer: bool = True, **overrides) -> Path:
    """A random model (``autograder.models.CONFIGS``: Llama with llama3 rope scaling, Qwen3 with
    head_dim != hidden/heads) with a copy of the embedded tokenizer (same vocabulary size, so text
    prompts work through the server too). The Llama one is saved in several shards
    (``model.safetensors.index.json``) to test that path."""
    from autograder.models import build_tiny_model

    shard = "2MB" if kind == "llama" else "5GB"
    return build_tiny_model(kind, path, tokenizer=tokenizer, max_shard_size=shard, **overrides)
