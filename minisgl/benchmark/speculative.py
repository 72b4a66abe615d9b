"""Speculative decoding, single stream on the CPU: tokens per second with and without n-gram drafting
(``--speculative-algorithm NGRAM``), on a workload that copies its prompt (a code edit) and on the chat
prompt of ``single_stream.py``, with the acceptance measured in the same runs.

    python -m minisgl.benchmark.speculative --tokens 128 --repeats 5

The engines (plain, n-gram with its default back-off, and n-gram drafting at every step: back-off off,
``--speculative-backoff 0``) live in this process and take turns, one run each per round, after a warm-up
round: a shared machine's drift hits them alike. ``--no-backoff-ab`` leaves the third out. ``--draft-layers L
...`` adds draft-model engines (``STANDALONE``): the embedded model's first ``L`` layers (with its final norm and
LM head) drafting for it, ``0`` the whole model drafting for itself (every greedy draft accepted, up to bf16
rounding: the acceptance's upper bound at a draft model's full cost). ``--llamacpp`` adds llama.cpp (through
llama-cpp-python, on a GGUF of the same weights: ``peers.embedded_gguf``), plain and with its prompt-lookup
decoding (``LlamaPromptLookupDecoding`` as ``draft_model``, ``k`` tokens a step); its lookup row is compared
with its plain row, and llama.cpp reports no acceptance. Decode speed
excludes the prefill and the first token, as in ``single_stream.py``: ``n - 1`` tokens over the time of an
``n``-token run less a 1-token run. Greedy, EOS ignored. Each rate is given per wall second and per CPU
second of the process (all threads): on a shared machine the second is the less noisy. Also reported:
whether a speculative engine's tokens and the plain one's agree
(n-gram: exact in float32 and bfloat16, since the CPU's verify rows are decode steps' arithmetic; a draft
model's dense attention may round a bf16 near-tie differently from the paged one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from minisgl.benchmark.single_stream import PROMPT as CHAT_PROMPT

CODE = '''def moving_average(values, window):
    """The mean of each run of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    result = []
    total = 0.0
    for i, x in enumerate(values):
        total += x
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            result.append(total / window)
    return result
'''
EDIT_PROMPT = (
    "Here is a Python function:\n\n```python\n" + CODE + "```\n\n"
    "Rewrite the whole function with the variable `total` renamed to `running_sum`. Output only the code."
)
WORKLOADS = {"code-edit": EDIT_PROMPT, "chat": CHAT_PROMPT}


def runner(dtype: str, tokens: int, spec: str | None, k: int, backoff: int = 64, draft_layers: int | None = None):
    from minisgl import LLM, SamplingParams
    from minisgl.models.embedded import embedded_model_path
    from minisgl.speculative import DRAFTERS
    from minisgl.speculative.draft_model import DraftModelDrafter
    from minisgl.tokenizer import apply_chat_template

    kw = dict(speculative_algorithm=spec, speculative_num_draft_tokens=k, speculative_backoff=backoff)
    if draft_layers is None:
        llm = LLM(None, dtype=dtype, **kw)
    else:  # the embedded model's first draft_layers layers (0: all) draft for it
        cls = type("FirstLayers", (DraftModelDrafter,), {"num_layers": draft_layers or None})
        with DRAFTERS.registered("bench-first-layers", cls) as name:
            kw.update(speculative_algorithm=name, speculative_draft_model_path=str(embedded_model_path()))
            llm = LLM(None, dtype=dtype, **kw)
    ids = {
        name: apply_chat_template(llm.tokenizer, [{"role": "user", "content": text}])
        for name, text in WORKLOADS.items()
    }

    def run(workload: str) -> tuple[float, float, list[int], tuple[int, int, int]]:
        """tokens per wall second and per CPU second of the process (all its threads: on a loaded machine
        the less noisy of the two), the tokens, and (verify rows, drafts, accepted) during the long run."""
        one = SamplingParams(max_tokens=1, ignore_eos=True)
        clocks = lambda: (time.perf_counter(), time.process_time())
        t0 = clocks()
        llm.generate([ids[workload]], one, use_tqdm=False)
        t1 = clocks()
        s = spec.stats if (spec := llm.scheduler.feature("speculative")) else None
        before = (s.verify_rows, s.draft_tokens, s.accepted_tokens) if s else (0, 0, 0)
        out = llm.generate([ids[workload]], SamplingParams(max_tokens=tokens, ignore_eos=True), use_tqdm=False)
        t2 = clocks()
        after = (s.verify_rows, s.draft_tokens, s.accepted_tokens) if s else (0, 0, 0)
        delta = tuple(a - b for a, b in zip(after, before))
        wall, cpu = ((tokens - 1) / ((t2[i] - t1[i]) - (t1[i] - t0[i])) for i in (0, 1))
        return wall, cpu, out[0].token_ids, delta

    return run, ids  # (run keeps the engine alive)


def llamacpp_runner(dtype: str, tokens: int, k: int, threads: int, ids: dict, lookup: bool):
    """The same runs through llama-cpp-python (greedy, ``tokens`` each: its ``generate`` never stops by
    itself); with ``lookup``, its prompt-lookup decoding drafts ``k`` tokens from 2-token matches."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from minisgl.benchmark.peers import embedded_gguf

    gguf = embedded_gguf("float32" if dtype == "float32" else "bfloat16")
    draft = LlamaPromptLookupDecoding(num_pred_tokens=k) if lookup else None
    kw = dict(n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False, seed=0)
    llm = Llama(str(gguf), draft_model=draft, **kw)

    def run(workload: str) -> tuple[float, float, list[int], tuple[int, int, int]]:
        """Timed from the first token to the last: ``generate`` keeps the KV of a prompt it saw before, so
        a 1-token run would not time a prefill to subtract, as the minisgl runs do."""
        clocks = lambda: (time.perf_counter(), time.process_time())
        out: list[int] = []
        for tok in llm.generate(ids[workload], temp=0.0, top_k=1, reset=True):
            out.append(tok)
            if len(out) == 1:
                t1 = clocks()
            if len(out) == tokens:
                break
        t2 = clocks()
        wall, cpu = ((tokens - 1) / (t2[i] - t1[i]) for i in (0, 1))
        return wall, cpu, out, (0, 0, 0)

    return run, llm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k", type=int, default=4, help="--speculative-num-draft-tokens")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--no-backoff-ab", action="store_true", help="leave out the n-gram engine without back-off")
    ap.add_argument("--no-ngram", action="store_true", help="leave out the n-gram engines")
    ap.add_argument("--draft-layers", type=int, nargs="*", default=[], help="draft-model engines (0: all layers)")
    ap.add_argument("--llamacpp", action="store_true", help="add llama.cpp, plain and with prompt lookup")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    engines = {"plain": runner(args.dtype, args.tokens, None, args.k)}
    if not args.no_ngram:
        engines["ngram"] = runner(args.dtype, args.tokens, "NGRAM", args.k)
    if not (args.no_backoff_ab or args.no_ngram):
        engines["ngram-no-backoff"] = runner(args.dtype, args.tokens, "NGRAM", args.k, backoff=0)
    for n in args.draft_layers:
        engines[f"draft-{n or 'all'}-layers"] = runner(args.dtype, args.tokens, "STANDALONE", args.k, draft_layers=n)
    if args.llamacpp:
        ids = engines["plain"][1]  # the chat-templated prompts: one tokenizer for both
        for name, lookup in (("llamacpp", False), ("llamacpp-lookup", True)):
            engines[name] = llamacpp_runner(args.dtype, args.tokens, args.k, args.threads, ids, lookup)
    spec_engines = [e for e in engines if e != "plain"]
    base_of = lambda e: "llamacpp" if e == "llamacpp-lookup" else "plain"  # what an engine is compared with
    rates = {(w, e): [] for w in WORKLOADS for e in engines}  # (wall, cpu) tokens/s per run
    counts = {(w, e): [0, 0, 0] for w in WORKLOADS for e in spec_engines}
    tokens: dict = {}
    for r in range(args.repeats + 1):  # round 0 warms up
        for w in WORKLOADS:
            for e, (run, _) in engines.items():
                wall, cpu, toks, delta = run(w)
                tokens[(w, e)] = toks
                if r > 0:
                    rates[(w, e)].append((wall, cpu))
                    if e != "plain":
                        counts[(w, e)] = [c + d for c, d in zip(counts[(w, e)], delta)]
    rows = []
    med = lambda w, e, i: statistics.median(x[i] for x in rates[(w, e)])
    for w in WORKLOADS:
        for e in spec_engines:
            n_rows, drafts, acc = counts[(w, e)]
            base = base_of(e)
            same = sum(a == b for a, b in zip(tokens[(w, base)], tokens[(w, e)]))
            row = dict(workload=w, engine=e, baseline=base)
            for i, clock in enumerate(("wall", "cpu")):
                plain, spec = med(w, base, i), med(w, e, i)
                row.update({f"plain_{clock}_tok_s": round(plain, 2), f"spec_{clock}_tok_s": round(spec, 2)})
                row[f"{clock}_speedup"] = round(spec / plain, 2)
            row.update(
                accept_rate=round(acc / drafts, 3) if drafts else 0.0,
                accept_length=round((acc + n_rows) / n_rows, 2) if n_rows else 0.0,
                verify_steps_per_run=round(n_rows / args.repeats, 1),
                tokens_agree=f"{same}/{len(tokens[(w, base)])}",
                runs={x: [(round(a, 2), round(b, 2)) for a, b in rates[(w, x)]] for x in (base, e)},
            )
            if e.startswith("llamacpp"):  # llama-cpp-python does not report its acceptance
                row.update(accept_rate=None, accept_length=None, verify_steps_per_run=None)
            rows.append(row)
            print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "tokens": args.tokens, "k": args.k, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
