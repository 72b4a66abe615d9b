"""Shared fixtures: tiny random HF models (Llama with rope scaling, Qwen3 with head_dim !=
hidden/heads) saved once per session, and the embedded model's folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Tests share two cores with servers and notebooks: one intra-op thread each avoids stalls.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def gpu_available() -> bool:
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def save_tiny_model(kind: str, path: Path, tokenizer: bool = True, **overrides) -> Path:
    """A random model of the given architecture with a copy of the embedded tokenizer (same
    vocabulary size, so text prompts work through the server too)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        eos_token_id=2,
        bos_token_id=1,
    )
    if kind == "llama":
        cfg = LlamaConfig(
            **{
                **common,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "rope_theta": 10000.0,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 256,
                },
                **overrides,
            }
        )
    elif kind == "qwen3":
        cfg = Qwen3Config(
            **{
                **common,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 32,
                "rope_theta": 1e6,
                "tie_word_embeddings": True,
                **overrides,
            }
        )
    else:
        raise ValueError(kind)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    # HF's default init (std 0.02) gives near-uniform logits; widen it so greedy choices are clear
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.5 / p.shape[-1] ** 0.5 * 4)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
    # the Llama one is saved in several shards (model.safetensors.index.json) to test that path
    model.save_pretrained(path, max_shard_size="2MB" if kind == "llama" else "1GB")
    if tokenizer:
        from transformers import AutoTokenizer

        from minisgl.models.embedded import embedded_model_path

        AutoTokenizer.from_pretrained(embedded_model_path()).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return save_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory) -> Path:
    return save_tiny_model("qwen3", tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="session", params=["llama", "qwen3"])
def tiny_model(request, tiny_llama, tiny_qwen3) -> Path:
    return tiny_llama if request.param == "llama" else tiny_qwen3


@pytest.fixture(scope="session")
def embedded_path() -> Path:
    from minisgl.models.embedded import embedded_model_path

    return embedded_model_path()
