"""Every seam the course swaps is public and registered by name, and the engine really runs what is
registered: a recording implementation (``seam_impls.py``) selected by its name is called, and the
engine's tokens do not change. Also the scheduler observer's batch events."""

from __future__ import annotations

import bisect
import math

import pytest
import seam_impls
import torch
from seam_impls import CALLS

from minisgl import LLM, SamplingParams
from minisgl.attention import BACKENDS
from minisgl.distributed import COMMUNICATORS, get_communicator
from minisgl.engine import EngineConfig
from minisgl.engine.graph import GRAPH_PLANS, BucketPlan, GraphInputs, graph_batch_sizes
from minisgl.engine.sample import SAMPLERS
from minisgl.kvcache import ALLOCATORS, PREFIX_CACHES, REQ_TABLES
from minisgl.layers import ACTIVATIONS, NORMS, ROTARIES, TP_LAYERS
from minisgl.registry import Registry
from minisgl.scheduler import ADMISSION_POLICIES, CHUNKING_POLICIES, LOOPS, BatchEvent
from minisgl.tokenizer.detokenizer import DETOKENIZERS, text_streams

PROMPTS = [[5, 6, 7, 8, 9], list(range(3, 60)), [5, 6, 7, 8, 9, 10, 11]]
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)

# seam -> (registry, the recording implementation, how the engine is told to use the name)
SEAMS = {
    "sampler": (SAMPLERS, seam_impls.Sampler, "components"),
    "prefix_cache": (PREFIX_CACHES, seam_impls.Cache, "cache_type"),
    "key_compare": (PREFIX_CACHES, seam_impls.KeyCompareCache, "cache_type"),  # the radix cache's prefix_len
    "attention": (BACKENDS, seam_impls.Backend, "attention_backend"),
    "norm": (NORMS, seam_impls.norm, "components"),
    "rotary": (ROTARIES, seam_impls.rotary, "components"),
    "activation": (ACTIVATIONS, seam_impls.activation, "components"),
    "tp_layers": (TP_LAYERS, seam_impls.tp_layers, "components"),
    "allocator": (ALLOCATORS, seam_impls.Allocator, "components"),
    "req_table": (REQ_TABLES, seam_impls.Table, "components"),
    "admission": (ADMISSION_POLICIES, seam_impls.Admission, "components"),
    "chunking": (CHUNKING_POLICIES, seam_impls.Chunking, "components"),
    "loop": (LOOPS, seam_impls.Loop, "components"),
}


def run(model, **engine_args) -> list[list[int]]:
    llm = LLM(str(model), dtype="float32", max_prefill_length=32, **engine_args)
    try:
        return [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_llama):
    return run(tiny_llama)


@pytest.mark.parametrize("seam", sorted(SEAMS))
def test_a_registered_replacement_is_what_runs(seam, tiny_llama, reference):
    registry, impl, how = SEAMS[seam]
    CALLS.clear()
    with registry.registered("recording", impl):
        args = {"components": {seam: "recording"}} if how == "components" else {how: "recording"}
        tokens = run(tiny_llama, **args)
    assert CALLS[seam] > 0, f"the engine never called the registered {seam}"
    assert tokens == reference


def test_the_graph_plan_is_a_registered_seam():
    """The CUDA-graph plan (sizes to capture, a batch's bucket, its padding) is chosen by name like the
    other seams; the engine captures graphs only on a GPU, where test_gpu.py runs a recording plan. The
    default plan gives the sizes, buckets and padding the graph runner always used."""
    assert GRAPH_PLANS.get("default") is BucketPlan
    assert EngineConfig(device="cpu", components={"graph_plan": "mine"}).components.graph_plan == "mine"
    plan = BucketPlan()
    for max_bs in range(1, 300):
        sizes = plan.sizes(max_bs, math.inf, lambda bs: bs)
        assert sizes == graph_batch_sizes(max_bs)
        assert all(plan.bucket(n, sizes) == sizes[bisect.bisect_left(sizes, n)] for n in range(1, max_bs + 1))
    with pytest.raises(ValueError):
        plan.bucket(9, [1, 2, 4, 8])
    # under a budget: max_bs first, then the smallest ones while they fit
    assert plan.sizes(64, 64 + 1 + 2 + 4 + 8 + 5, lambda bs: bs) == [1, 2, 4, 8, 64]
    assert plan.sizes(64, 63, lambda bs: bs) == []
    dtypes = (torch.int32, torch.int64, torch.int64, torch.int64)
    static = GraphInputs(*(torch.full((8,), 7, dtype=d) for d in dtypes))
    plan.pad(static, GraphInputs(*(torch.tensor([1, 2, 3], dtype=d) for d in dtypes)), 4, scratch_slot=99, dummy_row=5)
    assert static.out_loc.tolist() == [1, 2, 3, 99, 7, 7, 7, 7]
    assert static.table_idx.tolist() == [1, 2, 3, 5, 7, 7, 7, 7]
    assert static.input_ids.tolist()[:3] == static.positions.tolist()[:3] == [1, 2, 3]


def test_a_swapped_layer_skips_the_fused_path(tiny_llama):
    """The layers take their fused kernels only for the engine's own math, so a swapped-in norm
    or rotary runs even where a fused kernel exists."""
    from minisgl.layers import RMSNorm, RotaryEmbedding

    assert RMSNorm(8).fusable and not RMSNorm(8, impl=seam_impls.norm).fusable
    assert RotaryEmbedding(8, 16, 1e4).fusable and not RotaryEmbedding(8, 16, 1e4, impl=seam_impls.rotary).fusable


def test_an_unknown_name_lists_the_choices():
    with pytest.raises(ValueError, match=r"unknown sampler 'nope'; choose one of \['default'\]"):
        SAMPLERS.get("nope")
    with pytest.raises(ValueError, match="cannot import 'no_such_module'"):
        SAMPLERS.get("no_such_module:Sampler")
    reg = Registry("thing", {"a": 1}, aliases={"b": "a"})
    assert reg.get("b") == 1 and "b" in reg and reg.names() == ["a"]
    with reg.registered("a", 2):
        assert reg.get("a") == 2
    assert reg.get("a") == 1


def test_a_module_path_reaches_spawned_ranks(tiny_llama, reference):
    """A component given as 'module:attr' is imported by every tensor-parallel rank (the spawned
    ones cannot see what the parent registered at run time); rank 0 is this process."""
    CALLS.clear()
    llm = LLM(str(tiny_llama), dtype="float32", tp_size=2, components={"communicator": "seam_impls:Communicator"})
    try:
        assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)] == reference
        assert isinstance(get_communicator(), seam_impls.Communicator) and CALLS["communicator"] > 0
        assert COMMUNICATORS.get("seam_impls:Communicator") is seam_impls.Communicator
    finally:
        llm.shutdown()


def test_the_server_runs_the_detokenizer_it_is_given(tiny_llama, tmp_path):
    """``--detokenizer module:attr``: the detokenizer process and the API server each import it and
    run it (their logs say so), and the client's text (cut at a stop string) is unchanged."""
    import openai
    from server_utils import REPO, ServerProcess

    assert text_streams("seam_impls:text_streams") is seam_impls.text_streams
    with DETOKENIZERS.registered("recording", seam_impls.text_streams):
        assert text_streams("recording").detokenizer is seam_impls.Detokenizer
    llm = LLM(str(tiny_llama), dtype="float32")
    try:
        ref = llm.generate(["Once upon a time"], SamplingParams(max_tokens=16, ignore_eos=True), use_tqdm=False)[0]
    finally:
        llm.shutdown()
    stop = ref.text[len(ref.text) // 2 :][:3]  # a stop string the answer contains
    args = ["--model", str(tiny_llama), "--dtype", "float32", "--detokenizer", "seam_impls:text_streams"]
    server = ServerProcess(args, tmp_path, env={"PYTHONPATH": str(REPO / "tests")})
    try:
        server.wait_ready()
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        ask = dict(model=tiny_llama.name, prompt="Once upon a time", max_tokens=16, temperature=0)
        r = client.completions.create(**ask, extra_body={"ignore_eos": True})
        assert r.choices[0].text == ref.text
        r = client.completions.create(**ask, stop=[stop], extra_body={"ignore_eos": True})
        assert r.choices[0].text == ref.text[: ref.text.find(stop)] and r.choices[0].finish_reason == "stop"
    finally:
        server.stop()
    logs = server.logs()
    assert "detokenizer ready (seam_impls.Detokenizer)" in logs, logs
    assert "recording detokenizer called" in logs and "recording stop strings called" in logs, logs


def test_the_observer_reports_every_batch(tiny_llama):
    """One event per batch, in order: kind, requests, positions computed, memory, cache hits, times."""
    llm = LLM(str(tiny_llama), dtype="float32", max_prefill_length=32, num_pages=512)
    events: list[BatchEvent] = []
    llm.scheduler.observers.append(events.append)
    try:
        outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
        again = llm.generate(PROMPTS[:1], PARAMS, use_tqdm=False)  # its prompt is cached now
    finally:
        llm.shutdown()
    assert [e.index for e in events] == list(range(len(events)))
    assert events[0].kind == "prefill" and {e.kind for e in events} == {"prefill", "decode"}
    prefill = [e for e in events if e.kind == "prefill"]
    assert all(e.prefill_tokens <= 32 for e in prefill), "the prefill budget holds in every batch"
    computed = sum(e.prefill_tokens for e in prefill)
    assert computed == llm.cache_stats.prefill_tokens
    assert sum(e.hit_tokens for e in prefill) == llm.cache_stats.hit_tokens > 0 == events[0].hit_tokens
    for e in events:
        if e.kind == "decode":
            assert all(end - start == 1 for start, end in zip(e.starts, e.ends))
        assert e.pages_used + e.pages_cached + e.pages_free == 512
        assert e.t_scheduled <= e.t_launched <= e.t_done
    finished = {uid: reason for e in events for uid, reason in e.finished.items()}
    assert len(finished) == len(outs) + len(again) and set(finished.values()) == {"length"}
    decodes = [e for e in events if e.kind == "decode"]
    assert max(len(e.uids) for e in decodes) == len(PROMPTS), "decodes batch every running request"


def test_no_observer_no_events(tiny_llama, monkeypatch):
    """Without observers, no event is ever built (zero cost)."""
    import minisgl.scheduler.events as events

    def fail(*args):
        raise AssertionError("a batch event was built with no observer")

    monkeypatch.setattr(events, "batch_event", fail)
    assert run(tiny_llama)
