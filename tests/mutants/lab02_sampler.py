"""Broken variants of solutions/lab02_sampler.py: one per pitfall its docstring names, one of each kind of
grader hole (``mutants.KINDS``), a correct one written another way (``EQUIVALENT``), and three the hidden
tests catch (``HIDDEN_MUTANTS``; once only they did, now the visible tests catch them too)."""

from mutants import Mutant

STEM = "lab02_sampler"

# every fixed unit test -> the randomized test that must fail with it
RANDOMIZED = {
    "scale_logits": "filters_random",
    "top_k_filter": "filters_random",
    "top_p_filter": "filters_random",
    "draw": "draw_random",
    "greedy_rows": "sample_random",
    "draws_follow_the_rule": "sample_random",
    "infinite_logits": "sample_random",
    "batch_invariance": "sample_random",
}

ENGINE = "engine_samples_with_your_sampler"
SCALE = "    return logits.float() / safe[:, None].float()\n"
KTH = "    kth_largest = logits.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])\n"
FILTERS = (
    "        scaled = scale_logits(logits, info.temperatures)\n"
    "        if info.need_top_k:\n"
    "            scaled = top_k_filter(scaled, info.top_k)\n"
    "        if info.need_top_p:\n"
    "            scaled = top_p_filter(scaled, info.top_p)\n"
)
DRAW = "        tokens = draw(scaled, uniform(info.seeds, info.steps))\n"

MUTANTS = [
    Mutant(
        "greedy_divided_by_zero",
        STEM,
        (
            (
                "    safe = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures))\n",
                "    safe = temperatures\n",
            ),
        ),
        must_fail=("scale_logits", "filters_random"),
        hint="dividing greedy rows by their temperature 0",
        why="temperature-0 rows divided by 0: inf and NaN logits",
    ),
    Mutant(
        "temperature_multiplied",
        STEM,
        ((SCALE, "    return logits.float() * safe[:, None].float()\n"),),
        must_fail=("scale_logits", "filters_random", "draws_follow_the_rule", "sampled_distribution[1]", ENGINE),
        hint="multiplying by the temperature",
        why="T < 1 flattens instead of sharpening",
    ),
    Mutant(
        "temperature_after_softmax",
        STEM,
        (("        scaled = scale_logits(logits, info.temperatures)\n", "        scaled = logits.float()\n"),),
        must_fail=("draws_follow_the_rule", "sampled_distribution[1]", "sample_random"),
        hint="ignoring the temperature",
        why="the temperature applied to the probabilities (renormalising undoes it): every row samples at T = 1",
    ),
    Mutant(
        "top_k_keeps_k_plus_1",
        STEM,
        ((KTH, KTH.replace("(k - 1)[:, None]", "k.clamp(max=logits.shape[-1] - 1)[:, None]")),),
        must_fail=("top_k_filter", "filters_random", "sampled_distribution[2]"),
        hint="keeping k + 1 tokens",
        why="an off-by-one in the rank: one token too many survives top-k",
    ),
    Mutant(
        "top_k_drops_ties",
        STEM,
        (
            (
                '    return logits.masked_fill(logits < kth_largest, float("-inf"))\n',
                "    keep = torch.zeros_like(logits, dtype=torch.bool)\n"
                "    for r in range(len(k)):\n"
                "        keep[r, logits[r].topk(int(k[r])).indices] = True\n"
                '    return logits.masked_fill(~keep, float("-inf"))\n',
            ),
        ),
        must_fail=("top_k_filter", "filters_random"),
        hint="dropping the ties",
        why="torch.topk's indices keep exactly k tokens: tokens tied with the k-th are dropped arbitrarily",
    ),
    Mutant(
        "top_k_one_k_for_the_batch",
        STEM,
        (
            (
                "    k = top_k.clamp(1, logits.shape[-1]).to(torch.int64)\n",
                "    k = top_k.clamp(1, logits.shape[-1]).to(torch.int64).max().repeat(len(top_k))\n",
            ),
        ),
        must_fail=("top_k_filter", "filters_random"),
        hint="one k for the whole batch",
        why="the batch's largest k (an aggregate) filters every row: the row that has it passes, the others do not",
        kind="each_part",
    ),
    Mutant(
        "top_p_drops_crossing_token",
        STEM,
        (("    mass_before = probs.cumsum(dim=-1) - probs\n", "    mass_before = probs.cumsum(dim=-1)\n"),),
        must_fail=("top_p_filter", "filters_random", "sampled_distribution[4]"),
        hint="dropping the crossing token",
        why="keeps cumsum < p: the nucleus misses the token that crosses p (and is empty for a tiny p)",
    ),
    Mutant(
        "top_p_filters_at_p_1",
        STEM,
        (
            (
                "    drop_sorted = (mass_before >= top_p[:, None]) & (top_p[:, None] < 1)\n",
                "    drop_sorted = mass_before >= top_p[:, None]\n",
            ),
        ),
        must_fail=("top_p_filter", "filters_random"),
        hint="dropping tokens at p = 1",
        why="a float32 cumsum reaches 1.0 before the tail, so p = 1 drops tokens it must keep",
    ),
    Mutant(
        "top_p_before_temperature",
        STEM,
        (
            (
                FILTERS,
                "        scaled = logits.float()\n"
                "        if info.need_top_k:\n"
                "            scaled = top_k_filter(scaled, info.top_k)\n"
                "        if info.need_top_p:\n"
                "            scaled = top_p_filter(scaled, info.top_p)\n"
                "        scaled = scale_logits(scaled, info.temperatures)\n",
            ),
        ),
        must_fail=("draws_follow_the_rule", "sampled_distribution[4]", "sample_random"),
        hint="top-p computed before the temperature",
        why="the nucleus is chosen on softmax(logits), not on softmax(logits / T)",
    ),
    Mutant(
        "top_p_ignores_top_k",
        STEM,
        (
            (
                "            scaled = top_p_filter(scaled, info.top_p)\n",
                "            nucleus = top_p_filter(scale_logits(logits, info.temperatures), info.top_p)\n"
                '            scaled = scaled.masked_fill(nucleus.isinf(), float("-inf"))\n',
            ),
        ),
        must_fail=("draws_follow_the_rule", "sampled_distribution[4]", "sample_random"),
        hint="top-p computed on the whole distribution",
        why="top-p measured on the unfiltered softmax instead of on what top-k kept (renormalised)",
    ),
    Mutant(
        "masking_by_arithmetic",
        STEM,
        (
            (
                '    return logits.masked_fill(logits < kth_largest, float("-inf"))\n',
                '    keep = (logits >= kth_largest).float()\n    return logits * keep + (1 - keep) * float("-inf")\n',
            ),
        ),
        must_fail=("top_k_filter", "filters_random", "infinite_logits"),
        hint="0 * -inf is NaN",
        why="a mask applied by multiplication turns every kept logit into NaN",
    ),
    Mutant(
        "greedy_rows_sampled",
        STEM,
        (("        return torch.where(info.temperatures > 0, tokens, greedy)\n", "        return tokens\n"),),
        must_fail=("greedy_rows", "infinite_logits", "sample_random"),
        hint="sampling the greedy rows",
        why="temperature-0 rows beside sampled rows are sampled at T = 1",
    ),
    Mutant(
        "step_ignored",
        STEM,
        ((DRAW, DRAW.replace("info.steps", "torch.zeros_like(info.steps)")),),
        must_fail=("draws_follow_the_rule", "sample_random", ENGINE),
        hint="step index ignored",
        why="every step draws the same u: a request repeats its choices",
    ),
    Mutant(
        "row_index_as_seed",
        STEM,
        ((DRAW, DRAW.replace("info.seeds", "torch.arange(len(info.seeds))")),),
        must_fail=("draws_follow_the_rule", "batch_invariance", "sample_random", ENGINE),
        hint="using the row index as the seed",
        why="a request's tokens depend on its place in the batch",
    ),
    Mutant(
        "one_generator_for_the_batch",
        STEM,
        (
            (
                DRAW,
                "        gen = torch.Generator().manual_seed(int(info.seeds[0]))\n"
                "        u = torch.rand(len(info.seeds), generator=gen, dtype=torch.float64)\n"
                "        tokens = draw(scaled, u)\n",
            ),
        ),
        must_fail=("batch_invariance", "draws_follow_the_rule", "sample_random", ENGINE),
        hint="not batch-invariant (a random generator shared by the batch",
        why="one generator seeded by the first row: the other rows' tokens depend on the batch",
    ),
]

# one of each other kind of hole a careful student finds in a grader (mutants.KINDS)
NOT_APPLICABLE = {
    "one_argument": "the sampler's contract has no input checks: nothing in it raises or refuses an argument, "
    "every input is a batch of logits and per-row parameters it samples from",
}
MUTANTS += [
    Mutant(
        "top_p_keeps_the_token_at_exactly_p",
        STEM,
        (
            (
                "    drop_sorted = (mass_before >= top_p[:, None]) & (top_p[:, None] < 1)\n",
                "    drop_sorted = (mass_before > top_p[:, None]) & (top_p[:, None] < 1)\n",
            ),
        ),
        must_fail=("top_p_filter", "filters_random"),
        hint="keep it only while mass_before < p",
        why="a token stays while the mass before it is <= p: one token too many when that mass is p exactly",
        kind="boundary",
    ),
    Mutant(
        "draw_takes_the_next_token_on_a_tie",
        STEM,
        (
            (
                "    picked = torch.searchsorted(cdf, scaled_u).squeeze(1)\n",
                "    picked = torch.searchsorted(cdf, scaled_u, right=True).squeeze(1)\n",
            ),
        ),
        must_fail=("draw", "draw_random"),
        hint="cdf[i] > u * total (searchsorted with right=True) takes the next one",
        why="the first i with cdf[i] > u * total: when u * total equals a CDF value, the token after it",
        kind="boundary",
    ),
    Mutant(
        "top_p_before_top_k",
        STEM,
        (
            (
                FILTERS,
                "        scaled = scale_logits(logits, info.temperatures)\n"
                "        if info.need_top_p:\n"
                "            scaled = top_p_filter(scaled, info.top_p)\n"
                "        if info.need_top_k:\n"
                "            scaled = top_k_filter(scaled, info.top_k)\n",
            ),
        ),
        must_fail=("draws_follow_the_rule", "sample_random"),
        hint="top-p computed on the whole distribution instead of what top-k kept",
        why="the filters swapped: the nucleus is measured on the whole distribution, then top-k cuts it",
        kind="order",
    ),
    Mutant(
        "sample_by_the_engine",
        STEM,
        (
            (
                "from minisgl.engine.sample import Sampler, SamplingInfo, uniform\n",
                "from minisgl.engine.sample import DefaultSampler, Sampler, SamplingInfo, uniform\n",
            ),
            (
                "        greedy = logits.argmax(dim=-1)\n        if info.all_greedy:\n            return greedy\n",
                "        return DefaultSampler().sample(logits, info)\n        greedy = logits.argmax(dim=-1)\n",
            ),
        ),
        must_fail=("greedy_rows", "draws_follow_the_rule", "scale_logits"),
        hint="the engine's own",
        why="LabSampler.sample delegates to the engine's DefaultSampler: the lab scores 0",
        kind="engine_reference",
    ),
    Mutant(
        "scale_keeps_bfloat16",
        STEM,
        ((SCALE, "    return logits / safe[:, None].to(logits.dtype)\n"),),
        must_fail=("scale_logits", "filters_random"),
        hint="convert with logits.float() before dividing",
        why="the temperature divides in the logits' dtype (bfloat16 on a GPU); once a hidden-only bug",
        kind="visible_on_cpu",
    ),
    Mutant(
        "draw_with_exp",
        STEM,
        (
            (
                "    cdf = logits.float().softmax(dim=-1).cumsum(dim=-1)\n",
                "    cdf = logits.float().exp().cumsum(dim=-1)\n",
            ),
        ),
        must_fail=("draw", "draw_random"),
        hint="overflows float32",
        why="exp() without subtracting the row's maximum overflows past 88; once a hidden-only bug",
        kind="visible_on_cpu",
    ),
]

# correct, written the other ways a student may: it must keep every point
EQUIVALENT = Mutant(
    "lab02_written_differently",
    STEM,
    (
        (
            "    safe = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures))\n" + SCALE,
            "    t = temperatures.float()[:, None]\n"
            "    return torch.where(t > 0, logits.float() / t.clamp(min=1e-30), logits.float())\n",
        ),
        (  # topk's values instead of a full sort
            KTH,
            "    kth_largest = logits.topk(int(k.max()), dim=-1).values.gather(1, (k - 1)[:, None])\n",
        ),
        (  # the softmax before the sort, and "mass before" as a shifted cumsum
            "    ordered, order = logits.sort(dim=-1, descending=True)\n"
            "    probs = ordered.softmax(dim=-1)\n"
            "    mass_before = probs.cumsum(dim=-1) - probs\n",
            "    probs, order = logits.softmax(dim=-1).sort(dim=-1, descending=True)\n"
            "    mass_before = torch.cat([torch.zeros_like(probs[:, :1]), probs.cumsum(dim=-1)[:, :-1]], dim=-1)\n",
        ),
        (  # counting the CDF values below the target instead of searchsorted
            "    picked = torch.searchsorted(cdf, scaled_u).squeeze(1)\n",
            "    picked = (cdf < scaled_u).sum(dim=-1)\n",
        ),
        (  # both filters always (top_k = vocab and top_p = 1 keep everything)
            FILTERS,
            "        scaled = top_k_filter(scale_logits(logits, info.temperatures), info.top_k)\n"
            "        scaled = top_p_filter(scaled, info.top_p)\n",
        ),
    ),
    must_fail=(),
)

# once passed every visible test; each fails a hidden test (and now a visible one: the last two MUTANTS,
# u_not_scaled_by_the_total in draw)
HIDDEN_MUTANTS = [
    Mutant(
        "scale_keeps_bfloat16",
        STEM,
        ((SCALE, "    return logits / safe[:, None].to(logits.dtype)\n"),),
        must_fail=("bfloat16_logits",),
        why="the temperature (and so top-k, top-p) computed in the logits' dtype: bfloat16 on a GPU",
    ),
    Mutant(
        "draw_with_exp",
        STEM,
        (
            (
                "    cdf = logits.float().softmax(dim=-1).cumsum(dim=-1)\n",
                "    cdf = logits.float().exp().cumsum(dim=-1)\n",
            ),
        ),
        must_fail=("cold_temperature_on_large_logits",),
        why="exp() without subtracting the row's maximum overflows at low temperatures",
    ),
    Mutant(
        "u_not_scaled_by_the_total",
        STEM,
        (("    scaled_u = u.to(cdf.dtype)[:, None] * cdf[:, -1:]\n", "    scaled_u = u.to(cdf.dtype)[:, None]\n"),),
        must_fail=("uniform_close_to_one",),
        why="a u above the float32 CDF's total lands past the end: clamped to the last token, which top-k removed",
    ),
]
