"""Broken variants of solutions/lab12_benchmark.py: one per pitfall its docstring names, one of each kind
of hole (``mutants.KINDS``), a correct one written another way (``EQUIVALENT``), and two that the hidden
tests catch (``HIDDEN_MUTANTS``: zero gaps dropped from the ITLs, and KV heads / LM-head rows split with
a floor, which agree with the correct code whenever the split is exact). Both passed every visible test
when they were written; visible tests catch them now too (the ``visible_on_cpu`` mutants)."""

from mutants import Mutant

STEM = "lab12_benchmark"

# every fixed test -> the randomized test, which must fail with it
RANDOMIZED = {
    "percentile_fixed": "percentile_random",
    **{
        name: "trace_random"
        for name in (
            "summary",
            "request_ttft_e2e",
            "request_tpot_itls",
            "trace_latencies",
            "trace_counts_and_throughput",
            "trace_edge_cases",
        )
    },
}

_RANK = "    k = (len(xs) - 1) * p / 100\n    lo, hi = math.floor(k), math.ceil(k)\n"

MUTANTS = [
    Mutant(
        "ttft_from_run_start",
        STEM,
        (
            (
                "    return RequestMetrics(ttft=first - req.arrival,",
                "    return RequestMetrics(ttft=first - min(req.arrival, 0.0),",
            ),
        ),
        must_fail=("request_ttft_e2e", "trace_random", "engine_trace"),
        hint="from the request's own arrival",
        why="TTFT measured from the start of the run (time 0), not from when the request arrived",
    ),
    Mutant(
        "tpot_includes_first_token",
        STEM,
        (
            (
                "    tpot = (req.finish - first) / (n - 1) if n >= 2 else None\n",
                "    tpot = (req.finish - req.arrival) / n if n >= 2 else None\n",
            ),
        ),
        must_fail=("request_tpot_itls", "trace_random", "engine_trace"),
        hint="TPOT counts only the tokens after the first",
        why="TPOT = E2E / tokens: the first token's wait (TTFT) is spread over every token",
    ),
    Mutant(
        "one_token_tpot_zero",
        STEM,
        (
            (
                "    tpot = (req.finish - first) / (n - 1) if n >= 2 else None\n",
                "    tpot = (req.finish - first) / (n - 1) if n >= 2 else 0.0\n",
            ),
        ),
        must_fail=("request_tpot_itls", "trace_random", "engine_trace"),
        hint="one output token has no TPOT",
        why="a request of one token gets a TPOT of 0 and drags the TPOT statistics down",
    ),
    Mutant(
        "itl_averaged_per_request",
        STEM,
        (("        itls.extend(m.itls)\n", "        itls.extend([sum(m.itls) / len(m.itls)] if m.itls else [])\n"),),
        must_fail=("trace_latencies", "trace_random", "engine_trace"),
        hint="pooled",
        why="each request's mean gap is one sample: a short request weighs as much as a long one",
    ),
    Mutant(
        "percentile_nearest_rank",
        STEM,
        (
            (
                _RANK + "    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)\n",
                "    return xs[max(0, math.ceil(len(xs) * p / 100) - 1)]\n",
            ),
        ),
        must_fail=("percentile_fixed", "percentile_random", "trace_random", "engine_trace"),
        hint="nearest-rank",
        why="the nearest-rank percentile instead of linear interpolation between the closest ranks",
    ),
    Mutant(
        "percentile_rank_off_by_one",
        STEM,
        (
            (
                _RANK,
                "    k = len(xs) * p / 100\n"
                "    lo, hi = min(math.floor(k), len(xs) - 1), min(math.ceil(k), len(xs) - 1)\n",
            ),
        ),
        must_fail=("percentile_fixed", "percentile_random", "trace_random"),
        hint="off by one",
        why="rank n * p / 100 instead of (n - 1) * p / 100 (0-based)",
    ),
    Mutant(
        "aborted_in_latencies",
        STEM,
        (
            (
                "    completed = [r for r in trace if not r.aborted]\n",
                "    completed = [r for r in trace if r.token_times]\n",
            ),
        ),
        must_fail=("trace_latencies", "trace_random", "engine_trace"),
        hint="aborted requests are excluded",
        why="aborted requests (with tokens) counted as completed: their latencies and tokens enter the numbers",
    ),
    Mutant(
        "span_of_completed_only",
        STEM,
        (
            (
                "        duration = (max(r.finish for r in trace) - min(r.arrival for r in trace)) if trace else 0.0\n",
                "        ends = [r.finish for r in completed] or [0.0]\n"
                "        duration = max(ends) - min([r.arrival for r in completed] or [0.0])\n",
            ),
        ),
        must_fail=("trace_counts_and_throughput", "trace_random"),
        hint="the span runs from the earliest arrival to the latest finish of all requests",
        why="the default duration leaves the aborted requests out of the run's span",
    ),
    Mutant(
        "kv_with_query_heads",
        STEM,
        (("    kv_heads = math.ceil(cfg.num_kv_heads / tp)\n", "    kv_heads = math.ceil(cfg.num_heads / tp)\n"),),
        must_fail=("step_bytes_real_configs", "step_bytes_tp"),
        hint="num_kv_heads",
        why="KV counted for every query head: grouped-query attention stores only the KV heads",
    ),
    Mutant(
        "kv_one_layer",
        STEM,
        (
            (
                "    kv_per_position = cfg.num_layers * 2 * kv_heads * head_dim * kv_bytes\n",
                "    kv_per_position = 2 * kv_heads * head_dim * kv_bytes\n",
            ),
        ),
        must_fail=("step_bytes_real_configs", "step_bytes_dtypes"),
        hint="every layer reads its own K and V",
        why="the KV of one layer only",
    ),
    Mutant(
        "tied_lm_head_skipped",
        STEM,
        (
            (
                "    weights = (cfg.num_layers * per_layer + lm_head) * weight_bytes\n",
                "    lm_head = 0 if cfg.tie_word_embeddings else lm_head\n"
                "    weights = (cfg.num_layers * per_layer + lm_head) * weight_bytes\n",
            ),
        ),
        must_fail=("step_bytes_real_configs",),
        hint="the LM head is read at every step, tied to the embedding or not",
        why="a tied model's LM head (the embedding table) left out of the step's bytes",
    ),
    Mutant(
        "embedding_read_in_step",
        STEM,
        (
            (
                "    weights = (cfg.num_layers * per_layer + lm_head) * weight_bytes\n",
                "    lm_head *= 1 if cfg.tie_word_embeddings else 2\n"
                "    weights = (cfg.num_layers * per_layer + lm_head) * weight_bytes\n",
            ),
        ),
        must_fail=("step_bytes_real_configs",),
        hint="the embedding table is not read in a decode step",
        why="an untied model's whole embedding table counted as read at every step",
    ),
    Mutant(
        "untied_lm_head_not_counted",
        STEM,
        (("    lm_head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * hidden\n", "    lm_head = 0\n"),),
        must_fail=("param_count",),
        hint="an untied LM head is a second vocab x hidden matrix",
        why="param_count treats every model as tied",
    ),
    Mutant(
        "kv_at_weight_bytes",
        STEM,
        (
            (
                "    kv_per_position = cfg.num_layers * 2 * kv_heads * head_dim * kv_bytes\n",
                "    kv_per_position = cfg.num_layers * 2 * kv_heads * head_dim * weight_bytes\n",
            ),
        ),
        must_fail=("step_bytes_dtypes",),
        hint="kv_bytes, not weight_bytes",
        why="the KV cache's bytes per element taken from the weights' (fp8 weights with a bf16 cache)",
    ),
    Mutant(
        "roofline_tokens_per_gpu",
        STEM,
        (
            (
                "    return Roofline(step_s=seconds, tokens_per_s=batch_size / seconds)\n",
                "    return Roofline(step_s=seconds, tokens_per_s=batch_size * tp / seconds)\n",
            ),
        ),
        must_fail=("roofline",),
        hint="tokens_per_s = batch_size / step_s",
        why="tensor parallelism counted as tp times the tokens: the ranks share one batch",
    ),
]

MUTANTS += [
    Mutant(
        "tpot_needs_three_tokens",
        STEM,
        (
            (
                "    tpot = (req.finish - first) / (n - 1) if n >= 2 else None\n",
                "    tpot = (req.finish - first) / (n - 1) if n > 2 else None\n",
            ),
        ),
        must_fail=("request_tpot_itls", "request_ttft_e2e", "trace_random"),
        hint="a request of two output tokens has a TPOT",
        why="n > 2 where the contract says n >= 2: a request of exactly two tokens gets no TPOT",
        kind="boundary",
    ),
    Mutant(
        "throughput_at_zero_duration",
        STEM,
        (
            (
                '        "request_throughput": len(completed) / duration if duration > 0 else math.nan,\n'
                '        "output_throughput": tokens / duration if duration > 0 else math.nan,\n',
                '        "request_throughput": len(completed) / duration if duration >= 0 else math.nan,\n'
                '        "output_throughput": tokens / duration if duration >= 0 else math.nan,\n',
            ),
        ),
        must_fail=("trace_edge_cases", "trace_random"),
        hint="not positive (0 included) is nan",
        why="duration >= 0 where the contract says > 0: a span of exactly 0 divides by zero",
        kind="boundary",
    ),
    Mutant(
        "mlp_bias_follows_attention_bias",
        STEM,
        (("    if cfg.mlp_bias:\n", "    if cfg.attention_bias:\n"),),
        must_fail=("param_count",),
        hint="each bias flag on its own",
        why="the MLP biases are counted when attention_bias is set: right whenever both flags agree, as in every "
        "real config and in a config with both",
        kind="one_argument",
    ),
    Mutant(
        "tp_divides_the_whole_model",
        STEM,
        (
            (
                "    heads = cfg.num_heads // tp\n"
                "    kv_heads = math.ceil(cfg.num_kv_heads / tp)\n"
                "    mlp_cols = cfg.intermediate_size // tp\n",
                "    heads, kv_heads, mlp_cols = cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size\n",
            ),
            ("    lm_head = math.ceil(cfg.vocab_size / tp) * hidden\n", "    lm_head = cfg.vocab_size * hidden\n"),
            (
                "    return StepBytes(weights=weights, kv=batch_size * context_len * kv_per_position)\n",
                "    return StepBytes(weights=weights / tp, kv=batch_size * context_len * kv_per_position / tp)\n",
            ),
        ),
        must_fail=("step_bytes_tp",),
        hint="each part splits on its own, not the whole model divided by tp",
        why="one GPU's bytes as the whole model's over tp: right whenever every part splits exactly (KV heads, "
        "vocabulary), as in tp 2, 4, 8 on the real configs",
        kind="each_part",
    ),
    Mutant(
        "summary_p99_before_p90",
        STEM,
        (
            (
                '        "p90": percentile(values, 90),\n        "p99": percentile(values, 99),\n',
                '        "p99": percentile(values, 99),\n        "p90": percentile(values, 90),\n',
            ),
        ),
        must_fail=("summary", "trace_random"),
        hint="the same keys in another order",
        why="the summary's keys out of the order the contract states (mean, p50, p90, p99)",
        kind="order",
    ),
    Mutant(
        "percentile_ranks_before_sorting",
        STEM,
        (("    xs = sorted(values)\n", "    xs = list(values)\n"),),
        must_fail=("percentile_fixed", "percentile_random"),
        hint="sort the values first",
        why="the rank is taken in the values' own order: sort first, then rank",
        kind="order",
    ),
    Mutant(
        "zero_gaps_dropped_visibly",
        STEM,
        (("        itls.extend(m.itls)\n", "        itls.extend(g for g in m.itls if g > 0)\n"),),
        must_fail=("trace_latencies", "trace_random"),
        hint="gaps of 0",
        why="once a hidden-test-only bug: tokens that arrive in one chunk (gaps of 0) are left out of the ITLs",
        kind="visible_on_cpu",
    ),
    Mutant(
        "tp_split_rounded_down_visibly",
        STEM,
        (
            ("    kv_heads = math.ceil(cfg.num_kv_heads / tp)\n", "    kv_heads = cfg.num_kv_heads // tp\n"),
            (
                "    lm_head = math.ceil(cfg.vocab_size / tp) * hidden\n",
                "    lm_head = cfg.vocab_size // tp * hidden\n",
            ),
        ),
        must_fail=("step_bytes_tp",),
        hint="ceil(num_kv_heads / tp) KV heads per GPU",
        why="once a hidden-test-only bug: KV heads and LM-head rows split with a floor (no KV head when "
        "tp > num_kv_heads, a shard short when tp does not divide the vocabulary)",
        kind="visible_on_cpu",
    ),
    Mutant(
        "latency_metrics_of_the_engine",
        STEM,
        (
            (
                "    completed = [r for r in trace if not r.aborted]\n",
                "    from minisgl.benchmark import metrics\n\n"
                "    return metrics.latency_metrics(trace, duration)\n"
                "    completed = [r for r in trace if not r.aborted]\n",
            ),
        ),
        must_fail=("trace_latencies", "trace_random"),
        hint="the engine's own",
        why="latency_metrics delegates to the engine's; the other functions are the lab's own",
        kind="engine_reference",
    ),
    Mutant(
        "summary_is_the_online_benchmarks",
        STEM,
        (
            (
                "from minisgl.benchmark.metrics import RequestMetrics, RequestTrace\n",
                "from minisgl.benchmark.metrics import RequestMetrics, RequestTrace\n"
                "from minisgl.benchmark.online import percentiles\n",
            ),
            (
                "def request_metrics(req: RequestTrace) -> RequestMetrics:\n",
                "summary = percentiles  # noqa: F811\n\n\ndef request_metrics(req: RequestTrace) -> RequestMetrics:\n",
            ),
        ),
        must_fail=("summary", "trace_random"),
        hint="the engine's own",
        why="summary is the online benchmark's percentiles() under the lab's name",
        kind="engine_reference",
    ),
]

# correct, written another way: it must keep every point
EQUIVALENT = Mutant(
    "lab12_written_differently",
    STEM,
    (
        (
            "    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)\n",
            "    return xs[lo] * (1 - (k - lo)) + xs[hi] * (k - lo) if hi != lo else xs[lo]\n",
        ),
        (
            "        itls.extend(m.itls)\n",
            "        itls += [b - a for a, b in zip(r.token_times, r.token_times[1:])]\n",
        ),
        (
            "    seconds = (step_bytes.weights + step_bytes.kv) / gpu.bandwidth\n",
            "    seconds = step_bytes.total / gpu.bandwidth\n",
        ),
    ),
    must_fail=(),
)

HIDDEN_MUTANTS = [
    Mutant(
        "zero_gaps_dropped",
        STEM,
        (("        itls.extend(m.itls)\n", "        itls.extend(g for g in m.itls if g > 0)\n"),),
        must_fail=("tokens_at_the_same_time",),
        why="tokens that arrive in one chunk (gaps of 0) are left out of the ITL samples",
    ),
    Mutant(
        "tp_split_rounded_down",
        STEM,
        (
            ("    kv_heads = math.ceil(cfg.num_kv_heads / tp)\n", "    kv_heads = cfg.num_kv_heads // tp\n"),
            (
                "    lm_head = math.ceil(cfg.vocab_size / tp) * hidden\n",
                "    lm_head = cfg.vocab_size // tp * hidden\n",
            ),
        ),
        must_fail=("tp_beyond_kv_heads_and_odd_vocab",),
        why="KV heads and LM-head rows split with a floor: no KV head when tp > num_kv_heads, a shard short",
    ),
]
