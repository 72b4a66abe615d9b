"""Lab 07, hidden tests: more idle budgets below the busy one (the visible budget test has two such pairs,
where ``min``/``max`` of the two choose wrong), ``fit_cost`` on noisy measurements (the visible ones are exact
or degenerate), and retracted requests readmitted under a small budget and a clock, so their prompt and
outputs are prefilled in several chunks: from a prefix-cache hit of whole 4-token pages, short of where the
prompt ended before (radix), and from nothing (the naive cache). Each calls the lab first, so a stub fails
at once with its hint."""

from __future__ import annotations

import math
import random

from autograder.adapters import lab07 as lab
from autograder.checks import first_token_difference
from autograder.points import engine, points
from autograder.test_lab07_chunking import (
    COST,
    RETRACT_WORKLOAD,
    expect_same_batches,
    play_engine,
    prompts_of,
    run_yours,
    your_class,
)
from minisgl.scheduler.timed import chunk_time, fit_cost


@points(3)
def test_budget_idle_below_busy():
    """An idle budget smaller than the busy one (a configuration may say so): still idle when nothing decodes,
    busy when requests decode."""
    policy = lab.make_policy(COST)
    for busy, idle, n in [(64, 16, 0), (64, 16, 2), (32, 8, 1), (32, 8, 0)]:
        got = policy.budget(busy, idle, n)
        want = busy if n else idle
        assert got == want, (
            f"budget(busy={busy}, idle={idle}, num_decoding={n}) returned {got!r}, expected {want}: choose by "
            "num_decoding (busy if > 0, else idle), not the smaller or larger of the two"
        )


@points(3)
def test_fit_cost_noisy_measurements():
    """Measured extends are noisy (a few percent, as on a busy machine): the least-squares fit of the time
    itself, every sample weighted alike (not of the time per token), as the engine's fit_cost gives it."""
    rng = random.Random(7)
    true = (3e-4, 2e-7)  # seconds per token and per pair: the embedded model on a CPU, roughly
    for _ in range(4):
        samples = []
        for _k in range(12):
            start = rng.choice([0, 0, 64, 256, 1024, 3000])
            n = rng.choice([1, 16, 64, 128, 512])
            t = true[0] * n + true[1] * n * (2 * start + n + 1) / 2
            samples.append((start, start + n, t * rng.uniform(0.9, 1.1)))
        got, want = lab.fit_cost(samples), fit_cost(samples)
        ok = all(
            math.isclose(g, w, rel_tol=1e-6) for g, w in zip((got.per_token, got.per_pair), want.__dict__.values())
        )
        worst = max(abs(chunk_time(got, s, e) - t) for s, e, t in samples)
        assert ok, (
            f"fit_cost of {len(samples)} noisy samples {samples[:3]}... returned {got}, expected {want} (largest "
            f"residual of yours: {worst:.3g} s): least squares of the time itself over (tokens, pairs), each sample "
            "weighted alike (dividing by the tokens weighs short extends more)"
        )


def _retracted_in_chunks(model, cache_type: str, page_size: int, num_pages: int) -> None:
    your_class()
    w = RETRACT_WORKLOAD
    prompts = prompts_of(model, w["lengths"], seed=6)
    roomy = play_engine(model, None, prompts, w["max_tokens"], max_prefill_length=None)
    args = dict(max_prefill_length=8, idle_prefill_length=8, num_pages=num_pages, max_running_requests=6)
    args.update(page_size=page_size)
    want = play_engine(model, None, prompts, w["max_tokens"], cache_type=cache_type, **args)
    assert want.retracted > 0, "the workload no longer makes the engine retract: fix the test"
    got = run_yours(model, prompts, w["max_tokens"], cache_type=cache_type, **args)
    for e in got.events:
        assert e.kind == "decode" or e.prefill_tokens <= 8, (
            f"prefill batch {e.index} computed {e.prefill_tokens} tokens {list(zip(e.uids, e.starts, e.ends))} "
            "(request, start, end) over the budget of 8: a readmitted request continues from its req.cached_len, "
            "not from where it was cut before its retraction (keep no progress of your own)"
        )
    diff = first_token_difference([got.tokens.get(i) for i in range(6)], [roomy.tokens.get(i) for i in range(6)])
    assert diff is None, f"with your policy and {got.retracted} retraction(s) the tokens differ: {diff}"
    expect_same_batches(got, want, f"retracted requests, {cache_type} cache, pages of {page_size}, budget 8")


@points(2, timeout=120)
@engine
def test_engine_retracted_in_chunks_radix(tiny_llama):
    """Retracted requests readmitted with a prefix-cache hit (whole pages of 4 tokens), their prompt and outputs
    prefilled in chunks of at most 8 tokens and a clock."""
    _retracted_in_chunks(tiny_llama, "radix", 4, 38)


@points(2, timeout=120)
@engine
def test_engine_retracted_in_chunks_naive(tiny_llama):
    """Retracted requests readmitted without a prefix cache: everything recomputed, in chunks of 8."""
    _retracted_in_chunks(tiny_llama, "naive", 1, 150)
