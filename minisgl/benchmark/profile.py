"""Where does a decode step's time go? Steady-state decode of ``--batch-size`` requests with
``--prompt-len`` tokens of context, timed per step and broken down with the torch profiler.

    python -m minisgl.benchmark.profile --model Qwen3-0.6B --dummy-weight --batch-size 256 --prompt-len 800

Prints, per batch size (``--batch-size 256,64,16``), the wall time of a step (and tokens/s) next to
the device time of its kernels: when wall time exceeds kernel time, the host is the bottleneck.
Then the top device kernels and host operations of the first batch size's profiled steps.
``--tp N`` profiles rank 0 of N (its kernels include the all-reduces).
``--trace PATH`` writes a Chrome trace of those steps (chrome://tracing).

``--prefill`` times prefill instead: batches of ``--batch-size`` fresh prompts of ``--prompt-len``
random tokens (one prefill batch when they fit the engine's 8,192-token budget), each answered with one
token, then the top kernels of ``--profile-steps`` such batches:

    python -m minisgl.benchmark.profile --model Qwen3-14B --dummy-weight --prefill --batch-size 14 --prompt-len 585
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from torch.profiler import ProfilerActivity, profile

from minisgl import LLM, SamplingParams
from minisgl.engine.config import add_engine_args, engine_kwargs


def kernel_ms(events, steps: int) -> float:
    """Device time of the profiled kernels, per step (0 on a CPU)."""
    device = torch.autograd.DeviceType.CUDA
    return sum(e.self_device_time_total for e in events if e.device_type == device) / 1e3 / steps


def top_ops(events, rows: int) -> str:
    """The profile's table of ops, by device time on a GPU, else by host time."""
    key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    return events.table(sort_by=key, row_limit=rows, max_name_column_width=90)


ENGINE_FLAGS = [
    "model",
    "dummy_weight",
    "dtype",
    "kv_cache_dtype",
    "quantization",
    "page_size",
    "attention_backend",
    "cuda_graph_max_bs",
    "tp_size",
]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-size", default="64", help="one size or a comma-separated list")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--profile-steps", type=int, default=10)
    ap.add_argument("--temperature", type=float, default=0.6)
    add_engine_args(ap, ENGINE_FLAGS)
    ap.add_argument("--communicator", default=None, help="the TP all-reduce (minisgl.distributed.COMMUNICATORS)")
    ap.add_argument("--trace", default=None)
    ap.add_argument("--host-profile", action="store_true", help="also cProfile the host side of a few steps")
    ap.add_argument("--prefill", action="store_true", help="profile prefill batches instead of decode steps")
    args = ap.parse_args(argv)

    sizes = [int(b) for b in str(args.batch_size).split(",")]
    t = time.perf_counter()
    llm = LLM(
        **engine_kwargs(args, ENGINE_FLAGS),
        max_running_requests=max(sizes),
        **({"components": {"communicator": args.communicator}} if args.communicator else {}),
    )
    print(f"engine ready in {time.perf_counter() - t:.1f} s", flush=True)
    sched = llm.scheduler
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def run(n: int) -> float:
        sync()
        t = time.perf_counter()
        for _ in range(n):
            sched.step()
        sync()
        return (time.perf_counter() - t) / n

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    rng = random.Random(0)
    if args.prefill:
        prefill(llm, args, sizes[0], rng, acts, sync)
        return
    # Requests admitted first decode between the prefill chunks of the others, so they need room for
    # those steps too: none may finish before the profiled steps are over (checked below).
    total_steps = args.steps + args.profile_steps * (2 if args.host_profile else 1) + 5
    for i, bs in enumerate(sizes):
        budget = sched.config.max_prefill_length or bs * args.prompt_len
        chunks = -(-bs * args.prompt_len // budget) + bs
        for uid in range(bs):
            prompt = [rng.randrange(0, 10000) for _ in range(args.prompt_len)]
            params = SamplingParams(temperature=args.temperature, max_tokens=total_steps + chunks, ignore_eos=True)
            sched.add(sched.make_request(10**6 * (i + 1) + uid, prompt, params))
        t = time.perf_counter()
        while sched.prefill.has_work:  # prefill everything first
            sched.step()
        print(f"prefill of {bs} x {args.prompt_len} tokens: {time.perf_counter() - t:.1f} s", flush=True)
        run(3)
        waited = sched.wait_seconds
        per_step = run(args.steps)
        waited = (sched.wait_seconds - waited) / args.steps
        with profile(activities=acts) as prof:
            run(args.profile_steps)
        events = prof.key_averages()
        print(
            f"decode: batch {bs}, context ~{args.prompt_len}: {per_step * 1e3:.2f} ms/step wall, "
            f"{kernel_ms(events, args.profile_steps):.2f} ms/step of kernels, "
            f"host busy {(per_step - waited) * 1e3:.2f} ms/step, "
            f"{bs / per_step:,.0f} tok/s  (loop={sched.config.loop}, "
            f"graphs={'on' if sched.engine.graph_runner else 'off'}, attention={sched.engine.attn_backend.name})",
            flush=True,
        )
        print(top_ops(events, 30))
        if args.host_profile:  # where the host's time goes, by Python function
            import cProfile
            import pstats

            with cProfile.Profile() as host:
                run(args.profile_steps)
            pstats.Stats(host).sort_stats("tottime").print_stats(25)
        if len(sched.reqs) != bs:
            raise RuntimeError(f"only {len(sched.reqs)} of {bs} requests were still running at the end")
        if i == 0:
            if cuda:
                print(events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=90))
            if args.trace:
                prof.export_chrome_trace(args.trace)
        for uid in list(sched.reqs):
            sched.abort(uid)
        while sched.has_work:
            sched.step()


def prefill(llm: LLM, args: argparse.Namespace, n: int, rng: random.Random, acts, sync) -> None:
    """Wall time and top kernels of prefilling ``n`` fresh prompts (no prefix-cache hits)."""
    vocab = llm.scheduler.engine.model_config.vocab_size
    params = SamplingParams(temperature=args.temperature, max_tokens=1, ignore_eos=True)

    def once() -> None:
        prompts = [[rng.randrange(0, vocab) for _ in range(args.prompt_len)] for _ in range(n)]
        llm.generate(prompts, params, use_tqdm=False)

    once()  # compiles and plans outside the timing
    sync()
    t = time.perf_counter()
    for _ in range(args.profile_steps):
        once()
    sync()
    wall = (time.perf_counter() - t) / args.profile_steps
    with profile(activities=acts) as prof:
        for _ in range(args.profile_steps):
            once()
        sync()
    events = prof.key_averages()
    print(
        f"prefill: {n} prompts of {args.prompt_len} tokens: {wall * 1e3:.1f} ms wall, "
        f"{kernel_ms(events, args.profile_steps):.1f} ms of kernels "
        f"(attention={llm.scheduler.engine.attn_backend.name})",
        flush=True,
    )
    print(top_ops(events, 25))


if __name__ == "__main__":
    main()
