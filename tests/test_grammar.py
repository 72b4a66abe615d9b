"""Constrained decoding in the engine: every output of the embedded model under a JSON schema parses
and validates (``jsonschema``), regex outputs full-match, EBNF outputs are in the language; the
unconstrained requests of the same batches keep their greedy tokens; a grammar that cannot be
compiled is refused naming the problem; ``max_tokens`` inside an unfinished structure ends with
"length"; abort and retraction leave no matcher behind."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.core import RequestError
from minisgl.grammar.base import apply_bitmask, pack_bitmask

SCHEMAS = {
    "nested objects": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 16},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                },
                "required": ["city", "zip"],
            },
        },
        "required": ["name", "address"],
    },
    "arrays": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 1, "maxItems": 3}
        },
        "required": ["tags"],
    },
    "enums": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["S", "M", "L"]},
        },
        "required": ["color", "size"],
    },
    "bounded numbers": {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["age", "score"],
    },
    "optional fields": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 20},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
            "note": {"type": "string", "maxLength": 10},
        },
        "required": ["title"],
    },
}
ASK = {
    "nested objects": "Describe a person with a name and an address as JSON.",
    "arrays": "Give three tags for a blog post about cooking, as JSON.",
    "enums": "Pick a t-shirt color and size, as JSON.",
    "bounded numbers": "Give an age and a score as JSON.",
    "optional fields": "Describe a movie as JSON.",
}
REGEXES = [r"\d{3}-\d{4}", r"(yes|no)", r"[A-Z][a-z]{2,8} [A-Z][a-z]{2,8}", r"#[0-9a-f]{6}"]


@pytest.fixture(scope="module")
def llm():
    return LLM(None, max_prefill_length=None)  # the embedded SmolLM2-135M-Instruct


def chat(llm, text: str) -> list[int]:
    from minisgl.tokenizer import apply_chat_template

    return apply_chat_template(llm.tokenizer, [{"role": "user", "content": text}])


def test_json_schemas_regexes_and_unconstrained_neighbours_in_one_batch(llm):
    """One batch: every schema, every regex, and unconstrained requests. The constrained outputs
    are valid; the unconstrained ones are token for token what they are alone."""
    free_prompts = [chat(llm, "Say hello."), chat(llm, "What is 2 + 2?")]
    free_sp = SamplingParams(max_tokens=24)
    alone = [o.token_ids for o in llm.generate(free_prompts, free_sp, use_tqdm=False)]
    prompts, params = [], []
    for name, schema in SCHEMAS.items():
        prompts.append(chat(llm, ASK[name]))
        params.append(SamplingParams(max_tokens=120, json_schema=json.dumps(schema)))
    for rx in REGEXES:
        prompts.append(chat(llm, "Answer briefly."))
        params.append(SamplingParams(max_tokens=30, regex=rx))
    prompts += free_prompts
    params += [free_sp] * len(free_prompts)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for (name, schema), out in zip(SCHEMAS.items(), outs):
        assert out.finish_reason == "stop", f"{name}: {out.text!r} did not finish"
        jsonschema.validate(json.loads(out.text), schema)
    for rx, out in zip(REGEXES, outs[len(SCHEMAS) :]):
        assert out.finish_reason == "stop" and re.fullmatch(rx, out.text), f"{rx}: {out.text!r}"
    assert [o.token_ids for o in outs[-len(free_prompts) :]] == alone


def test_any_json_and_ebnf(llm):
    grammar = 'root ::= "The answer is " ("yes" | "no") "."'
    sps = [SamplingParams(max_tokens=60, json_schema='{"type": "object"}'), SamplingParams(max_tokens=20, ebnf=grammar)]
    outs = llm.generate([chat(llm, 'Return {"ok": true} as JSON.'), chat(llm, "Is water wet?")], sps, use_tqdm=False)
    assert outs[0].finish_reason == "stop" and isinstance(json.loads(outs[0].text), dict), outs[0].text
    assert re.fullmatch(r"The answer is (yes|no)\.", outs[1].text), outs[1].text


def test_max_tokens_inside_a_structure_ends_with_length(llm):
    sp = SamplingParams(max_tokens=5, json_schema=json.dumps(SCHEMAS["nested objects"]))
    out = llm.generate([chat(llm, ASK["nested objects"])], sp, use_tqdm=False)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5
    assert out.text.startswith('{"name": "'), out.text


@pytest.mark.parametrize(
    "params, words",
    [
        (dict(regex="[a-"), "invalid regex"),
        (dict(ebnf="root ::= foo"), 'Rule "foo" is not defined'),
        (dict(json_schema="{not json"), "invalid json_schema"),
        (dict(json_schema='{"type": "strin"}'), 'Unsupported type "strin"'),
        (dict(regex="a", ebnf='root ::= "a"'), "at most one"),
    ],
)
def test_a_grammar_that_does_not_compile_is_refused_naming_the_problem(llm, params, words):
    with pytest.raises(RequestError, match=re.escape(words)) as e:
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, **params), use_tqdm=False)
    assert e.value.param in ("regex", "ebnf", "json_schema")
    assert not llm.scheduler.has_work, "nothing of a refused call is queued"


# ---- the tiny models: mechanics, not quality ---------------------------------------------------
@pytest.mark.parametrize("loop", ["plain", "overlap"])
def test_unconstrained_tokens_do_not_change_with_constrained_neighbours(tiny_llama, loop):
    llm = LLM(str(tiny_llama), dtype="float32", components={"loop": loop}, max_prefill_length=16, debug_checks=True)
    free = [[3 + i] * (5 + 4 * i) for i in range(3)]
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    alone = [o.token_ids for o in llm.generate(free, sp, use_tqdm=False)]
    con = [SamplingParams(max_tokens=12, regex=r"[0-9]{3,20}"), SamplingParams(max_tokens=12, json_schema="{}")]
    outs = llm.generate(free + [[9, 8, 7], [7, 8, 9, 10]], [sp] * 3 + con, use_tqdm=False)
    assert [o.token_ids for o in outs[:3]] == alone
    assert re.fullmatch(r"[0-9]{3,20}", outs[3].text) or (outs[3].finish_reason == "length" and outs[3].text.isdigit())
    assert llm.scheduler.feature("grammar")._reqs == {}, "finished requests release their matchers"


def test_retraction_and_abort_keep_grammars_consistent(tiny_llama):
    """Retracted constrained requests resume their matchers where the kept tokens left them (the
    outputs equal a run with memory to spare); an aborted one releases its matcher."""
    ps = [[3 + i] * (4 + 3 * i) for i in range(6)]
    sp = SamplingParams(max_tokens=40, regex=r"[a-z ]+")
    want = LLM(str(tiny_llama), dtype="float32", page_size=4).generate(ps, sp, use_tqdm=False)
    # the overlap loop: a retracted request's token in flight is dropped, its matcher must not keep it
    small = LLM(str(tiny_llama), dtype="float32", page_size=4, num_pages=30, components={"loop": "overlap"})
    got = small.generate(ps, sp, use_tqdm=False)
    assert small.scheduler.stats.retracted > 0, "the pool was meant to run out"
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert all(re.fullmatch(r"[a-z ]*", g.text) for g in got), [g.text for g in got]
    sched = small.scheduler
    sched.add_request(10_000, [5, 6, 7], SamplingParams(max_tokens=30, regex=r"[a-z]+"))
    for _ in range(3):
        sched.step()
    assert sched.abort(10_000)
    while sched.has_work:
        sched.step()
    assert sched.feature("grammar")._reqs == {}
    sched.check_memory()


def test_bitmask_helpers_agree_with_xgrammar():
    allowed = torch.zeros(70, dtype=torch.bool)
    allowed[[0, 5, 31, 32, 63, 64, 69]] = True
    row = pack_bitmask(allowed)
    assert row.shape == (3,) and row.dtype == torch.int32
    logits = torch.randn(3, 70)
    before = logits.clone()
    apply_bitmask(logits, torch.stack([row, row, row]), [1])
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2]), "other rows untouched"
    assert torch.equal(torch.isfinite(logits[1]), allowed)


def test_tp2_masks_and_scores_like_tp1(tiny_llama):
    """Every rank compiles and steps its own matchers from the replicated commands: a constrained
    request, one with logprobs (prompt too) and a plain one give TP=1's tokens and numbers."""
    ps = [[3, 4, 5, 6], [7] * 9, [11, 12]]
    sps = [
        SamplingParams(max_tokens=10, regex=r"[a-z]{3,12}"),
        SamplingParams(max_tokens=8, ignore_eos=True, logprobs=True, top_logprobs=2, prompt_logprobs_from=0),
        SamplingParams(max_tokens=8, ignore_eos=True),
    ]
    ref = LLM(str(tiny_llama), dtype="float32").generate(ps, sps, use_tqdm=False)
    llm = LLM(str(tiny_llama), dtype="float32", tp_size=2)
    try:
        got = llm.generate(ps, sps, use_tqdm=False)
    finally:
        llm.shutdown()
    assert [g.token_ids for g in got] == [r.token_ids for r in ref]
    assert re.fullmatch(r"[a-z]{3,12}", got[0].text) or got[0].finish_reason == "length"
    assert got[1].logprobs == pytest.approx(ref[1].logprobs, abs=1e-4)
    assert [x[0] for x in got[1].prompt_logprobs] == pytest.approx([x[0] for x in ref[1].prompt_logprobs], abs=1e-4)


@pytest.mark.gpu
def test_on_cuda_masks_leave_neighbours_alone_and_logprobs_match_hf(tiny_llama):
    """On a GPU (the overlap loop, the bitmask copied to the device and applied by xgrammar's
    kernel; float32, so ``auto`` runs the torch backend): unconstrained neighbours keep their greedy
    tokens, constrained rows match their regex, and logprobs equal HF's float32 log_softmax."""
    from hf_ref import hf_model

    llm = LLM(str(tiny_llama), dtype="float32", device="cuda")
    assert llm.config.loop == "overlap"
    free = [[3 + i] * (5 + 4 * i) for i in range(3)]
    sp = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=True, top_logprobs=3, prompt_logprobs_from=0)
    alone = llm.generate(free, sp, use_tqdm=False)
    con = SamplingParams(max_tokens=12, regex=r"[0-9]{3,20}", logprobs=True)
    outs = llm.generate(free + [[9, 8, 7]] * 2, [sp] * 3 + [con] * 2, use_tqdm=False)
    assert [o.token_ids for o in outs[:3]] == [o.token_ids for o in alone]
    assert all(re.fullmatch(r"[0-9]*", o.text) for o in outs[3:])
    for p, o in zip(free, alone):
        with torch.inference_mode():
            ref = hf_model(tiny_llama)(torch.tensor([p + o.token_ids])).logits[0].float().log_softmax(-1)
        want = [float(ref[len(p) - 1 + j, t]) for j, t in enumerate(o.token_ids)]
        assert o.logprobs == pytest.approx(want, abs=2e-3)
        assert [lp for lp, _ in o.prompt_logprobs] == pytest.approx(
            [float(ref[i, p[i + 1]]) for i in range(len(p) - 1)], abs=2e-3
        )
