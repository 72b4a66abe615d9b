"""The server's pure pieces, without processes: message encoding, incremental detokenization, stop
strings on streamed text, request validation and its error messages."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from minisgl.core import SamplingParams
from minisgl.message import BatchTokenMsg, GenerateMsg, ReadyMsg, ReplyMsg, TokenMsg, decode, encode
from minisgl.server.args import parse_args
from minisgl.server.errors import format_validation_errors
from minisgl.server.generation import Seq
from minisgl.server.protocol import ChatCompletionRequest, CompletionRequest
from minisgl.tokenizer.detokenizer import StopStringCutter

USER = [{"role": "user", "content": "x"}]


def test_messages_round_trip():
    msgs = [
        GenerateMsg(7, [1, 2, 3], SamplingParams(temperature=0.5, stop_token_ids=[9], seed=3, max_tokens=None)),
        BatchTokenMsg([TokenMsg(1, 5), TokenMsg(2, -1, "abort", 4, 2)]),
        ReadyMsg("scheduler", {"max_seq_len": 8192, "nested": {"a": [1, 2]}}),
    ]
    for m in msgs:
        assert decode(encode(m)) == m


def test_incremental_decoder_joins_to_the_full_decode(embedded_path):
    from transformers import AutoTokenizer

    from minisgl.tokenizer.detokenizer import IncrementalDecoder

    tok = AutoTokenizer.from_pretrained(embedded_path)
    rng = random.Random(0)
    text_ids = tok.encode("Héllo wörld — 日本語 🎉 done.\n\n  spaced   out")
    cases = [text_ids] + [[rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 30))] for _ in range(50)]
    for ids in cases:
        dec = IncrementalDecoder(tok)
        pieces = [dec.push([t]) for t in ids] + [dec.flush()]
        assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True), ids
        assert not any(p.endswith("\ufffd") for p in pieces[:-1] if p), "a split character was sent"


@settings(max_examples=300, deadline=None)
@given(
    full=st.text(alphabet="abc", max_size=30),
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=4), max_size=3),
)
def test_stop_strings_on_streamed_text(full, stops):
    """Text streamed one character per reply comes out cut before the first stop string to be
    completed, and nothing that could begin a stop string is sent before it is known not to."""
    seq = Seq(0, 1, StopStringCutter(stops))
    out = ""
    for i, ch in enumerate(full):
        seq.feed(ReplyMsg(1, ch, [i], "length" if i == len(full) - 1 else None))
        out += seq.take_text()
        if seq.finish_reason:
            break
    expect = full
    for n in range(1, len(full) + 1):
        hits = [full[:n].find(s) for s in stops if s in full[:n]]
        if hits:
            expect = full[: min(hits)]
            break
    assert out == expect
    if len(full):
        assert seq.take_finish() == ("stop" if any(s in full for s in stops) else "length")


def test_request_validation_and_defaults():
    r = ChatCompletionRequest(messages=[{"role": "developer", "content": [{"type": "text", "text": "x"}]}])
    assert r.messages[0].as_template_input() == {"role": "system", "content": "x"}
    sp = r.sampling(5)
    assert sp.temperature == 1.0 and sp.top_p == 1.0 and sp.top_k == -1  # OpenAI's defaults
    assert r.stop == [] and r.requested_max_tokens is None
    assert ChatCompletionRequest(messages=USER, max_tokens=3, max_completion_tokens=7).requested_max_tokens == 7
    assert CompletionRequest(prompt=[[1, 2], [3]]).prompts() == [[1, 2], [3]]
    assert CompletionRequest(prompt=[1, 2]).prompts() == [[1, 2]]
    assert CompletionRequest(prompt=["a", "b"], stop="x").stop == ["x"]
    assert CompletionRequest(prompt="a", logprobs=2, echo=True).unsupported_field() is None  # implemented now
    assert CompletionRequest(prompt="a", suffix="b").unsupported_field() == "suffix"
    assert ChatCompletionRequest(messages=USER, presence_penalty=0.5).unsupported_field() == "presence_penalty"
    with pytest.raises(ValidationError) as e:
        ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], top_p=2, max_tokens="3")
    msg, param = format_validation_errors(e.value.errors())
    assert "max_tokens" in msg and "top_p" in msg and param in ("top_p", "max_tokens")


def test_cli_flags_and_aliases():
    a = parse_args(["--tp", "2", "--max-extend-length", "512", "--cache", "naive", "--attn", "torch", "--port", "0"])
    assert a.engine["tp_size"] == 2 and a.engine["max_prefill_length"] == 512
    assert a.engine["cache_type"] == "naive" and a.engine["attention_backend"] == "torch"
    assert a.port == 0 and a.host == "127.0.0.1" and a.engine["model"] is None
    assert parse_args([]).port == 1919
    with pytest.raises(SystemExit):
        parse_args(["--page-size", "0"])


def test_loopback_hosts():
    """Without --api-key, a --host other machines can reach gets a warning at start-up."""
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert parse_args(["--host", host]).loopback_only, host
    for host in ("0.0.0.0", "::", "10.1.2.3", "example.org"):
        assert not parse_args(["--host", host]).loopback_only, host


def test_mini_sglang_spellings_mean_the_same():
    ours = parse_args(["--model", "m", "--tp-size", "2", "--max-seq-len", "99", "--shell", "--attn", "fa3,fi"])
    theirs = parse_args(
        ["--model-path", "m", "--tensor-parallel-size", "2", "--max-seq-len-override", "99", "--shell-mode"]
        + ["--attn", "fa,fi"]
    )
    assert theirs.shell and ours.shell
    assert {**theirs.engine, "attention_backend": ""} == {**ours.engine, "attention_backend": ""}
    from minisgl.attention import resolve_backend_name

    cpu = torch.device("cpu")
    assert resolve_backend_name("fa", cpu) == "fa3" and resolve_backend_name("fa,fi", cpu) == "fa3,fi"


def test_auto_backend_gives_a_float32_model_on_a_gpu_the_torch_backend(monkeypatch):
    """FlashInfer's kernels run in float16/bfloat16 only: ``auto`` picks the torch backend (and its
    page size of 1) for a float32 model on a GPU, instead of a FlashInfer backend that refuses it.
    FlashInfer is reported present, so only the dtype decides (no CUDA call is reached)."""
    import minisgl.attention as attention
    from minisgl.engine.config import FLASHINFER_PAGE_SIZE, EngineConfig

    monkeypatch.setattr(attention, "flashinfer_available", lambda: True)
    gpu = torch.device("cuda", 0)
    assert attention.resolve_backend_name("auto", gpu, dtype=torch.float32) == "torch"
    assert attention.resolve_backend_name("fi", gpu, dtype=torch.float32) == "fi"  # asked for by name: kept
    assert EngineConfig(device="cuda", dtype="float32").page_size == 1
    assert EngineConfig(device="cuda", dtype="bfloat16").page_size == FLASHINFER_PAGE_SIZE


def test_engine_flags_come_from_the_config_fields():
    """One default and one help text per engine setting: the server's and the benchmarks' flags
    are generated from EngineConfig, so they cannot drift from it."""
    from dataclasses import fields

    from minisgl.benchmark import long_prompt, offline, profile
    from minisgl.engine.config import EngineConfig, cli_fields

    defaults = {f.name: f.default for f in fields(EngineConfig)}
    server = {**defaults, "step_time": "auto"}  # the one server-only default: a server bounds its steps in time
    assert parse_args([]).engine == {f.name: server[f.name] for f in cli_fields()}
    for module in (offline, long_prompt, profile):
        with pytest.raises(SystemExit) as e:
            module.main(["--help"])
        assert e.value.code == 0
    ns = offline_args(["--dtype", "float32"])
    for name in offline.ENGINE_FLAGS:
        assert getattr(ns, name) == (defaults[name] if name != "dtype" else "float32"), name


def offline_args(argv):
    """The offline benchmark's parsed arguments, without running it."""
    import argparse

    from minisgl.benchmark import offline
    from minisgl.engine.config import add_engine_args

    ap = argparse.ArgumentParser()
    add_engine_args(ap, offline.ENGINE_FLAGS)
    return ap.parse_args(argv)


def test_environment_is_read_in_one_place():
    """MINISGL_* variables are read by minisgl.env alone; a malformed one names itself."""
    import re
    from pathlib import Path

    from minisgl.env import VARS, Env

    root = Path(__file__).resolve().parents[1] / "minisgl"
    readers = sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if re.search(r"os\.(environ|getenv)\b[^\n]*MINISGL_|MINISGL_[A-Z_]+\"\s*[,)]", p.read_text())
        and p.name != "env.py"
    )
    assert not readers, f"read MINISGL_* outside minisgl/env.py: {readers}"
    env = Env({"MINISGL_FUSED_KERNELS": "0", "MINISGL_SHELL_TOP_K": "5"})
    assert env.fused_kernels is False and env.shell_top_k == 5 and env.disable_overlap_scheduling is False
    with pytest.raises(ValueError, match="MINISGL_SHELL_TOP_K='x' is not a valid integer"):
        Env({"MINISGL_SHELL_TOP_K": "x"})
    lax = Env({"MINISGL_SHELL_TOP_K": "x"}, strict=False)
    assert lax.shell_top_k == -1 and "MINISGL_SHELL_TOP_K" in lax.errors[0]
    assert Env({"MINISGL_KV_STORE": "Triton"}).kv_store == "triton" and Env({}).kv_store == "tvm_ffi"
    with pytest.raises(ValueError, match="MINISGL_KV_STORE='cutlass': expected one of tvm_ffi, triton, torch"):
        Env({"MINISGL_KV_STORE": "cutlass"})
    readme = (root.parent / "docs" / "serving.md").read_text()
    assert all(v.env_name in readme for v in VARS), "the engine manual's environment table lists every variable"


def test_resource_errors_are_logged_once_per_interval():
    """A burst of EMFILE records (asyncio logs one per failed accept, with a traceback) becomes one
    line per interval, the next of which counts those dropped; other records pass untouched."""
    import errno
    import logging

    from minisgl.server.ops.connections import RepeatFilter

    now = [100.0]
    filt = RepeatFilter(every=5.0, clock=lambda: now[0])
    emfile = OSError(errno.EMFILE, "Too many open files")

    def record(msg: str, exc: BaseException | None) -> logging.LogRecord:
        info = (type(exc), exc, None) if exc else None
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, (), info)

    first = record("socket.accept() out of system resource\nsocket: <fd=3>", emfile)
    assert filt.filter(first) and first.exc_info is None
    assert first.getMessage() == "socket.accept() out of system resource: [Errno 24] Too many open files"
    passed = 0
    for _ in range(1000):  # the burst, within one interval
        now[0] += 0.004
        passed += filt.filter(record("socket.accept() out of system resource", emfile))
    assert passed == 0
    other = record("Exception in callback", ValueError("x"))
    assert filt.filter(other) and other.exc_info is not None
    now[0] += 1.0
    nxt = record("socket.accept() out of system resource", emfile)
    assert filt.filter(nxt)
    assert "(1000 more like it in the last 5 s not logged)" in nxt.getMessage()
