"""Offline throughput: a fixed, seeded workload through ``LLM.generate`` (or HF ``generate``).

    python -m minisgl.benchmark.offline                          # CPU workload, embedded model
    python -m minisgl.benchmark.offline --engine hf              # the same requests through HF
    python -m minisgl.benchmark.offline --engine vllm --vllm-python ~/venv-vllm/bin/python   # vLLM's CPU build
    python -m minisgl.benchmark.offline --engine llamacpp --dtype float32   # llama.cpp, the same weights
    python -m minisgl.benchmark.offline --engine minisgl,hf,vllm --rounds 2 --dtype float32   # taking turns
    python -m minisgl.benchmark.offline --workload nano --model Qwen3-0.6B --dummy-weight   # GPU
    python -m minisgl.benchmark.offline --workload nano --model Qwen3-14B --dummy-weight --tp 2

Workloads:
  nano   the Nano-vLLM benchmark: 256 requests, random.seed(0), prompts of randint(100, 1024)
         token ids randint(0, 10000), max_tokens randint(100, 1024), temperature 0.6, ignore_eos
         (133,966 output tokens)
  cpu    the same shape scaled down: 64 requests, prompts 32-256, outputs 16-128
  shared 64 requests sharing a 512-token prefix + distinct 32-token suffixes, 32 outputs each
  prefix 512 requests sharing a 2,048-token prefix, distinct suffixes of 16-128 tokens, 32-256 outputs
         (temperature 0.6, ignore_eos), all submitted at once: the ideal cache hit rate is reached when
         every request after the first reuses the prefix (issue 55's held-out shape)
  long   256 requests, prompts of 1,024-2,048 tokens, 256-512 outputs (temperature 0.6, ignore_eos):
         ~490k tokens of context at the end, for runs whose KV pool holds a fraction of it at once
         (``--memory-ratio 0.1`` on an H200 with Qwen3-0.6B: ~115k tokens in bf16, twice that in FP8)

Throughput = output tokens / wall time of the whole run (prefill included). A warm-up with the
workload's first two prompts compiles what the run needs; every timed run then starts from an empty
prefix cache. ``--repeats N`` times the workload N times in one process and reports the median.

Peers (``peers.py``): vLLM's CPU build in its own environment, llama.cpp through llama-cpp-python on a
GGUF of the same weights. A comma-separated ``--engine`` list runs each engine in its own process, once
per round for ``--rounds`` rounds, and prints each one's median: the side-by-side tables of docs/benchmarks.md.

``--step-times`` then runs it once more and splits the device's time between prefill batches and
decode batches by batch size (CUDA events around each batch's launch; on a CPU, whose launches are
synchronous, the host clock), plus the idle gaps between batches: where a run's seconds go.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass, replace

import torch

from minisgl.benchmark import append_result, peers
from minisgl.core import SamplingParams
from minisgl.engine.config import add_engine_args, engine_kwargs


@dataclass
class Workload:
    name: str
    prompts: list[list[int]]
    params: list[SamplingParams]

    @property
    def output_tokens(self) -> int:
        return sum(p.max_tokens for p in self.params)


def _random_requests(n: int, prompt_lens: tuple[int, int], output_lens: tuple[int, int], vocab_limit: int):
    """``n`` prompts of random ids and lengths in ``prompt_lens``, then their outputs' lengths in
    ``output_lens`` (temperature 0.6, ignore_eos), from ``random.seed(0)`` in Nano-vLLM's order."""
    random.seed(0)
    prompts = [[random.randint(0, vocab_limit) for _ in range(random.randint(*prompt_lens))] for _ in range(n)]
    lens = [random.randint(*output_lens) for _ in range(n)]
    return prompts, [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=m) for m in lens]


def make_workload(name: str, num_requests: int | None = None, vocab_limit: int = 10000) -> Workload:
    if name == "nano":
        prompts, params = _random_requests(num_requests or 256, (100, 1024), (100, 1024), vocab_limit)
    elif name == "cpu":
        prompts, params = _random_requests(num_requests or 64, (32, 256), (16, 128), vocab_limit)
    elif name == "long":
        prompts, params = _random_requests(num_requests or 256, (1024, 2048), (256, 512), vocab_limit)
    elif name == "shared":
        random.seed(0)
        n = num_requests or 64
        prefix = [random.randint(0, vocab_limit) for _ in range(512)]
        prompts = [prefix + [random.randint(0, vocab_limit) for _ in range(32)] for _ in range(n)]
        params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=32) for _ in range(n)]
    elif name == "prefix":
        random.seed(0)
        n = num_requests or 512
        prefix = [random.randint(0, vocab_limit) for _ in range(2048)]
        prompts = [prefix + [random.randint(0, vocab_limit) for _ in range(random.randint(16, 128))] for _ in range(n)]
        lens = [random.randint(32, 256) for _ in range(n)]
        params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=m) for m in lens]
    else:
        raise ValueError(f"unknown workload {name!r}: nano, cpu, shared, prefix or long")
    return Workload(name, prompts, params)


DECODE_BUCKETS = (16, 64, 128)  # decode batches of <= 16, <= 64, <= 128 and more requests


def batch_times(llm, w: Workload) -> dict[str, dict]:
    """One more run of ``w``, timed batch by batch: ``{bucket: {batches, tokens, busy_s, gap_s}}``
    where busy is from a batch's launch to the end of its sampling and gap the device's idle time
    after it (the host was late)."""
    sched = llm.scheduler
    cuda = sched.device.type == "cuda"
    marks = []  # (kind, batch size, tokens, start, end)
    launch = sched.launch

    def timed(batch, info):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = launch(batch, info)
            end.record()
        else:
            start = time.perf_counter()
            out = launch(batch, info)
            end = time.perf_counter()
        marks.append((batch.is_decode, batch.size, sum(batch.ends) - sum(batch.starts), start, end))
        return out

    elapsed = (lambda a, b: a.elapsed_time(b) / 1e3) if cuda else (lambda a, b: b - a)
    sched.flush_cache()
    sched.launch = timed
    try:
        llm.generate(w.prompts, w.params, use_tqdm=False)
    finally:
        del sched.launch
    sync(sched.device)
    out: dict[str, dict] = {}
    for i, (decode, size, tokens, start, end) in enumerate(marks):
        if decode:
            top = next((b for b in DECODE_BUCKETS if size <= b), None)
            key = f"decode <= {top}" if top else f"decode > {DECODE_BUCKETS[-1]}"
        else:
            key = "prefill"
        row = out.setdefault(key, dict(batches=0, tokens=0, busy_s=0.0, gap_s=0.0))
        row["batches"] += 1
        row["tokens"] += tokens
        row["busy_s"] += elapsed(start, end)
        if i + 1 < len(marks):
            row["gap_s"] += max(0.0, elapsed(end, marks[i + 1][3]))
    return out


def run_minisgl(w: Workload, args: argparse.Namespace, engine_args: dict) -> dict:
    from minisgl import LLM

    llm = LLM(args.model, **engine_args)
    # warm-up with the workload's own sampling parameters, so every JIT kernel it uses compiles here
    llm.generate(w.prompts[:2], [replace(p, max_tokens=4) for p in w.params[:2]], use_tqdm=False)
    seconds = []
    for _ in range(args.repeats):  # each run starts from an empty prefix cache, as the first did
        llm.scheduler.flush_cache()
        llm.scheduler.stats.__init__()
        sync(llm.scheduler.device)
        t = time.perf_counter()
        outs = llm.generate(w.prompts, w.params, use_tqdm=not args.quiet)
        sync(llm.scheduler.device)
        seconds.append(time.perf_counter() - t)
    s = llm.cache_stats
    produced = sum(len(o.token_ids) for o in outs)
    res = dict(
        seconds=statistics.median(seconds),
        seconds_all=seconds,
        output_tokens=produced,
        prefill_tokens=s.prefill_tokens,
        cache_hit_rate=s.hit_rate,
        prompt_tokens=s.prompt_tokens,
    )
    if args.step_times:
        res["step_times"] = batch_times(llm, w)
        for key, r in sorted(res["step_times"].items()):
            print(
                f"{key:>13}: {r['batches']:5} batches, {r['tokens']:7} tokens, busy {r['busy_s']:6.2f} s "
                f"({r['busy_s'] / r['batches'] * 1e3:6.2f} ms each), idle after them {r['gap_s']:5.2f} s"
            )
    llm.shutdown()
    return res


def run_hf(w: Workload, args: argparse.Namespace) -> dict:
    """Static batches of left-padded prompts through HF ``generate``; each batch runs to its
    longest ``max_tokens`` and only the tokens each request asked for are counted."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from minisgl.models.config import KNOWN_CONFIGS
    from minisgl.models.resolve import resolve_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {
        "auto": torch.bfloat16 if device == "cuda" else torch.float32,
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
    }[args.dtype]
    if args.dummy_weight and args.model in KNOWN_CONFIGS:  # the same architecture, random weights
        d = dict(KNOWN_CONFIGS[args.model])
        cfg = AutoConfig.for_model(d.pop("model_type"), **d)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    else:
        path, _ = resolve_model(args.model, False)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    bs = args.hf_batch_size
    n = len(w.prompts) if args.hf_max_requests is None else min(args.hf_max_requests, len(w.prompts))
    sync(device)
    t = time.perf_counter()
    produced = 0
    for i in range(0, n, bs):
        prompts, params = w.prompts[i : min(i + bs, n)], w.params[i : min(i + bs, n)]
        longest = max(map(len, prompts))
        ids = torch.zeros(len(prompts), longest, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, p in enumerate(prompts):
            ids[j, longest - len(p) :] = torch.tensor(p)
            mask[j, longest - len(p) :] = 1
        with torch.inference_mode():
            model.generate(
                ids.to(device),
                attention_mask=mask.to(device),
                do_sample=True,
                temperature=params[0].temperature or 1.0,
                max_new_tokens=max(p.max_tokens for p in params),
                min_new_tokens=max(p.max_tokens for p in params),
                pad_token_id=0,
            )
        produced += sum(p.max_tokens for p in params)
    sync(device)
    return dict(seconds=time.perf_counter() - t, output_tokens=produced, requests=n)


def sync(device) -> None:
    if torch.cuda.is_available() and str(device).startswith("cuda"):
        torch.cuda.synchronize()


ENGINE_FLAGS = [
    "model",
    "dummy_weight",
    "dtype",
    "kv_cache_dtype",
    "quantization",
    "page_size",
    "cache_type",
    "attention_backend",
    "tp_size",
    "max_running_requests",
    "max_prefill_length",
    "step_time",
    "cuda_graph_max_bs",
    "num_pages",
    "memory_ratio",
]


def _without(argv: list[str], *flags: str) -> list[str]:
    """``argv`` less each of ``flags`` and its value (``--flag V`` or ``--flag=V``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        elif not a.startswith(tuple(f + "=" for f in flags)):
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="cpu", choices=["nano", "cpu", "shared", "prefix", "long"])
    ap.add_argument("--num-requests", type=int, default=None)
    ap.add_argument("--engine", default="minisgl", help="minisgl, hf, vllm, llamacpp, or several: minisgl,hf")
    ap.add_argument("--rounds", type=int, default=1, help="with several engines: each once per round")
    ap.add_argument("--vllm-python", default=None, help="the interpreter of an environment with vLLM")
    add_engine_args(ap, ENGINE_FLAGS)
    ap.add_argument("--hf-batch-size", type=int, default=16)
    ap.add_argument("--hf-max-requests", type=int, default=None, help="HF on a subset (it is slow)")
    ap.add_argument("--communicator", default=None, help="the TP all-reduce (minisgl.distributed.COMMUNICATORS)")
    ap.add_argument("--repeats", type=int, default=1, help="time the workload N times (minisgl); report the median")
    ap.add_argument("--step-times", action="store_true", help="then split one more run's time by batch (minisgl)")
    ap.add_argument("--json", default=None, help="append the result to this JSON file")
    ap.add_argument("--tag", default="", help="a label stored with the result")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    engines = [e for e in args.engine.split(",") if e]
    if not engines or any(e not in peers.ENGINES for e in engines):
        ap.error(f"--engine: one or more of {', '.join(peers.ENGINES)}, comma-separated; got {args.engine!r}")
    if len(engines) > 1:
        rest = _without(list(argv if argv is not None else sys.argv[1:]), "--engine", "--rounds", "--json")
        res = {"rows": peers.take_turns(engines, rest, args.rounds), "args": rest, "time": time.strftime("%F %T")}
        if args.json:
            append_result(args.json, res)
        return res
    if args.engine != "minisgl" and args.tp_size != 1:
        ap.error("--tp applies to minisgl only (the peers run on one device)")
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    w = make_workload(args.workload, args.num_requests)
    engine_args = engine_kwargs(args, ENGINE_FLAGS[1:])  # the model is LLM's first argument
    if args.communicator:
        engine_args["components"] = {"communicator": args.communicator}
    runs = {"hf": run_hf, "vllm": peers.run_vllm, "llamacpp": peers.run_llamacpp}
    res = run_minisgl(w, args, engine_args) if args.engine == "minisgl" else runs[args.engine](w, args)
    res["throughput"] = res["output_tokens"] / res["seconds"]
    res.update(
        engine=args.engine,
        workload=w.name,
        requests=res.get("requests", len(w.prompts)),
        model=args.model or "embedded",
        tag=args.tag,
        torch=torch.__version__,
        machine=platform.machine(),
        time=time.strftime("%Y-%m-%d %H:%M:%S"),
        device=torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
        tp=args.tp_size,
        args={k: v for k, v in vars(args).items() if k not in ("json", "quiet")},
    )
    print(
        f"{args.engine} {w.name}: {res['output_tokens']} tokens in {res['seconds']:.2f} s = "
        f"{res['throughput']:.1f} tok/s"
        + (f", cache hit rate {res['cache_hit_rate']:.1%}" if "cache_hit_rate" in res else "")
    )
    if args.json:
        append_result(args.json, res)
    return res


if __name__ == "__main__":
    main()
