"""Chunked prefill, measured: a long prompt arrives while 8 requests are decoding.

    python -m minisgl.benchmark.long_prompt                      # embedded model: the default budget, 512, unlimited
    python -m minisgl.benchmark.long_prompt --chunks 512 none --prompt-len 8192
    python -m minisgl.benchmark.long_prompt --chunks auto --step-time 0.5   # steps bounded in time

For each chunk size (``--max-prefill-length``), in a fresh process:
  peak   the memory the forward passes took on top of what was in use before the long prompt
         (GPU: ``torch.cuda.max_memory_allocated``; CPU: the resident set, sampled every ms)
  gap    the longest wait between two tokens of the decoding requests while the prompt is prefilled
  ttft   the long prompt's time to first token
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import threading
import time

import torch

from minisgl.engine.config import add_engine_args


def measure(args: argparse.Namespace, chunk: int | str | None) -> dict:
    from minisgl import LLM, SamplingParams

    llm = LLM(
        args.model,
        dtype=args.dtype,
        max_prefill_length=chunk,
        page_size=args.page_size,
        dummy_weight=args.dummy_weight,
        step_time=args.step_time,
    )
    sched = llm.scheduler
    rng = random.Random(0)
    llm.generate([[rng.randrange(3, 10000) for _ in range(64)]], SamplingParams(max_tokens=2), use_tqdm=False)
    decoders = start_decoders(sched, 8, rng)
    result = long_prompt_during_decodes(sched, [rng.randrange(3, 10000) for _ in range(args.prompt_len)], decoders)
    return dict(
        chunk=chunk,
        step_time=llm.config.step_time,
        prompt_len=args.prompt_len,
        peak_mib=result["peak_bytes"] / 2**20,
        max_gap_ms=result["max_gap_s"] * 1e3,
        ttft_s=result["ttft_s"],
        device="cuda" if torch.cuda.is_available() else "cpu",
    )


def start_decoders(sched, n: int, rng: random.Random, prompt_len: int = 32, max_tokens: int = 1000) -> list[int]:
    """Add ``n`` requests (uids 0..n-1, random ``prompt_len``-token prompts, ``max_tokens`` each, EOS
    ignored) and step until all of them decode; returns their uids."""
    from minisgl import SamplingParams

    decoders = list(range(n))
    for uid in decoders:
        sched.add_request(
            uid,
            [rng.randrange(3, 10000) for _ in range(prompt_len)],
            SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        )
    while sched.num_waiting or sched.prefill.chunked is not None:
        sched.step()
    for _ in range(3):
        sched.step()
    return decoders


def long_prompt_during_decodes(sched, prompt: list[int], decoders: list[int], uid: int = 99) -> dict:
    """Add ``prompt`` (as request ``uid``, one output token) while the requests ``decoders`` decode, and step
    the scheduler until its first token. Returns ``max_gap_s``: the longest wait between two tokens of a
    decoding request (or since its last token, for one that got none); ``ttft_s``: the prompt's time to first
    token; ``peak_bytes``: the memory the forward passes took on top of what was in use before the prompt
    arrived (GPU: ``torch.cuda.max_memory_allocated``; CPU: the resident set, sampled every ms); ``token_times``:
    ``{uid: [perf_counter() of each token]}`` from the prompt's arrival (``t0``) on."""
    from minisgl import SamplingParams

    cuda = torch.cuda.is_available()
    sampler = None if cuda else PeakRSS()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = rss()
    sched.add_request(uid, list(prompt), SamplingParams(max_tokens=1, ignore_eos=True))
    t0 = time.perf_counter()
    last = {u: t0 for u in decoders}
    times: dict[int, list[float]] = {u: [] for u in [*decoders, uid]}
    gap, ttft = 0.0, None
    while ttft is None:
        events = sched.step()
        now = time.perf_counter()
        for ev in events:
            if ev.uid in times:
                times[ev.uid].append(now)
            if ev.uid == uid:
                ttft = now - t0
            elif ev.uid in last:
                gap = max(gap, now - last[ev.uid])
                last[ev.uid] = now
                if ev.finish_reason is not None:  # finished (on a slow machine, before the prompt's
                    del last[ev.uid]  # first token): the time after its last token is no gap
    gap = max([gap] + [now - t for t in last.values()])  # a decoder that got no token at all
    peak = (torch.cuda.max_memory_allocated() if cuda else sampler.stop()) - base  # type: ignore[union-attr]
    return dict(max_gap_s=gap, ttft_s=ttft, peak_bytes=peak, t0=t0, token_times=times)


def rss() -> int:
    """The resident set size of this process, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


class PeakRSS:
    """The highest resident set size seen by a thread that samples it every millisecond (the
    process's own peak counter would include model loading, which can be higher)."""

    def __init__(self):
        self.peak, self._stop = rss(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, rss())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, rss())


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(ap, ["model", "dummy_weight", "dtype", "page_size", "step_time"])
    ap.add_argument("--prompt-len", type=int, default=4096)
    ap.add_argument(
        "--chunks",
        nargs="+",
        default=["auto", "512", "none"],
        help="chunk sizes; 'auto': the default, 'none': unlimited",
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: measure one chunk size
    args = ap.parse_args(argv)
    if args.one is not None:
        chunk = {"none": None, "auto": "auto"}[args.one] if args.one in ("none", "auto") else int(args.one)
        print(json.dumps(measure(args, chunk)))
        return []
    rows = []
    for chunk in args.chunks:  # a fresh process each: peak memory is per process
        cmd = [
            sys.executable,
            "-m",
            "minisgl.benchmark.long_prompt",
            "--one",
            chunk,
            "--prompt-len",
            str(args.prompt_len),
            "--dtype",
            args.dtype,
        ]
        cmd += ["--page-size", str(args.page_size)] if args.page_size else []
        cmd += ["--step-time", str(args.step_time)] if args.step_time is not None else []
        cmd += ["--model", args.model] if args.model else []
        cmd += ["--dummy-weight"] if args.dummy_weight else []
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        r = rows[-1]
        print(
            f"chunk {str(r['chunk']):>9}, step time {r['step_time']}: peak {r['peak_mib']:8.1f} MiB   "
            f"max decode gap {r['max_gap_ms']:8.1f} ms"
            f"   prompt TTFT {r['ttft_s']:.2f} s",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
