"""Prefix-cache hit rate behind a router: one shared-prefix workload sent through each router in turn,
the hits counted on the replicas (their ``/metrics``), each run from flushed caches.

    python -m minisgl --dp 2 --port 30000         # cache-aware router on 30000, replicas on 30001 and 30002
    python -m minisgl --dp 0 --port 30010 --router-policy round_robin \\
        --worker-urls http://127.0.0.1:30001 http://127.0.0.1:30002
    python -m minisgl.benchmark.routing --routers http://127.0.0.1:30000 http://127.0.0.1:30010 \\
        --workers http://127.0.0.1:30001 http://127.0.0.1:30002

The workload: ``--groups`` sessions, each a client of its own running at the same time: a random
prefix (~``--prefix-words`` words) asked ``--per-group`` questions one after another (distinct
suffixes), one output token each. A replica's radix cache holds a prefix once it has computed it, so
the hit rate depends only on where the router sends each request: a session kept on one replica
computes its prefix once; spread over two, twice. The sessions run at once because a router balances
the prefixes it has not seen by load (in-flight requests): sent one at a time, every new prefix would
find both replicas idle and go to the same one. Each round draws new prefixes (``--seed`` + round):
a cache-aware router remembers the prefixes it has routed (flushing the replicas does not clear that),
and would send a repeated one where it went before.
"""

from __future__ import annotations

import argparse
import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

WORDS = (
    "river stone light north cloud paper green silver market engine window garden winter signal harbor copper "
    "forest bridge letter orange island thunder candle mirror velvet rocket meadow canyon lantern pepper".split()
)


def shared_prefix_sessions(
    groups: int, per_group: int, prefix_words: int, suffix_words: int, seed: int = 0
) -> list[list[str]]:
    """``groups`` lists of ``per_group`` prompts; those of a list share one random prefix, and no two
    lists share more than their first word ("Group")."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prefix = f"Group {g}: " + " ".join(rng.choice(WORDS) for _ in range(prefix_words))
        questions = [" ".join(rng.choice(WORDS) for _ in range(suffix_words)) for _ in range(per_group)]
        out.append([f"{prefix}\nQuestion {i}: {q}" for i, q in enumerate(questions)])
    return out


def prompt_counters(workers: list[str], headers: dict[str, str] | None = None) -> list[tuple[float, float]]:
    """Per replica: (prompt tokens, cached prompt tokens) so far, from its Prometheus counters."""
    out = []
    for url in workers:
        text = httpx.get(f"{url}/metrics", headers=headers, timeout=30).text
        values = {}
        for line in text.splitlines():
            name, _, value = line.partition("{")
            if name in ("sglang:prompt_tokens_total", "sglang:cached_tokens_total"):
                values[name] = float(value.rpartition(" ")[2])
        out.append((values["sglang:prompt_tokens_total"], values["sglang:cached_tokens_total"]))
    return out


def flush(workers: list[str], headers: dict[str, str] | None = None, timeout: float = 30.0) -> None:
    """Empty every replica's prefix cache (a replica refuses while requests run: retried)."""
    deadline = time.monotonic() + timeout
    for url in workers:
        while (r := httpx.post(f"{url}/flush_cache", headers=headers, timeout=30)).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url}/flush_cache: {r.status_code} {r.text[:200]}")
            time.sleep(0.2)


def measure(router: str, workers: list[str], sessions: list[list[str]], model: str, api_key: str = "none") -> dict:
    """Run ``sessions`` through ``router`` at once (each one's prompts one after another), from
    flushed caches; returns the hit rate over all replicas, the prompt tokens each replica got, and
    the seconds taken."""
    from openai import OpenAI

    headers = {"Authorization": f"Bearer {api_key}"}
    flush(workers, headers)
    before = prompt_counters(workers, headers)
    client = OpenAI(base_url=f"{router}/v1", api_key=api_key, max_retries=0)

    def session(prompts: list[str]) -> None:
        for p in prompts:
            client.completions.create(model=model, prompt=p, max_tokens=1, temperature=0)

    t = time.perf_counter()
    with ThreadPoolExecutor(len(sessions)) as pool:
        list(pool.map(session, sessions))  # list(): re-raises a session's error
    seconds = time.perf_counter() - t
    after = prompt_counters(workers, headers)
    prompt = [a[0] - b[0] for a, b in zip(after, before)]
    cached = [a[1] - b[1] for a, b in zip(after, before)]
    return dict(router=router, hit_rate=sum(cached) / sum(prompt), prompt_tokens=prompt, seconds=seconds)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routers", nargs="+", required=True, help="routers to compare (each over --workers)")
    ap.add_argument("--workers", nargs="+", required=True, help="the replicas behind them")
    ap.add_argument("--model", default=None, help="the served model's name (default: the router's /v1/models)")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--groups", type=int, default=6, help="sessions, running at once")
    ap.add_argument("--per-group", type=int, default=4)
    ap.add_argument("--prefix-words", type=int, default=120)
    ap.add_argument("--suffix-words", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1, help="the routers take turns, this many times")
    ap.add_argument("--seed", type=int, default=0, help="round r draws its prefixes with seed + r")
    args = ap.parse_args(argv)
    headers = {"Authorization": f"Bearer {args.api_key}"}
    model = args.model or httpx.get(f"{args.routers[0]}/v1/models", headers=headers).json()["data"][0]["id"]
    rows = []
    for r in range(args.rounds):
        shape = (args.groups, args.per_group, args.prefix_words, args.suffix_words)
        sessions = shared_prefix_sessions(*shape, seed=args.seed + r)
        for router in args.routers:
            rows.append(measure(router, args.workers, sessions, model, args.api_key))
            r = rows[-1]
            tokens = ", ".join(f"{t:.0f}" for t in r["prompt_tokens"])
            print(
                f"{router}: cache hit rate {r['hit_rate']:.1%}  prompt tokens per replica [{tokens}]  "
                f"{r['seconds']:.1f} s",
                flush=True,
            )
    return rows


if __name__ == "__main__":
    main()
