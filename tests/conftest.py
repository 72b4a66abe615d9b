"""Shared fixtures: tiny random HF models (Llama with rope scaling, Qwen3 with head_dim !=
hidden/heads; built by ``tiny_models.py``) saved once per session, and the embedded model's folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tiny_models import save_tiny_model

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
def grading_env(tiny_llama, tiny_qwen3) -> dict:
    """The environment of a grading subprocess: the session's tiny models, one thread each."""
    return {
        **os.environ,
        "MINISGL_AUTOGRADER_TINY_LLAMA": str(tiny_llama),
        "MINISGL_AUTOGRADER_TINY_QWEN3": str(tiny_qwen3),
        "OMP_NUM_THREADS": "1",
    }


@pytest.fixture(scope="session")
def embedded_path() -> Path:
    from minisgl.models.embedded import embedded_model_path

    return embedded_model_path()
