"""Tiny random models for the swap-in tests, built once and kept in a cache folder.

``tiny_model("llama")`` (4 heads, 2 KV heads, Llama-3 rope scaling) and ``tiny_model("qwen3")``
(per-head q/k norm, head_dim 32 != hidden / heads) are HF folders with the embedded model's
tokenizer. They live in ``$MINISGL_AUTOGRADER_CACHE`` (default: ``<minisgl cache>/autograder``);
``$MINISGL_AUTOGRADER_TINY_LLAMA`` / ``..._QWEN3`` point at ready folders instead (the project's
tests pass their session fixtures this way, so the models are built once per test run).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

VERSION = 1  # bump when the configs below change

_COMMON = dict(
    vocab_size=49152,  # the embedded tokenizer's vocabulary
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    max_position_embeddings=1024,
    num_attention_heads=4,
    num_key_value_heads=2,
    eos_token_id=2,
    bos_token_id=1,
)
CONFIGS = {
    "llama": dict(
        _COMMON,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        # head_dim 16: wavelengths 6..6300 span all three bands of the scaling (high / blend / low)
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=256,
        ),
    ),
    "qwen3": dict(_COMMON, head_dim=32, rope_theta=1e6, tie_word_embeddings=True),
}


def cache_root() -> Path:
    env = os.environ.get("MINISGL_AUTOGRADER_CACHE")
    if env:
        return Path(env)
    from minisgl.models.embedded import cache_dir

    return cache_dir() / "autograder"


def tiny_model(kind: str) -> Path:
    """The folder of the tiny ``kind`` model, building it on first use (a few seconds)."""
    if kind not in CONFIGS:
        raise ValueError(f"unknown tiny model {kind!r}; choose from {sorted(CONFIGS)}")
    given = os.environ.get(f"MINISGL_AUTOGRADER_TINY_{kind.upper()}")
    if given:
        return Path(given)
    out = cache_root() / f"tiny-{kind}-v{VERSION}"
    if (out / ".complete").exists():
        return out
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    build_tiny_model(kind, tmp)
    (tmp / ".complete").write_text("ok")
    try:
        tmp.rename(out)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def build_tiny_model(
    kind: str, path: Path, *, tokenizer: bool = True, max_shard_size: str = "5GB", seed: int = 1234, **overrides
) -> Path:
    """Save a random ``kind`` model (``CONFIGS``, updated with ``overrides``) as an HF folder, with
    a copy of the embedded model's tokenizer unless ``tokenizer=False``. The project's own tests
    build their fixtures with it too."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = AutoConfig.for_model("llama" if kind == "llama" else "qwen3", **{**CONFIGS[kind], **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    # HF's init (std 0.02) gives near-uniform logits; wider weights make greedy choices clear-cut,
    # so tiny numerical differences between correct implementations never flip a token
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 2.0 / p.shape[-1] ** 0.5)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path, max_shard_size=max_shard_size)
    if tokenizer:
        from minisgl.models.embedded import embedded_model_path

        AutoTokenizer.from_pretrained(embedded_model_path()).save_pretrained(path)
    return path
