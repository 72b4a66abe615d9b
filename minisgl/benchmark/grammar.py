"""What constrained decoding costs: the same batch with no constraints, all of it under a JSON
schema, and half of it; the grammar's compile time apart.

    python -m minisgl.benchmark.grammar                                   # CPU, embedded model
    python -m minisgl.benchmark.grammar --model Qwen3-0.6B --dummy-weight --batch-size 64   # GPU

A model without a tokenizer (dummy weights by architecture name) borrows the embedded model's for the
grammar: its masks allow only ids below 49,152, so they cost somewhat less than those of the model's
own tokenizer would (e.g. Qwen's 151,665 tokens); give a model folder with its tokenizer for that.

Every request decodes exactly ``--max-tokens`` tokens: the unconstrained ones ignore EOS, and the
schema (an array of at least 64 objects) cannot end sooner, so every mode does the same work and
throughput (output tokens / wall time, prefill included, from an empty prefix cache) compares the
per-step cost of the mask: the matchers' work on the host, the bitmask's copy and its application.
The modes take turns, ``--rounds`` times, and the median is reported. Compile time is measured
apart, before the runs: the backend's start (once per engine: the import, the tokenizer's
vocabulary tables), the schema, a different one, and the schema again (cached).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

from minisgl.core import SamplingParams
from minisgl.engine.config import add_engine_args, engine_kwargs

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}},
    },
    "required": ["name", "age", "city"],
}
SCHEMA = {"type": "array", "items": PERSON, "minItems": 64}  # never complete within a benchmark's tokens
OTHER = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "year": {"type": "integer"}},
    "required": ["title"],
}
MODES = {"none": 0.0, "half": 0.5, "all": 1.0}  # share of the batch under the schema
ENGINE_FLAGS = ["model", "dummy_weight", "dtype", "page_size", "attention_backend", "max_running_requests", "tp_size"]


def compile_times(llm) -> dict[str, float]:
    """Seconds: the backend's start (importing xgrammar, the tokenizer's vocabulary tables; once per
    engine, with a one-character regex), the benchmark's schema, another schema, the first again."""
    grammar = llm.scheduler.feature("grammar")
    out = {}
    specs = [("backend", ("regex", "a")), ("schema", None), ("another", None), ("cached", None)]
    for (name, spec), schema in zip(specs, (None, SCHEMA, OTHER, SCHEMA)):
        t = time.perf_counter()
        grammar.compile(spec or ("json_schema", json.dumps(schema))).result()
        out[name] = time.perf_counter() - t
    return out


class MaskTimer:
    """Host time spent making and applying the masks (``GrammarManager.masker``'s ``mask``), per step.
    With the overlap loop on a GPU it includes waiting for the previous batch's tokens."""

    def __init__(self, grammar):
        self.seconds, self.calls, make = 0.0, 0, grammar.masker

        def masker(*args):
            mask = make(*args)
            if mask is None:
                return None

            def timed(logits):
                t = time.perf_counter()
                mask(logits)
                if logits.is_cuda:
                    torch.cuda.synchronize()
                self.seconds += time.perf_counter() - t
                self.calls += 1

            return timed

        grammar.masker = masker


def run(llm, prompts: list[list[int]], mode: str, max_tokens: int) -> tuple[float, int]:
    n = round(len(prompts) * MODES[mode])
    free = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    con = SamplingParams(max_tokens=max_tokens, json_schema=json.dumps(SCHEMA))
    params = [con] * n + [free] * (len(prompts) - n)
    llm.scheduler.flush_cache()
    if llm.scheduler.device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    if llm.scheduler.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    assert all(o.finish_reason == "length" for o in outs), "every request should run to max_tokens"
    return seconds, sum(len(o.token_ids) for o in outs)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(ap, ENGINE_FLAGS)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="none,all,half", help="which of none, half, all to run (in this order)")
    ap.add_argument("--json", default=None, help="append the result to this JSON file")
    args = ap.parse_args(argv)
    from minisgl import LLM
    from minisgl.tokenizer import apply_chat_template

    llm = LLM(args.model, **engine_kwargs(args, ENGINE_FLAGS[1:]))
    if llm.tokenizer is None:  # dummy weights by architecture name: grammars need a vocabulary, so the
        from minisgl.models.embedded import embedded_model_path  # embedded model's (its ids < 49,152) stands in

        llm.scheduler.feature("grammar").model_path = embedded_model_path()
    compiled = compile_times(llm)
    print("compile: " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in compiled.items()))
    if llm.tokenizer is not None and getattr(llm.tokenizer, "chat_template", None):
        ask = lambda i: [{"role": "user", "content": f"List people (batch {i}) as a JSON array."}]
        prompts = [apply_chat_template(llm.tokenizer, ask(i)) for i in range(args.batch_size)]
    else:
        prompts = [[100 + i] * 32 for i in range(args.batch_size)]
    modes = args.modes.split(",")
    run(llm, prompts[:2], "half", 4)  # warm-up
    times: dict[str, list[float]] = {m: [] for m in modes}
    tokens, masks = {}, {}
    timer = MaskTimer(llm.scheduler.feature("grammar"))
    for _ in range(args.rounds):  # the modes take turns, so drifting load hits each alike
        for m in modes:
            before = timer.seconds, timer.calls
            s, tokens[m] = run(llm, prompts, m, args.max_tokens)
            times[m].append(s)
            masks.setdefault(m, []).append((timer.seconds - before[0], timer.calls - before[1]))
    res = {
        "compile_s": compiled,
        "batch_size": args.batch_size,
        "max_tokens": args.max_tokens,
        "device": torch.cuda.get_device_name()
        if llm.scheduler.device.type == "cuda"
        else platform.processor() or "cpu",
        "load": os.getloadavg(),
        "modes": {},
    }
    base = statistics.median(times[modes[0]])
    for m in modes:
        med = statistics.median(times[m])
        mask_s, steps = sum(x for x, _ in masks[m]), sum(n for _, n in masks[m])
        per_step = mask_s / steps * 1000 if steps else 0.0
        res["modes"][m] = {"seconds": times[m], "tok_s": tokens[m] / med, "mask_ms_per_step": per_step}
        print(
            f"{m:>5}: {tokens[m]} tokens, median {med:.2f} s = {tokens[m] / med:.1f} tok/s ({med / base:.2f}x time)"
            + (f", masks {per_step:.2f} ms a step ({mask_s / sum(times[m]):.1%} of the time)" if steps else "")
        )
    print(f"load average {res['load'][0]:.1f}")
    if args.json:
        from minisgl.benchmark import append_result

        append_result(args.json, res)
    return res


if __name__ == "__main__":
    main()
