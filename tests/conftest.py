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
