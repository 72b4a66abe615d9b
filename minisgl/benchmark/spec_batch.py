"""Speculative decoding at several batch sizes (the H200 rows of docs/speculative-decoding.md): output tokens per second
with and without n-gram drafting, on a workload with repetition, with the acceptance of the same runs.

    python -m minisgl.benchmark.spec_batch --model Qwen3-0.6B --dummy-weight --batch 1 16 64

Each request's prompt is a random 64-token sequence written out ``--copies`` times, so the text so far
holds what n-gram lookup can find. With dummy (random) weights the model's continuation is whatever a
random network emits, so the acceptance rate is a property of this workload and those weights, not of
a real model's text: the rows measure what a verify pass costs and gives at a given acceptance. Greedy,
EOS ignored. Plain and speculative engines live in this process and take turns (one timed run each per
round, after a warm-up round); each row is the median of the rounds. ``tokens_agree`` compares the two
engines' greedy outputs (exact in float32; in bf16 a verify batch's graph has another size than the plain
step's and may round a near-tie differently).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch


def prompts(batch: int, copies: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(batch):
        unit = [rng.randrange(1000, 20000) for _ in range(64)]
        out.append(unit * copies)
    return out


def main() -> None:
    from minisgl import LLM, SamplingParams

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="omitted: the embedded model")
    ap.add_argument("--dummy-weight", action="store_true")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per request")
    ap.add_argument("--copies", type=int, default=4, help="times the 64-token unit is repeated in a prompt")
    ap.add_argument("--k", type=int, default=4, help="--speculative-num-draft-tokens")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    kw = dict(dtype=args.dtype, dummy_weight=args.dummy_weight, max_running_requests=max(args.batch))
    engines = {
        "plain": LLM(args.model, **kw),
        "ngram": LLM(args.model, speculative_algorithm="NGRAM", speculative_num_draft_tokens=args.k, **kw),
    }
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    rows = []
    for b in args.batch:
        work = prompts(b, args.copies)
        rates: dict[str, list[float]] = {e: [] for e in engines}
        counts, outs = [0, 0, 0], {}
        for r in range(args.rounds + 1):  # round 0 warms up (graphs, kernels, caches)
            for name, llm in engines.items():
                s = spec.stats if (spec := llm.scheduler.feature("speculative")) else None
                before = (s.verify_rows, s.draft_tokens, s.accepted_tokens) if s else (0, 0, 0)
                sync()
                t = time.perf_counter()
                res = llm.generate(work, params, use_tqdm=False)
                sync()
                dt = time.perf_counter() - t
                outs[name] = [o.token_ids for o in res]
                if r > 0:
                    rates[name].append(sum(len(o.token_ids) for o in res) / dt)
                    if s:
                        after = (s.verify_rows, s.draft_tokens, s.accepted_tokens)
                        counts = [c + a - x for c, a, x in zip(counts, after, before)]
        n_rows, drafts, acc = counts
        same = sum(x == y for a, b2 in zip(outs["plain"], outs["ngram"]) for x, y in zip(a, b2))
        plain, ngram = statistics.median(rates["plain"]), statistics.median(rates["ngram"])
        row = dict(
            batch=b,
            plain_tok_s=round(plain, 1),
            ngram_tok_s=round(ngram, 1),
            speedup=round(ngram / plain, 3),
            accept_rate=round(acc / drafts, 3) if drafts else 0.0,
            accept_length=round((acc + n_rows) / n_rows, 2) if n_rows else 0.0,
            tokens_agree=f"{same}/{b * args.tokens}",
            runs={e: [round(x, 1) for x in v] for e, v in rates.items()},
        )
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), device=device, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
