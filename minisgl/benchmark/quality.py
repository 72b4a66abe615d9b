"""What a lossy option costs in quality: greedy-token agreement and log-likelihood against a reference.

    python -m minisgl.benchmark.quality --kv-cache-dtype fp8_e4m3          # vs the same model in bf16
    python -m minisgl.benchmark.quality --quantization fp8                 # FP8 weights (W8A8)
    python -m minisgl.benchmark.quality --dtype float32 --reference-dtype bfloat16
    python -m minisgl.benchmark.quality --dtype float32 --quantization int8 --gguf bf16.gguf,q8_0.gguf

Both engines run the embedded model (or ``--model``) on the same inputs:

* **greedy agreement**: 16 chat prompts, 64 greedy tokens each; the share of answers identical to the
  reference's, and the share of tokens generated before an answer first differs (after a split the
  two continue from different text, so later tokens are not compared).
* **log-likelihood**: the mean negative log-likelihood per token of a fixed English passage (~300
  tokens), and how far each token's moved on average (changes of both signs cancel in the mean),
  teacher-forced: one request per prefix with ``max_tokens=1``, whose next-token
  distribution is recorded (its K/V go through the pool: an FP8 cache is read back as it would be).

``--gguf REF,RUN`` adds llama.cpp's passage NLL (through llama-cpp-python, every position's logits of one
evaluation of the passage) for two GGUFs of the same weights: the same change, measured in llama.cpp.

Runs on the CPU (the math is the same on a GPU; only speed needs one).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from statistics import mean

import torch

from minisgl import LLM, SamplingParams

PASSAGE = (
    "A serving engine keeps the keys and values of every token it has seen in a pool of memory, so that "
    "each new token attends to its past without computing it again. The pool is the largest thing on the "
    "device after the weights, and its size decides how many requests can run at once. Storing each value "
    "in eight bits instead of sixteen halves that memory: twice the tokens fit, and a decode step reads "
    "half the bytes. The price is precision. An eight-bit float keeps three bits of mantissa, so a value is "
    "rounded to within about six percent of itself, and anything larger than the format's range must be "
    "clamped. Whether that matters is an empirical question. A model may agree with itself on almost every "
    "greedy token, or a small error in one layer may grow until the answer changes. The only honest way to "
    "know is to measure it on real weights and real text, next to the reference, and to report the numbers "
    "beside the faster ones rather than in their place. Questions worth asking of any such result: how many "
    "answers changed, how early did they change, and how much less likely did the model find a fixed text."
)

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a CPU cache is in two sentences.",
    "List three uses of a paperclip.",
    "What is 17 times 23?",
    "Give me a tip for learning a new language.",
    "Why is the sky blue?",
    "Summarise the plot of Romeo and Juliet.",
    "What does a compiler do?",
    "Suggest a name for a grey cat.",
    "How do plants make food?",
    "Translate 'good morning' into Spanish.",
    "What is the difference between weather and climate?",
    "Describe a sunset in one sentence.",
    "What is a prime number?",
    "Name two benefits of walking every day.",
]


class NextTokenLogProbs:
    """Wraps an engine's sampler: the log-probabilities of each finished prefill's next token, keyed by
    the request's prompt length (every prefix of the passage has its own)."""

    def __init__(self, engine) -> None:
        self.rows: dict[int, torch.Tensor] = {}
        forward, sampler, batches = engine.forward_batch, engine.sampler, []

        def forward_batch(batch, info):
            batches.append(batch)
            return forward(batch, info)

        rows = self.rows

        class Recording:
            def sample(self, logits, info):
                batch = batches.pop()
                logp = torch.log_softmax(logits.float(), dim=-1).cpu()
                for i, keep in enumerate(batch.sample_mask):
                    if keep:  # max_tokens=1: a request's only sample follows its prompt
                        rows[len(batch.reqs[i].input_ids)] = logp[i]
                return sampler.sample(logits, info)

        engine.forward_batch, engine.sampler = forward_batch, Recording()


def measure(model: str | None, dtype: str, kv_cache_dtype: str, quantization: str | None, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    llm = LLM(model, dtype=dtype, kv_cache_dtype=kv_cache_dtype, quantization=quantization)
    try:
        convs = [[{"role": "user", "content": p}] for p in PROMPTS]
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        answers = [o.token_ids for o in llm.chat(convs, params, use_tqdm=False)]
        ids = llm.tokenizer.encode(PASSAGE)
        record = NextTokenLogProbs(llm.scheduler.engine)
        llm.generate([ids[:i] for i in range(1, len(ids))], SamplingParams(max_tokens=1), use_tqdm=False)
        nll = [-float(record.rows[i][ids[i]]) for i in range(1, len(ids))]
    finally:
        llm.shutdown()
    return dict(
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        answers=answers,
        passage_tokens=len(ids) - 1,
        nll=nll,
        seconds=round(time.perf_counter() - t0, 1),
    )


def llama_cpp_nll(gguf: str, text: str) -> list[float]:
    """Per-token NLL of ``text`` under llama.cpp (``ids[1:]`` given their prefixes; the embedded model's
    tokenizer's ids, as minisgl's measure uses)."""
    import numpy as np
    from llama_cpp import Llama

    from minisgl.models.embedded import embedded_model_path
    from minisgl.tokenizer import load_tokenizer

    ids = load_tokenizer(embedded_model_path()).encode(text)
    llm = Llama(gguf, n_ctx=1024, logits_all=True, verbose=False)
    try:
        llm.eval(ids)
        logits = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
    finally:
        llm.close()
    logp = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    return [-float(logp[i - 1, ids[i]]) for i in range(1, len(ids))]


def compare(run: dict, ref: dict) -> dict:
    same = sum(a == b for a, b in zip(run["answers"], ref["answers"]))
    before_split = 0
    for a, b in zip(run["answers"], ref["answers"]):
        before_split += next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
    total = sum(map(len, ref["answers"]))
    return dict(
        identical_answers=f"{same}/{len(ref['answers'])}",
        tokens_before_first_split=round(before_split / total, 3),
        nll=round(mean(run["nll"]), 4),
        reference_nll=round(mean(ref["nll"]), 4),
        nll_change=round(mean(run["nll"]) - mean(ref["nll"]), 4),
        perplexity_ratio=round(math.exp(mean(run["nll"]) - mean(ref["nll"])), 4),
        # the mean hides changes of both signs: how far each token's NLL moved
        mean_abs_token_nll_change=round(mean([abs(a - b) for a, b in zip(run["nll"], ref["nll"])]), 4),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--quantization", default=None, choices=["fp8", "int8", "int4", "auto"])
    ap.add_argument("--gguf", default=None, help="REF,RUN: llama.cpp's NLL change between two GGUFs, beside")
    ap.add_argument("--reference-dtype", default=None, help="the reference's dtype (default: --dtype)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", default=None, help="append the result to this JSON file")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    ref = measure(args.model, args.reference_dtype or args.dtype, "auto", None, args.max_tokens)
    run = measure(args.model, args.dtype, args.kv_cache_dtype, args.quantization, args.max_tokens)
    row = dict(
        model=args.model or "SmolLM2-135M-Instruct (embedded)",
        option=f"--dtype {args.dtype} --kv-cache-dtype {args.kv_cache_dtype}"
        + (f" --quantization {args.quantization}" if args.quantization else ""),
        reference=f"--dtype {ref['dtype']} --kv-cache-dtype auto",
        **compare(run, ref),
        seconds=[ref["seconds"], run["seconds"]],
    )
    if args.gguf:
        ref_gguf, run_gguf = args.gguf.split(",")
        a, b = llama_cpp_nll(ref_gguf, PASSAGE), llama_cpp_nll(run_gguf, PASSAGE)
        row["llama_cpp"] = dict(
            reference=ref_gguf.rsplit("/", 1)[-1],
            run=run_gguf.rsplit("/", 1)[-1],
            nll=round(mean(b), 4),
            reference_nll=round(mean(a), 4),
            nll_change=round(mean(b) - mean(a), 4),
            mean_abs_token_nll_change=round(mean([abs(x - y) for x, y in zip(b, a)]), 4),
        )
    print(json.dumps(row, indent=1))
    if args.json:
        try:
            with open(args.json) as f:
                rows = json.load(f)
        except FileNotFoundError:
            rows = []
        with open(args.json, "w") as f:
            json.dump(rows + [row], f, indent=1)


if __name__ == "__main__":
    main()
