"""Where does a decode step's time go? Steady-state decode of ``--batch-size`` requests with
``--prompt-len`` tokens of context, timed per step and broken down with the torch profiler.

    python -m minisgl.benchmark.profile --model Qwen3-0.6B --dummy-weight --batch-size 256 --prompt-len 800

Prints ms per step (and tokens/s) for the engine's loop, then the top device kernels and host
operations of a few profiled steps. ``--trace PATH`` writes a Chrome trace (chrome://tracing).
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from minisgl import LLM, SamplingParams


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--dummy-weight", action="store_true")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--profile-steps", type=int, default=10)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--attention-backend", "--attn", default="auto")
    ap.add_argument("--cuda-graph-max-bs", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--trace", default=None)
    args = ap.parse_args(argv)

    llm = LLM(
        args.model,
        dummy_weight=args.dummy_weight,
        page_size=args.page_size,
        dtype=args.dtype,
        attention_backend=args.attention_backend,
        cuda_graph_max_bs=args.cuda_graph_max_bs,
        max_running_requests=max(args.batch_size, 1),
    )
    sched = llm.scheduler
    rng = random.Random(0)
    total_steps = args.steps + args.profile_steps + 5
    for uid in range(args.batch_size):
        prompt = [rng.randrange(0, 10000) for _ in range(args.prompt_len)]
        req = sched.make_request(
            10**6 + uid,
            prompt,
            SamplingParams(temperature=args.temperature, max_tokens=total_steps + 10, ignore_eos=True),
        )
        sched.add(req)
    while sched.prefill.has_work:  # prefill everything first
        sched.step()
    sched.step()
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def run(n: int) -> float:
        sync()
        t = time.perf_counter()
        for _ in range(n):
            sched.step()
        sync()
        return (time.perf_counter() - t) / n

    run(3)
    per_step = run(args.steps)
    print(
        f"decode: batch {args.batch_size}, context ~{args.prompt_len}: {per_step * 1e3:.2f} ms/step, "
        f"{args.batch_size / per_step:,.0f} tok/s  (overlap={sched.overlap}, "
        f"graphs={'on' if sched.engine.graph_runner else 'off'}, attention={sched.engine.attn_backend.name})"
    )
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        run(args.profile_steps)
    key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=90))
    if torch.cuda.is_available():
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=90))
    if args.trace:
        prof.export_chrome_trace(args.trace)
    for uid in list(sched.reqs):
        sched.abort(uid)


if __name__ == "__main__":
    main()
