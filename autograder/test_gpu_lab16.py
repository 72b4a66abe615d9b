"""Lab 16 on a GPU: your kernels compiled by Triton (not interpreted), on the shapes of real models, and the
engine's ``triton`` backend decoding with your ``decode`` inside CUDA graphs (which pass their own partial
buffers) and the overlap loop. Not graded by ``python -m autograder`` (a CPU has no CUDA) and skipped without
CUDA; on a GPU machine run::

    pytest autograder/test_gpu_lab16.py                 # your labs/
    pytest autograder/test_gpu_lab16.py --impl FOLDER   # the lab files in another folder
"""

from __future__ import annotations

import pytest
import torch

from autograder.adapters import lab16 as lab
from autograder.test_lab16_flash_decoding import expect, expect_partial, make_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize(
    "dtype, heads, lens, splits",
    [
        (torch.bfloat16, (16, 8), [1, 700, 2048], 1),  # Qwen3-0.6B's heads
        (torch.bfloat16, (16, 8), [1, 700, 2048], 7),
        (torch.float16, (40, 8), [3000], 32),  # Qwen3-14B's: groups of 5, one long request in 32 parts
        (torch.bfloat16, (32, 8), [64, 129, 5], 3),  # Llama-3.1-8B's
        (torch.float32, (9, 3), [17, 250], 4),  # SmolLM2's groups of 3, float32 (no TF32)
    ],
    ids=lambda v: str(v).replace("torch.", "").replace(" ", ""),
)
def test_compiled_kernels_match_torch(dtype, heads, lens, splits):
    """head_dim 128 (64 for SmolLM2's), pages of 16 scattered over the pool, q from the fused qkv rows."""
    dim = 64 if heads == (9, 3) else 128
    c = make_case(lens, heads=heads, dim=dim, page=16, dtype=dtype, q_layout="qkv rows", seed=sum(lens) + splits)
    expect(c, splits, "compiled")
    if splits > 1:
        expect_partial(c, splits, "compiled, partial buffers given")


@pytest.fixture(scope="module")
def gpu_llama(tmp_path_factory):
    from autograder.models import build_tiny_model

    path = tmp_path_factory.mktemp("lab16-gpu-llama")
    dims = dict(vocab_size=4096, hidden_size=256, num_attention_heads=8, num_key_value_heads=2, head_dim=128)
    return build_tiny_model("llama", path, tokenizer=False, **dims)


def generate(model, backend: str) -> list[list[int]]:
    from minisgl import LLM, SamplingParams

    prompts = [[(7 * i + j) % 4000 + 3 for j in range(20 + 37 * i)] for i in range(10)]
    llm = LLM(str(model), device="cuda", dtype="float32", attention_backend=backend, num_pages=2048,
              cuda_graph_max_bs=16)  # fmt: skip
    try:
        outs = llm.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True), use_tqdm=False)
        return [o.token_ids for o in outs]
    finally:
        llm.shutdown()


def test_engine_with_cuda_graphs_on_your_kernel(gpu_llama):
    """The triton backend with your decode, CUDA graphs and the overlap loop (float32, head_dim 128, 8 query heads
    over 2) generates the torch backend's greedy tokens; the graphs hand your decode their own partial buffers
    (sized for their largest batch) and a part count fixed per captured size."""
    calls = []

    def counted(*args):
        calls.append(args[7])
        return lab.decode(*args)

    with lab.engine_decoding_with(counted):
        got = generate(gpu_llama, "triton")
    want = generate(gpu_llama, "torch")
    assert calls, "the engine never ran your decode"
    assert got == want, f"with your decode the engine generated other tokens: {got} != {want}"
