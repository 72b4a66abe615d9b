"""Single-stream decode on the CPU: one chat request, its tokens per second after the first, for this
engine and for llama.cpp (through llama-cpp-python) on the same model and prompt.

    python -m minisgl.benchmark.single_stream                       # the embedded model, minisgl
    python -m minisgl.benchmark.single_stream --gguf smollm2-bf16.gguf   # and llama.cpp on its GGUF
    python -m minisgl.benchmark.single_stream --dtypes bfloat16:int4,bfloat16:int8 --gguf q4_1.gguf,q8_0.gguf

The GGUF comes from the same HF folder (``minisgl.models.embedded.embedded_model_path()``) through
llama.cpp's ``convert_hf_to_gguf.py --outtype bf16``. Decode speed excludes the prompt's prefill and the
first token: for llama.cpp ``(n - 1) / (t_n - t_1)`` over the streamed tokens, for minisgl (whose
offline API does not stream) ``n - 1`` tokens over the time of an ``n``-token run less a 1-token run.
Median of ``--repeats`` rounds after a warm-up round, each engine once per round (so drift in a shared
machine's speed hits every engine alike); both greedy on the same prompt ids, ``n`` tokens each (EOS
ignored: minisgl's ``ignore_eos``, llama.cpp's ``generate`` loop, which never checks for it), every core
unless ``--threads`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def decode_rate(stamps: list[float]) -> float:
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def minisgl_runner(dtype: str, tokens: int):
    """``(run, close)``: ``run()`` decodes one chat answer and returns its tokens per second. ``dtype``:
    the engine's dtype, or ``dtype:quantization`` (e.g. ``bfloat16:int4``: weights in 4-bit blocks)."""
    from minisgl import LLM, SamplingParams

    dtype, _, quantization = dtype.partition(":")
    llm = LLM(None, dtype=dtype, quantization=quantization or None)
    ids = llm.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)

    def run() -> float:
        # the offline API has no stream: the decode time is a run of `tokens` less a run of one
        t0 = time.perf_counter()
        llm.generate([ids], SamplingParams(max_tokens=1, ignore_eos=True), use_tqdm=False)
        t1 = time.perf_counter()
        llm.generate([ids], params, use_tqdm=False)
        t2 = time.perf_counter()
        return (tokens - 1) / ((t2 - t1) - (t1 - t0))

    return run, llm.shutdown


def llama_cpp_runner(gguf: str, tokens: int, threads: int):
    """llama.cpp on the same prompt ids (the model's chat template applied by its HF tokenizer, as for
    minisgl), through ``Llama.generate``: llama.cpp's own greedy sampler, and no EOS check (each run
    decodes ``tokens`` tokens), so no per-token Python work beyond the loop's (an EOS ban through
    ``logit_bias`` would run a Python logits processor over the whole vocabulary at every token: it cut
    llama.cpp to a third of its speed on this benchmark)."""
    from llama_cpp import Llama

    from minisgl.models.embedded import embedded_model_path
    from minisgl.tokenizer import apply_chat_template, load_tokenizer

    llm = Llama(gguf, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False, seed=0)
    ids = apply_chat_template(load_tokenizer(embedded_model_path()), [{"role": "user", "content": PROMPT}])

    def run() -> float:
        stamps = []
        for _ in llm.generate(ids, temp=0.0, reset=True):
            stamps.append(time.perf_counter())
            if len(stamps) == tokens:
                break
        return decode_rate(stamps)

    return run, llm.close


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default=None, help="llama.cpp: the model converted to GGUF (several: a,b)")
    ap.add_argument("--dtypes", default="bfloat16,float32", help="minisgl's dtypes to run (dtype:int4 etc.)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    runners = {}
    for dtype in filter(None, args.dtypes.split(",")):
        runners[("minisgl", dtype)] = minisgl_runner(dtype, args.tokens)
    for gguf in filter(None, (args.gguf or "").split(",")):
        runners[("llama.cpp", os.path.basename(gguf))] = llama_cpp_runner(gguf, args.tokens, args.threads)
    rates = {key: [] for key in runners}
    try:
        # rounds, each engine once per round: a shared machine's drift hits every engine alike
        for r in range(args.repeats + 1):
            for key, (run, _) in runners.items():
                rate = run()
                if r > 0:  # round 0 warms up
                    rates[key].append(rate)
    finally:
        for _, close in runners.values():
            close()
    rows = []
    for (engine, what), r in rates.items():
        rows.append({"engine": engine, "dtype" if engine == "minisgl" else "gguf": what})
        rows[-1].update(tok_s=round(statistics.median(r), 1), runs=r)
        print(json.dumps(rows[-1]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "tokens": args.tokens, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
