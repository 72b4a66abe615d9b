"""Online serving benchmark: streaming requests against any OpenAI-compatible server.

    python -m minisgl.benchmark.online --num-requests 64 --request-rate 8        # Poisson, 8 req/s
    python -m minisgl.benchmark.online --num-requests 64 --max-concurrency 16     # closed loop
    python -m minisgl.benchmark.online --base-url http://host:30000/v1 --api chat --json runs.json --plot out.png

Requests arrive as a Poisson process of ``--request-rate`` per second (``inf``: all at once), at
most ``--max-concurrency`` in flight. Prompts are random: token ids on ``/v1/completions`` (exact
lengths, the default), random words on ``/v1/chat/completions``; ``ignore_eos`` makes every answer
exactly ``--output-len`` tokens on servers that support that extension (SGLang, vLLM, minisgl).

Metrics (per request, then mean / p50 / p90 / p99; ``minisgl/benchmark/metrics.py`` defines them):
  TTFT  time to first token: request sent -> first streamed token
  TPOT  time per output token after the first: (E2E - TTFT) / (tokens - 1)
  ITL   inter-token latency: every gap between two streamed chunks (TBT), pooled over requests
  E2E   request sent -> end of its stream
Throughput: completed requests, and output tokens, per second of the whole run. Failed requests are
counted, and left out of every latency. ``--trace PATH`` saves the run's request trace (one record
per request: arrival, chunk times, finish), ``--metrics NAME`` picks the metrics function
(``metrics.METRICS``: lab 12 registers its own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minisgl.benchmark import append_result
from minisgl.benchmark.metrics import METRICS, RequestTrace, percentile, save_trace

WORDS = "time year people way day man thing woman life child world school state family student group".split()


@dataclass
class RequestResult:
    start: float = 0.0  # seconds since the run started
    ttft: float = math.nan
    e2e: float = math.nan
    chunk_times: list[float] = field(default_factory=list)  # arrival of each streamed chunk (s since start)
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def trace(self) -> RequestTrace:
        """This request as the metrics see it: one token time per streamed chunk (a chunk carries one
        step's tokens); a failed request is an aborted one."""
        end = self.e2e if not math.isnan(self.e2e) else (self.chunk_times or [self.start])[-1] - self.start
        return RequestTrace(
            arrival=self.start,
            token_times=list(self.chunk_times),
            finish=self.start + end,
            aborted=not self.ok or not self.chunk_times,
            prompt_tokens=self.prompt_tokens,
        )


def make_prompts(n: int, input_len: int, output_len: int, ratio: float, api: str, seed: int, vocab: int):
    """``n`` (prompt, max_tokens) pairs; lengths uniform in [len * ratio, len]."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ilen = rng.randint(max(1, int(input_len * ratio)), input_len)
        olen = rng.randint(max(1, int(output_len * ratio)), output_len)
        if api == "completions":
            prompt: Any = [rng.randrange(100, vocab) for _ in range(ilen)]
        else:
            prompt = " ".join(rng.choice(WORDS) for _ in range(ilen))
        out.append((prompt, olen))
    return out


def percentiles(xs: list[float]) -> dict[str, float]:
    """mean / p50 / p90 / p99 of the values that are not nan (``metrics.percentile``)."""
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan}
    return {"mean": sum(xs) / len(xs), **{f"p{p}": percentile(xs, p) for p in (50, 90, 99)}}


async def one_request(client, url: str, payload: dict, headers: dict, t0: float, res: RequestResult) -> None:
    res.start = time.perf_counter() - t0
    sent = time.perf_counter()
    try:
        async with client.stream("POST", url, json=payload, headers=headers) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                res.error = f"HTTP {resp.status_code}: {body[:200]}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                if obj.get("error"):
                    res.error = str(obj["error"].get("message", obj["error"]))
                    return
                now = time.perf_counter()
                if obj.get("usage"):
                    res.prompt_tokens = obj["usage"].get("prompt_tokens", 0)
                    res.output_tokens = obj["usage"].get("completion_tokens", res.output_tokens)
                for ch in obj.get("choices") or []:
                    # a completions chunk carries new tokens even when their text is empty (a
                    # split character, a model without tokenizer); a chat chunk's role / finish
                    # markers carry none
                    delta = ch.get("delta") or {}
                    if "text" in ch or (delta.get("content") is not None and not delta.get("role")):
                        if math.isnan(res.ttft):
                            res.ttft = now - sent
                        res.chunk_times.append(now - t0)
        res.e2e = time.perf_counter() - sent
        if not res.output_tokens:  # no usage from this server: count chunks
            res.output_tokens = len(res.chunk_times)
    except Exception as e:  # a benchmark reports failures, it does not stop at the first one
        res.error = f"{type(e).__name__}: {e}"


async def run(args: argparse.Namespace) -> tuple[list[RequestResult], float, str]:
    """Send the workload; returns per-request results, the wall time and the model name."""
    import httpx

    base = args.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout), limits=limits) as client:
        model = args.model
        if model is None:
            r = await client.get(f"{base}/models", headers=headers)
            r.raise_for_status()
            model = r.json()["data"][0]["id"]
        prompts = make_prompts(
            args.num_requests, args.input_len, args.output_len, args.range_ratio, args.api, args.seed, args.vocab_limit
        )
        url = f"{base}/completions" if args.api == "completions" else f"{base}/chat/completions"
        rng = random.Random(args.seed + 1)
        sem = asyncio.Semaphore(args.max_concurrency or len(prompts) or 1)
        results = [RequestResult() for _ in prompts]

        async def limited(payload: dict, res: RequestResult) -> None:
            async with sem:
                await one_request(client, url, payload, headers, t0, res)

        tasks = []
        t0 = time.perf_counter()
        for (prompt, max_tokens), res in zip(prompts, results):
            payload: dict[str, Any] = dict(
                model=model,
                max_tokens=max_tokens,
                temperature=args.temperature,
                stream=True,
                stream_options={"include_usage": True},
                ignore_eos=not args.no_ignore_eos,
            )
            if args.api == "completions":
                payload["prompt"] = prompt
            else:
                payload["messages"] = [{"role": "user", "content": prompt}]
            tasks.append(asyncio.create_task(limited(payload, res)))
            if math.isfinite(args.request_rate):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
    return results, duration, model


def summarize(results: list[RequestResult], duration: float, args: argparse.Namespace, model: str) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    m = METRICS.get(getattr(args, "metrics", "default"))([r.trace() for r in results], duration)
    return dict(
        model=model,
        base_url=args.base_url,
        api=args.api,
        num_requests=len(results),
        completed=m["completed"],
        failed=len(results) - m["completed"],
        errors=sorted({r.error for r in results if r.error})[:5],
        request_rate=args.request_rate if math.isfinite(args.request_rate) else "inf",
        max_concurrency=args.max_concurrency,
        duration_s=duration,
        input_tokens=sum(r.prompt_tokens for r in ok),
        output_tokens=sum(r.output_tokens for r in ok),  # the server's count (usage); chunks may hold several
        **{k: m[k] for k in ("request_throughput", "output_throughput", "ttft_s", "tpot_s", "itl_s", "e2e_s")},
        time=time.strftime("%Y-%m-%d %H:%M:%S"),
        tag=args.tag,
    )


def report(res: dict[str, Any]) -> str:
    lines = [
        f"model {res['model']} at {res['base_url']} ({res['api']}), rate {res['request_rate']} req/s, "
        f"max concurrency {res['max_concurrency'] or 'unlimited'}",
        f"requests: {res['completed']} completed, {res['failed']} failed, in {res['duration_s']:.2f} s",
        f"throughput: {res['request_throughput']:.2f} req/s, {res['output_throughput']:.1f} output tok/s "
        f"({res['output_tokens']} output tokens, {res['input_tokens']} input tokens)",
        f"{'(ms)':<6}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}",
    ]
    for name in ("ttft", "tpot", "itl", "e2e"):
        p = res[f"{name}_s"]
        lines.append(f"{name.upper():<6}" + "".join(f"{p[k] * 1000:>10.1f}" for k in ("mean", "p50", "p90", "p99")))
    for e in res["errors"]:
        lines.append(f"error: {e}")
    return "\n".join(lines)


def plot(results: list[RequestResult], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if r.ok]
    fig, ax = plt.subplots(2, 2, figsize=(11, 8))
    ax[0, 0].hist([r.ttft * 1000 for r in ok], bins=30)
    ax[0, 0].set(title="time to first token", xlabel="ms", ylabel="requests")
    ax[0, 1].hist([(b - a) * 1000 for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])], bins=50)
    ax[0, 1].set(title="inter-token latency", xlabel="ms", ylabel="gaps")
    ax[1, 0].scatter([r.start for r in ok], [r.e2e for r in ok], s=8)
    ax[1, 0].set(title="end-to-end latency by arrival", xlabel="arrival (s)", ylabel="E2E (s)")
    times = sorted(t for r in ok for t in r.chunk_times)
    ax[1, 1].plot(times, range(1, len(times) + 1))
    ax[1, 1].set(title="streamed chunks over time", xlabel="s", ylabel="chunks received")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m minisgl.benchmark.online",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--base-url", default="http://127.0.0.1:1919/v1", help="OpenAI-compatible base URL (with /v1)")
    ap.add_argument("--model", default=None, help="model name to send (default: the first of GET /models)")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--api", choices=["completions", "chat"], default="completions")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--request-rate", type=float, default=math.inf, help="Poisson arrivals per second (default inf)")
    ap.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most (default no limit)")
    ap.add_argument("--input-len", type=int, default=128, help="prompt tokens (completions) or words (chat)")
    ap.add_argument("--output-len", type=int, default=64, help="max_tokens per request")
    ap.add_argument("--range-ratio", type=float, default=1.0, help="lengths are uniform in [len * ratio, len]")
    ap.add_argument("--vocab-limit", type=int, default=10000, help="random prompt token ids are below this")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--no-ignore-eos", action="store_true", help="let answers stop at EOS (lengths vary)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    ap.add_argument("--json", default=None, help="append the result to this JSON file (a list of runs)")
    ap.add_argument("--plot", default=None, help="save latency plots to this image file")
    ap.add_argument("--tag", default="", help="a label stored with the result")
    ap.add_argument("--trace", default=None, help="save the request trace (JSON: one record per request)")
    ap.add_argument("--metrics", default="default", help="the metrics function (minisgl.benchmark.metrics.METRICS)")
    return ap


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.num_requests < 1 or args.request_rate <= 0 or not 0 < args.range_ratio <= 1:
        sys.exit("--num-requests must be >= 1, --request-rate > 0 and --range-ratio in (0, 1]")
    METRICS.get(args.metrics)  # an unknown name fails before any request is sent
    results, duration, model = asyncio.run(run(args))
    if args.trace:
        save_trace(args.trace, [r.trace() for r in results])
    res = summarize(results, duration, args, model)
    print(report(res), flush=True)
    if args.json:
        append_result(args.json, res)
    if args.plot:
        plot(results, args.plot)
        print(f"plot saved to {args.plot}", flush=True)
    return res


if __name__ == "__main__":
    main()
