"""Lab 12 (metrics and the roofline): fixed traces with hand-computed numbers, random traces against
the engine's reference, a trace the engine records on a tiny model under a Poisson load (your
``latency_metrics`` registered as the benchmark's ``--metrics lab12``), and the roofline and parameter
count of the real architectures against the reference.
Run: ``python -m autograder lab12``.

Numbers are compared to a relative 1e-9 (your arithmetic may round in another order); ``nan`` equals
``nan``; counts and byte totals must be equal."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from autograder.adapters import lab12 as lab
from autograder.engine_runs import engine_failure
from autograder.points import engine, points
from minisgl.benchmark import metrics as ref
from minisgl.benchmark import roofline as roof
from minisgl.benchmark.metrics import RequestTrace
from minisgl.models.config import KNOWN_CONFIGS, ModelConfig

REAL = {name: ModelConfig.from_dict(d) for name, d in KNOWN_CONFIGS.items()}
H200 = roof.GPUS["H200"]


def R(arrival, tokens, finish=None, aborted=False):  # noqa: N802  (a trace reads better this way)
    return RequestTrace(arrival, list(tokens), tokens[-1] if finish is None else finish, aborted)


# five requests, times in multiples of 1/4 s so every number is exact (worked out in the comments)
TRACE = [
    R(0.0, [0.5, 0.75, 1.0, 1.25]),  # TTFT 0.5, TPOT 0.25, ITLs .25 .25 .25, E2E 1.25
    R(0.25, [1.0, 2.0]),  # TTFT 0.75, TPOT 1.0, ITL 1.0, E2E 1.75
    R(0.5, [1.5]),  # one token: TTFT 1.0, no TPOT, no ITL, E2E 1.0
    R(0.75, [1.25, 1.5], finish=1.75, aborted=True),  # aborted: counted, nothing else
    R(1.0, [2.0, 2.5, 3.0, 3.5, 4.0, 4.5]),  # TTFT 1.0, TPOT 0.5, ITLs .5 x 5, E2E 3.5
]


# ---- comparing and explaining ------------------------------------------------------------------------------
def differs(want, got, path="result"):
    """``None`` if equal (floats to 1e-9 relative, nan == nan), else where: expected vs got."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or list(got) != list(want):
            shown = list(got) if isinstance(got, dict) else repr(got)
            same_keys = isinstance(got, dict) and sorted(got) == sorted(want)
            return f"{path}: expected the keys {list(want)}, got {shown}" + (
                " (the same keys in another order: the contract states the order)" if same_keys else ""
            )
        for k in want:
            d = differs(want[k], got[k], f"{path}[{k!r}]")
            if d:
                return d
        return None
    if isinstance(want, list | tuple):
        if not isinstance(got, list | tuple) or len(got) != len(want):
            return f"{path}: expected {want!r}, got {got!r}"
        for i, (w, g) in enumerate(zip(want, got)):
            d = differs(w, g, f"{path}[{i}]")
            if d:
                return d
        return None
    if isinstance(want, float) and isinstance(got, int | float) and not isinstance(got, bool):
        if (math.isnan(want) and math.isnan(got)) or math.isclose(want, got, rel_tol=1e-9, abs_tol=1e-12):
            return None
        return f"{path}: expected {want!r}, got {got!r}"
    if isinstance(want, int) and not isinstance(want, bool) and (isinstance(got, bool) or got != want):
        return f"{path}: expected {want!r}, got {got!r}"
    return None if want == got else f"{path}: expected {want!r}, got {got!r}"


def same(want, got) -> bool:
    return differs(want, got) is None


def pitfalls_of_trace(trace, got, duration=None):
    """The pitfall whose (wrong) numbers ``got`` reproduces, if any."""
    done = [r for r in trace if not r.aborted]
    start = min((r.arrival for r in trace), default=0.0)
    guesses = {
        "aborted requests are excluded from every latency and from the output tokens: count them in 'aborted' only": (
            lambda: ref.latency_metrics([RequestTrace(r.arrival, r.token_times, r.finish) for r in trace], duration),
            ("ttft_s", "tpot_s", "itl_s", "e2e_s", "output_tokens", "output_throughput"),
        ),
        "TTFT is measured from the request's own arrival, not from the start of the run": (
            lambda: {"ttft_s": ref.summary([r.token_times[0] - start for r in done])},
            ("ttft_s",),
        ),
        "ITL samples are pooled (every gap of every request is one sample), not averaged per request first": (
            lambda: {
                "itl_s": ref.summary([sum(m.itls) / len(m.itls) for m in map(ref.request_metrics, done) if m.itls])
            },
            ("itl_s",),
        ),
        "gaps of 0 (tokens that arrived together, in one chunk) are ITL samples too: keep every gap": (
            lambda: {"itl_s": ref.summary([g for m in map(ref.request_metrics, done) for g in m.itls if g > 0])},
            ("itl_s",),
        ),
        "TPOT counts only the tokens after the first: (finish - first token) / (n - 1)": (
            lambda: {"tpot_s": ref.summary([(r.finish - r.arrival) / len(r.token_times) for r in done])},
            ("tpot_s",),
        ),
        "TPOT counts only the tokens after the first (n - 1 of them), over the time after the first token": (
            lambda: {"tpot_s": ref.summary([(r.finish - r.token_times[0]) / len(r.token_times) for r in done])},
            ("tpot_s",),
        ),
        "a request of one output token has no TPOT: leave it out of the TPOT samples (not 0)": (
            lambda: {"tpot_s": ref.summary([m.tpot or 0.0 for m in map(ref.request_metrics, done)])},
            ("tpot_s",),
        ),
    }
    for hint, (make, keys) in guesses.items():
        try:
            wrong = make()
        except (ZeroDivisionError, ValueError, IndexError):
            continue
        right = ref.latency_metrics(trace, duration)
        if any(not same(right[k], wrong[k]) and same(wrong[k], got.get(k)) for k in keys if k in wrong):
            return hint
    return None


def check_trace(trace, duration=None, what="the trace", alone=True):
    """Your latency_metrics of ``trace`` against the reference; ``alone``: with the reference's percentile,
    summary and request_metrics (so it earns its points on its own), else with yours."""
    want = ref.latency_metrics(trace, duration)
    if alone:
        with lab.reference_helpers("percentile", "summary", "request_metrics"):
            got = lab.latency_metrics(trace, duration)
    else:
        got = lab.latency_metrics(trace, duration)
    if not isinstance(got, dict):
        raise AssertionError(f"latency_metrics returned {type(got).__name__}, expected a dict with keys {list(want)}")
    d = differs(want, got)
    if d:
        hint = pitfalls_of_trace(trace, got, duration)
        if hint is None and duration is None and not same(want["duration_s"], got.get("duration_s")):
            hint = "without a duration, the span runs from the earliest arrival to the latest finish of all requests"
            hint += " (aborted ones too)"
        if hint is None and list(got) == list(want):
            off = [k for k in want if not same(want[k], got[k])]
            means_agree = lambda k: (  # noqa: E731
                isinstance(want[k], dict)
                and isinstance(got[k], dict)
                and list(got[k]) == list(want[k])
                and same(want[k]["mean"], got[k]["mean"])
            )
            if off and all(means_agree(k) for k in off):
                hint = "the means agree, the percentiles do not: check percentile() (linear interpolation)"
        raise AssertionError(f"latency_metrics of {what} (duration={duration}): {d}" + (f": {hint}" if hint else ""))


# ---- Part A: percentile ---------------------------------------------------------------------------------------
def nearest_rank(xs, p):
    xs = sorted(xs)
    return xs[max(0, math.ceil(p / 100 * len(xs)) - 1)]


def rank_n(xs, p):  # the rank n * p / 100 instead of (n - 1) * p / 100
    xs, k = sorted(xs), len(xs) * p / 100
    lo, hi = min(math.floor(k), len(xs) - 1), min(math.ceil(k), len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - math.floor(k))


def unsorted_linear(xs, p):
    k = (len(xs) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] * (1 - (k - lo)) + xs[hi] * (k - lo)


def check_percentile(xs, p):
    want = ref.percentile(xs, p)
    try:
        got = lab.percentile(xs, p)
    except IndexError as e:
        k = (len(xs) - 1) * p / 100
        why = "the rank is off by one (k = (n - 1) * p / 100, 0-based)"
        if k == int(k):
            why = (
                f"the rank k = {k:g} is a whole number: floor(k) == ceil(k), the value itself, nothing past it to "
                "interpolate with (ceil(k), not floor(k) + 1)"
            )
        raise AssertionError(f"percentile({xs}, {p}) raised IndexError ({e}): {why}") from None
    if same(want, got):
        return
    hint = "sort; k = (n - 1) * p / 100; interpolate linearly between the values at floor(k) and ceil(k)"
    if xs and same(nearest_rank(xs, p), got):
        hint = "that is the nearest-rank percentile; the contract interpolates linearly between the closest ranks"
    elif xs and same(rank_n(xs, p), got):
        hint = "the rank is off by one: k = (n - 1) * p / 100 on 0-based ranks, not n * p / 100"
    elif xs and sorted(xs) != list(xs) and same(unsorted_linear(xs, p), got):
        hint = "sort the values first: ranks count in sorted order"
    raise AssertionError(f"percentile({xs}, {p}): expected {want!r}, got {got!r}: {hint}")


@points(8)
def test_percentile_fixed():
    """Linear interpolation between the closest ranks, on hand-checked lists; nan when empty."""
    cases = [
        ([1.0, 2.0, 3.0, 4.0], 50),  # rank 1.5: 2.5
        ([1.0, 2.0, 3.0, 4.0], 90),  # rank 2.7: 3.7
        ([10.0, 20.0, 30.0, 40.0, 50.0], 99),  # rank 3.96: 49.6
        ([5.0, 1.0, 4.0, 2.0, 3.0], 25),  # unsorted input, rank 1: 2.0
        ([7.0], 99),
        ([3.0, 1.0, 2.0], 0),
        ([3.0, 1.0, 2.0], 100),
        ([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 51.2], 90),  # rank 8.1
    ]
    for xs, p in cases:
        check_percentile(xs, p)
    got = lab.percentile([], 50)
    assert isinstance(got, float) and math.isnan(got), f"percentile([], 50): expected nan (no values), got {got!r}"


@points(4)
def test_percentile_random():
    """Random lists and percentiles against the reference."""
    lab.percentile([1.0], 50)  # a stub fails here
    _percentile_random()


@settings(max_examples=80, phases=[Phase.explicit, Phase.generate])
@given(
    xs=st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=40),
    p=st.one_of(st.sampled_from([0.0, 50.0, 90.0, 99.0, 100.0]), st.floats(0, 100)),
)
def _percentile_random(xs, p):
    check_percentile(xs, p)


@points(3)
def test_summary():
    """mean, p50, p90, p99 in that order; all nan without values."""
    xs = [0.25, 1.0, 0.5, 0.75, 2.0]
    want, got = ref.summary(xs), lab.summary(xs)
    d = differs(want, got)
    assert d is None, f"summary({xs}): {d}"
    want, got = ref.summary([]), lab.summary([])
    assert isinstance(got, dict) and list(got) == list(want) and all(math.isnan(v) for v in got.values()), (
        f"summary([]): expected {want} (no samples: every statistic nan), got {got!r}"
    )


# ---- Part A: one request ------------------------------------------------------------------------------------
def check_request(req, what):
    want, got = ref.request_metrics(req), lab.request_metrics(req)
    fields = ("ttft", "tpot", "itls", "e2e")
    try:
        got = tuple(got)
    except TypeError:
        raise AssertionError(
            f"request_metrics returned {got!r}; expected RequestMetrics(ttft, tpot, itls, e2e)"
        ) from None
    for name, w, g in zip(fields, want, got):
        d = differs(w, g, name)
        if d is None:
            continue
        hint = {
            "ttft": "TTFT is measured from the request's own arrival: token_times[0] - arrival",
            "e2e": "E2E is finish - arrival",
            "itls": "the ITLs are the gaps between consecutive token times",
        }.get(name, "")
        n = len(req.token_times)
        if name == "tpot":
            if w is None:
                hint = "a request of one output token has no TPOT: return None"
            elif g is None and n == 2:
                hint = "a request of two output tokens has a TPOT, (finish - first token) / 1: n >= 2, not n > 2"
            elif n and same((req.finish - req.arrival) / n, g) or same((req.finish - req.token_times[0]) / n, g):
                hint = "TPOT counts only the tokens after the first: (finish - first token) / (n - 1)"
            else:
                hint = "TPOT = (finish - token_times[0]) / (n - 1)"
        raise AssertionError(f"request_metrics of {what}: {d}: {hint}")


@points(5)
def test_request_ttft_e2e():
    """TTFT from the request's own arrival, E2E to its finish."""
    check_request(R(0.25, [1.0, 2.0]), "a request sent at 0.25 s, tokens at 1.0 and 2.0 s")
    check_request(R(3.0, [3.5, 3.75], finish=4.0), "a request sent at 3 s whose stream ended at 4 s")


@points(7)
def test_request_tpot_itls():
    """TPOT over the tokens after the first; ITLs are the gaps; one token: no TPOT, no ITL."""
    check_request(R(0.0, [0.5, 0.75, 1.0, 1.25]), "a request of 4 tokens")
    check_request(R(1.0, [2.0, 2.5, 3.0, 3.5, 4.0, 4.5], finish=4.75), "a request of 6 tokens ending after its last")
    check_request(R(0.5, [1.5]), "a request of one output token")
    check_request(R(0.0, [0.5, 1.0], finish=1.5), "a request of two output tokens (TPOT needs n >= 2: it has one)")


# ---- Part A: a trace ---------------------------------------------------------------------------------------
@points(10)
def test_trace_latencies():
    """TTFT, TPOT, pooled ITL and E2E of a hand-made trace with an aborted and a one-token request."""
    check_trace(TRACE, what="the five-request trace (one aborted, one of a single token)")
    with lab.reference_helpers("percentile", "summary", "request_metrics"):
        got = lab.latency_metrics(TRACE)
    assert same(4.25 / 9, got["itl_s"]["mean"]), (
        f"the mean ITL of the trace is 4.25 / 9 (9 gaps pooled), got {got['itl_s']['mean']!r}: ITL samples are pooled"
    )
    # a stream's chunk may carry several tokens: their gaps of 0 are samples like any other
    chunked = [R(0.0, [0.5, 0.5, 0.75, 0.75, 1.0]), R(0.25, [1.0, 1.0]), R(0.5, [1.0, 2.0])]
    check_trace(chunked, what="a trace of chunks carrying two tokens at one time (ITL gaps of 0)")


@points(8)
def test_trace_counts_and_throughput():
    """Completed and aborted counts, output tokens of completed requests, the duration (given, or the
    span of all requests) and the throughputs."""
    with lab.reference_helpers("percentile", "summary", "request_metrics"):
        got = lab.latency_metrics(TRACE)
    heads = {k: got.get(k) for k in ("completed", "aborted", "output_tokens", "duration_s")}
    want = {"completed": 4, "aborted": 1, "output_tokens": 13, "duration_s": 4.5}
    if heads != want:
        hint = ""
        if heads.get("output_tokens") == 15:
            hint = ": the aborted request's 2 tokens are not output tokens (aborted requests count in 'aborted' only)"
        elif heads.get("duration_s") not in (None, 4.5):
            hint = ": without a duration, the span runs from the earliest arrival to the latest finish of all requests"
        raise AssertionError(f"latency_metrics of the five-request trace: expected {want}, got {heads}{hint}")
    check_trace(TRACE, what="the five-request trace")
    check_trace(TRACE, duration=5.0, what="the five-request trace")
    # the span counts the aborted request: here it ends last
    late = TRACE[:3] + [R(0.75, [1.25], finish=6.0, aborted=True)]
    check_trace(late, what="a trace whose last event is an abort")


@points(6)
def test_trace_edge_cases():
    """An empty trace, a trace of aborted requests only, one-token requests only, a zero duration."""
    cases = {
        "an empty trace": [],
        "a trace of aborted requests only": [R(0.0, [0.5], finish=0.75, aborted=True), R(0.25, [], 0.5, True)],
        "one-token requests only": [R(0.0, [0.5]), R(0.25, [1.0])],
        "one request": [R(0.5, [0.75, 1.0, 1.5])],
        "a request whose token came at its arrival (a span of 0)": [R(1.0, [1.0], finish=1.0)],
    }
    runs = [(what, trace, None) for what, trace in cases.items()]
    # a throughput is nan when the duration is not positive: exactly 0, and below
    runs += [("the five-request trace", TRACE, 0.0), ("the five-request trace", TRACE, -1.0)]
    for what, trace, duration in runs:
        try:
            check_trace(trace, duration=duration, what=what)
        except (ZeroDivisionError, ValueError, IndexError) as e:
            raise AssertionError(
                f"latency_metrics of {what} (duration={duration}) raised {type(e).__name__}: {e}: without samples a "
                "statistic is nan, and a throughput over a duration that is not positive (0 included) is nan"
            ) from None


def random_trace(seed: int) -> list[RequestTrace]:
    rng = random.Random(seed)
    trace = []
    for _ in range(rng.randint(1, 14)):
        arrival = rng.uniform(0, 5)
        t = arrival + rng.expovariate(4)
        times = []
        together = rng.random() < 0.3  # a stream whose chunks carry several tokens (gaps of 0)
        for _ in range(rng.randint(0, 12)):
            t += 0.0 if together and times and rng.random() < 0.5 else rng.expovariate(20) + 1e-4
            times.append(t)
        aborted = not times or rng.random() < 0.2
        finish = (times[-1] if times else arrival) + (rng.expovariate(50) if rng.random() < 0.5 else 0.0)
        trace.append(RequestTrace(arrival, times, finish, aborted, rng.randint(1, 100)))
    return trace


@points(5, timeout=90)
def test_trace_random():
    """Random traces (arrivals, token counts from 0 to 12, aborts) against the reference, all your
    functions together (percentile, summary, request_metrics, latency_metrics)."""
    check_trace(random_trace(0), what="random trace 0", alone=False)
    _trace_random()


@settings(max_examples=60, phases=[Phase.explicit, Phase.generate])
@given(seed=st.integers(0, 2**32 - 1), duration=st.sampled_from([None, None, 7.5, 0.0, -1.0]))
def _trace_random(seed, duration):
    trace = random_trace(seed)
    try:
        check_trace(trace, duration=duration, what=f"random trace {seed}", alone=False)
    except (ZeroDivisionError, ValueError, IndexError) as e:
        raise AssertionError(
            f"latency_metrics of random trace {seed} (duration={duration}) raised {type(e).__name__}: {e}: without "
            "samples a statistic is nan, and a throughput over a duration that is not positive (0 included) is nan"
        ) from None


# ---- Part A: the engine's own trace, through the benchmark ----------------------------------------------------
@points(10, timeout=240)
@engine
def test_engine_trace(tiny_llama):
    """The engine serves 12 requests arriving as a Poisson process on a tiny model (one, asking for 400
    tokens, is aborted after 0.2 s); the
    benchmark's summary with --metrics lab12 equals the one with its default metrics."""
    import torch

    from minisgl import LLM, SamplingParams
    from minisgl.benchmark import online

    lab.latency_metrics(TRACE[:1])  # a stub fails here, before the engine starts
    torch.set_num_threads(1)
    rng = random.Random(12)
    vocab = ModelConfig.from_path(tiny_llama).vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(4, 40))] for _ in range(12)]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in (1, 8, 20, 5, 1, 400, 12, 3, 9, 16, 2, 25)]
    arrivals = [0.0]
    for _ in prompts[1:]:
        arrivals.append(arrivals[-1] + rng.expovariate(100.0))
    llm = LLM(str(tiny_llama), device="cpu", dtype="float32", attention_backend="torch")
    try:
        trace = ref.trace_requests(llm, prompts, params, arrivals, abort_after={5: 0.2})
    finally:
        llm.shutdown()
    assert sum(r.aborted for r in trace) == 1 and all(r.token_times for r in trace if not r.aborted), trace
    # the online benchmark's summary of this trace, as if a server had streamed it
    results = [
        online.RequestResult(
            start=r.arrival,
            ttft=(r.token_times or [math.nan])[0] - r.arrival,
            e2e=r.finish - r.arrival,
            chunk_times=r.token_times,
            output_tokens=len(r.token_times),
            error="aborted" if r.aborted else None,
        )
        for r in trace
    ]
    duration = max(r.finish for r in trace)
    args = SimpleNamespace(base_url="-", api="completions", request_rate=100.0, max_concurrency=None, tag="")
    with engine_failure("your latency_metrics as the benchmark's --metrics lab12"), lab.registered_metrics() as name:
        got = online.summarize(results, duration, SimpleNamespace(**vars(args), metrics=name), "tiny")
    want = online.summarize(results, duration, SimpleNamespace(**vars(args), metrics="default"), "tiny")
    got.pop("time"), want.pop("time")
    d = differs(want, got, "the benchmark's summary")
    if d:
        hint = pitfalls_of_trace(
            [t.trace() for t in results], lab.latency_metrics([t.trace() for t in results]), duration
        )
        raise AssertionError(
            f"the engine's trace of 12 Poisson arrivals (one aborted), --metrics lab12: {d}"
            + (f": {hint}" if hint else "")
        )
    check_trace(trace, what="the engine's trace (12 Poisson arrivals, one aborted)", alone=False)


# ---- Part B: parameters and the decode roofline ---------------------------------------------------------------
@points(5)
def test_param_count():
    """Parameters of the real architectures (transformers' counts: 0.6B tied, 14B/32B/8B untied) and of a
    config with biases."""
    llama = KNOWN_CONFIGS["Llama-3.1-8B"]
    biased = [  # each flag on its own, and both
        (f"Llama-3.1-8B with {what}", ModelConfig.from_dict({**llama, "attention_bias": a, "mlp_bias": m}))
        for what, a, m in [("attention biases only", True, False), ("MLP biases only", False, True)]
    ]
    biased.append(
        (
            "Llama-3.1-8B with attention and MLP biases",
            ModelConfig.from_dict({**llama, "attention_bias": True, "mlp_bias": True}),
        )
    )
    for name, cfg in [*REAL.items(), *biased]:
        want, got = roof.param_count(cfg), lab.param_count(cfg)
        if want == got:
            continue
        vh = cfg.vocab_size * cfg.hidden_size
        hint = "embedding + layers (projections, biases, two norms, Qwen3's q/k norms) + final norm + untied LM head"
        h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
        attn_b = cfg.num_layers * (cfg.num_heads * d + 2 * cfg.num_kv_heads * d + h)
        mlp_b = cfg.num_layers * (2 * inter + h)
        if cfg.attention_bias != cfg.mlp_bias and got in (want + attn_b, want + mlp_b, want - attn_b, want - mlp_b):
            hint = (
                "each bias flag on its own: attention_bias adds the q, k, v and o biases, mlp_bias the gate, up "
                f"and down biases (this config has attention_bias={cfg.attention_bias}, mlp_bias={cfg.mlp_bias})"
            )
        elif got == want - vh:
            hint = "an untied LM head is a second vocab x hidden matrix: count it"
        elif got == want + vh:
            hint = "a tied LM head is the embedding table: count it once"
        raise AssertionError(f"param_count of {name}: expected {want:,}, got {got:,}: {hint}")


def tp_hint(cfg, b, ctx, kw, gw, gk) -> str:
    """The tensor-parallel pitfall whose numbers (``gw`` weights, ``gk`` KV bytes) these are, if any."""
    want = roof.decode_step_bytes(cfg, b, ctx, **kw)
    whole = roof.decode_step_bytes(cfg, b, ctx, **{**kw, "tp": 1})
    tp, wb = kw["tp"], kw.get("weight_bytes", 2)
    kvh, rows = -(-cfg.num_kv_heads // tp), -(-cfg.vocab_size // tp)
    kv_proj = 2 * cfg.hidden_size * cfg.head_dim * cfg.num_layers * wb  # the k and v projections of one KV head
    if gw is None or gk is None:
        return ""
    if math.isclose(gw, whole.weights / tp) and math.isclose(gk, whole.kv / tp):
        return (
            "each part splits on its own, not the whole model divided by tp: num_heads / tp query heads, "
            f"ceil(num_kv_heads / tp) = {kvh} KV heads (replicated when tp > num_kv_heads), intermediate / tp MLP "
            f"columns, ceil(vocab / tp) = {rows:,} LM-head rows"
        )
    if gk != want.kv and gk == want.kv / kvh * (cfg.num_kv_heads // tp):
        return (
            f"ceil(num_kv_heads / tp) KV heads per GPU: {cfg.num_kv_heads} KV heads over {tp} GPUs is {kvh} each "
            "(a KV head is replicated when tp > num_kv_heads), not a floor"
        )
    if gk == want.kv and gw == want.weights - (kvh - cfg.num_kv_heads // tp) * kv_proj:
        return f"ceil(num_kv_heads / tp) = {kvh} KV heads per GPU, in the k and v projections too (not a floor)"
    if gk == want.kv and gw == want.weights - (rows - cfg.vocab_size // tp) * cfg.hidden_size * wb:
        return (
            f"ceil(vocab / tp) LM-head rows per GPU: a vocabulary of {cfg.vocab_size:,} over {tp} GPUs is {rows:,} "
            "rows each (the last shard is padded), not a floor"
        )
    return ""


def check_bytes(name, cfg, b, ctx, **kw):
    want = roof.decode_step_bytes(cfg, b, ctx, **kw)
    got = tuple(lab.decode_step_bytes(cfg, b, ctx, **kw))
    if len(got) == 2 and got[0] == want.weights and got[1] == want.kv:
        return
    wb, kb, tp = kw.get("weight_bytes", 2), kw.get("kv_bytes", 2), kw.get("tp", 1)
    gw, gk = (got + (None, None))[:2]
    h, kvh = cfg.hidden_size, -(-cfg.num_kv_heads // tp)
    head = -(-cfg.vocab_size // tp) * h * wb
    per_pos = 2 * kvh * cfg.head_dim * kb
    hint = tp_hint(cfg, b, ctx, kw, gw, gk) if tp > 1 else ""  # a part of the tensor-parallel split
    if hint:
        pass
    elif gk != want.kv:
        if gk == want.kv * (cfg.num_heads // tp) / kvh:
            hint = "KV is stored for the KV heads (num_kv_heads), not the query heads (grouped-query attention)"
        elif gk == want.kv / cfg.num_layers:
            hint = "every layer reads its own K and V: multiply by num_layers"
        elif kb != wb and gk == want.kv / kb * wb:
            hint = "the KV cache's element size is kv_bytes, not weight_bytes"
        elif gk == want.kv / 2:
            hint = "K and V: two tensors per position per layer"
        else:
            hint = "KV = batch * context * layers * 2 * KV heads * head_dim * kv_bytes"
            hint += f" ({per_pos * cfg.num_layers} B a position)"
    elif gw != want.weights:
        if gw == want.weights - head:
            hint = "the LM head is read at every step, tied to the embedding or not"
        elif gw == want.weights + head:
            hint = "the embedding table is not read in a decode step (its lookup reads one row per request)"
        elif wb != kb and gw == want.weights / wb * kb:
            hint = "the weights' element size is weight_bytes, not kv_bytes"
        else:
            hint = "weights = (layers * (q, k, v, o, gate, up, down) + LM head) * weight_bytes"
    raise AssertionError(
        f"decode_step_bytes of {name} at batch {b}, context {ctx}, {kw or 'bf16'}: expected "
        f"(weights {want.weights:,.0f}, kv {want.kv:,.0f}) bytes, got {got}: {hint}"
    )


@points(8)
def test_step_bytes_real_configs():
    """Weights and KV read per decode step, bf16, for Qwen3-0.6B (tied), Qwen3-14B, Qwen3-32B, Llama-3.1-8B."""
    for name, cfg in REAL.items():
        for b, ctx in [(1, 1), (64, 800), (256, 2048)]:
            check_bytes(name, cfg, b, ctx)
    w = lab.decode_step_bytes(REAL["Qwen3-14B"], 256, 800)
    assert abs(w[0] / 1e9 - 27.98) < 0.01, f"Qwen3-14B reads ~27.98 GB of weights per step, got {w[0] / 1e9:.2f} GB"


@points(4)
def test_step_bytes_dtypes():
    """fp8 weights with a bf16 KV cache, and the reverse, and float32."""
    for name in ("Qwen3-0.6B", "Llama-3.1-8B"):
        check_bytes(name, REAL[name], 32, 1000, weight_bytes=1, kv_bytes=2)
        check_bytes(name, REAL[name], 32, 1000, weight_bytes=2, kv_bytes=1)
        check_bytes(name, REAL[name], 8, 100, weight_bytes=4, kv_bytes=4)


@points(4)
def test_step_bytes_tp():
    """Per GPU under tensor parallelism (tp 2, 4, 8: heads, KV heads, MLP columns and LM-head rows split),
    each part on its own: tp 16 over 8 KV heads (one replicated on each GPU), and a vocabulary that
    tp does not divide (ceil: the last shard is padded)."""
    for tp in (2, 4, 8):
        check_bytes("Qwen3-14B", REAL["Qwen3-14B"], 128, 800, tp=tp)
        check_bytes("Qwen3-32B", REAL["Qwen3-32B"], 64, 4096, tp=tp)
    check_bytes("Qwen3-32B", REAL["Qwen3-32B"], 32, 2048, tp=16)  # 8 KV heads: replicated
    odd = ModelConfig.from_dict({**KNOWN_CONFIGS["Llama-3.1-8B"], "vocab_size": 128_257})
    for tp in (4, 8):
        check_bytes("Llama-3.1-8B with a vocabulary of 128,257", odd, 64, 1024, tp=tp)


@points(3)
def test_roofline():
    """The bandwidth bound on an H200 (4.8 TB/s) and an A100: step time and tokens/s, bf16 and fp8, tp 1
    and 2 (with the reference's decode_step_bytes: graded on its own)."""
    for name, cfg in REAL.items():
        for gpu in (H200, roof.GPUS["A100"]):
            for b, ctx, kw in [
                (1, 512, {}),
                (256, 800, {}),
                (64, 4096, {"weight_bytes": 1, "kv_bytes": 1}),
                (128, 800, {"tp": 2}),
            ]:
                want = roof.decode_roofline(cfg, gpu, b, ctx, **kw)
                with lab.reference_helpers("decode_step_bytes"):  # graded alone
                    got = lab.decode_roofline(cfg, gpu, b, ctx, **kw)
                d = differs(tuple(want), tuple(got) if isinstance(got, tuple) else got, "(step_s, tokens_per_s)")
                if d:
                    raise AssertionError(
                        f"decode_roofline of {name} on {gpu.name} at batch {b}, context {ctx}, {kw or 'bf16'}: {d}: "
                        "step_s = one GPU's bytes (decode_step_bytes) / gpu.bandwidth, "
                        "tokens_per_s = batch_size / step_s"
                    )
