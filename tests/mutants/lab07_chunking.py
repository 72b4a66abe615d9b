"""Broken variants of solutions/lab07_chunking.py: one per pitfall its docstring names, one of each kind of
``mutants.KINDS`` that can occur here, a correct one written another way (``EQUIVALENT``), and three that the
hidden tests catch (``HIDDEN_MUTANTS``: the larger of the two budgets when nothing decodes, which the visible
budget test now catches too; a policy that keeps each request's progress itself, which agrees with
``req.cached_len`` until a retracted request is readmitted; a fit of the time per token, which is right on
exact samples and wrong on noisy ones)."""

from mutants import Mutant

STEM = "lab07_chunking"

# every fixed test -> the randomized test, which must fail with it (the int, no-state, retraction and fit
# tests have no partner: the scheduler's budgets are ints, the random workloads never retract or fit)
RANDOMIZED = {  # budget_starts_the_clock has none: no random workload has an unlimited busy budget
    name: "random_workloads"
    for name in (
        "budget_busy_while_decoding_idle_when_not",
        "extend_end_whole_prompt_when_it_fits",
        "extend_end_cuts_at_the_budget",
        "extend_end_from_a_cached_prefix",
        "extend_end_cuts_at_the_time_left",
        "decode_first_only_between_chunks",
    )
}

_BUDGET_IF = "        if num_decoding > 0:\n"
_CLOCK = "            self.time_left = chunk_time(self.cost, 0, busy)\n"
_IDLE = "        self.time_left = math.inf\n        return idle\n"
_RANGE = "        lo, hi = start + 1, int(min(req.device_len, start + tokens_left))\n"
_FITS = "            if chunk_time(self.cost, start, mid) <= self.time_left:\n"
_CHARGE = "        self.time_left -= chunk_time(self.cost, start, lo)\n"
_FIRST = "        return after_chunk and num_decodable > 0\n"
_INF = "    if math.isinf(end):\n        return math.inf\n"
_PAIRS = "    pairs = n * (start + end + 1) / 2  # sum of p + 1 over p in [start, end)\n"
_SAMPLE_CHECK = "        if end <= start:\n"
_ROW = "        rows.append((n, n * (start + end + 1) / 2, seconds))\n"
_BOTH = "        if a >= 0 and b >= 0:\n"
_DET = "    if det > 1e-12 * nn * pp:\n"
_CLASS = "class TimedChunking(ChunkingPolicy):\n"
_IMPORT = "from minisgl.scheduler.chunking import ChunkingPolicy, PrefillCost\n"

NOT_APPLICABLE: dict[str, str] = {}

MUTANTS = [
    Mutant(
        "pairs_from_zero",
        STEM,
        ((_PAIRS, "    pairs = n * (n + 1) / 2\n"),),
        must_fail=("chunk_time_fixed_cases", "extend_end_cuts_at_the_time_left", "random_workloads"),
        hint="pairs counted from 0",
        why="a chunk after a cached prefix priced as if it started at 0: later chunks too long, gaps past the target",
    ),
    Mutant(
        "nan_from_inf",
        STEM,
        ((_INF, ""),),
        must_fail=("chunk_time_fixed_cases", "budget_starts_the_clock"),
        hint="nan",
        why="0 * inf: an unlimited busy budget with per_pair 0 gives a nan clock, and nothing fits a nan",
    ),
    Mutant(
        "fit_goes_negative",
        STEM,
        ((_BOTH, "        if True:\n"),),
        must_fail=("fit_cost_never_negative_never_crashes",),
        hint="a negative coefficient",
        why="the 2-feature fit taken as it comes: a negative per_pair makes long chunks look free",
    ),
    Mutant(
        "fit_divides_by_zero",
        STEM,
        ((_DET, "    if True:\n"),),
        must_fail=("fit_cost_never_negative_never_crashes",),
        hint="divided by zero",
        why="no check of the determinant: one sample (or samples alike) crash the fit",
    ),
    Mutant(
        "idle_budget_while_decoding",
        STEM,
        ((_BUDGET_IF, "        if False:\n"),),
        must_fail=("budget_busy_while_decoding_idle_when_not", "random_workloads", "engine_keeps_the_gap"),
        hint="idle here stalls every stream",
        why="the idle budget and no clock while requests decode: a long prompt in one batch stalls every stream",
    ),
    Mutant(
        "no_clock_while_decoding",
        STEM,
        ((_CLOCK, "            self.time_left = math.inf\n"),),
        must_fail=("budget_starts_the_clock", "extend_end_cuts_at_the_time_left", "random_workloads"),
        hint="no clock while requests decode",
        why="chunks of equal size again (GreedyChunking): the last chunk of a long prompt stretches the gap",
    ),
    Mutant(
        "clock_while_idle",
        STEM,
        ((_IDLE, "        self.time_left = chunk_time(self.cost, 0, busy)\n        return idle\n"),),
        must_fail=("budget_starts_the_clock", "random_workloads"),
        hint="a clock while nothing decodes",
        why="nobody waits, yet prompts are cut to the gap: a later first token for nothing",
    ),
    Mutant(
        "clock_not_charged",
        STEM,
        ((_CHARGE, ""),),
        must_fail=("extend_end_charges_the_clock",),
        hint="charge each extend's chunk_time",
        why="every request of a batch gets the whole gap: a batch of several takes several gaps",
    ),
    Mutant(
        "clock_without_attention",
        STEM,
        ((_CLOCK, "            self.time_left = self.cost.per_token * busy\n"),),
        must_fail=("budget_starts_the_clock", "extend_end_cuts_at_the_time_left", "random_workloads"),
        hint="left out the attention term",
        why="the clock is per_token * busy: a busy-token chunk from 0 no longer fits its own gap, so every chunk is "
        "cut short of the configured budget",
    ),
    Mutant(
        "clock_not_reset",
        STEM,
        ((_CLOCK, "            self.time_left = min(self.time_left, chunk_time(self.cost, 0, busy))\n"),),
        must_fail=("budget_starts_the_clock", "extend_end_charges_the_clock", "random_workloads"),
        hint="not started afresh",
        why="the clock carries over: each batch gets what the last one left, chunks shrink to one token",
    ),
    Mutant(
        "strictly_within_the_time",
        STEM,
        ((_FITS, "            if chunk_time(self.cost, start, mid) < self.time_left:\n"),),
        must_fail=("extend_end_cuts_at_the_time_left", "random_workloads"),
        hint="one token short of the time left",
        why="< for <=: a chunk that takes exactly the gap is cut a token short",
        kind="boundary",
    ),
    Mutant(
        "empty_extend",
        STEM,
        ((_RANGE, "        lo, hi = start, int(min(req.device_len, start + tokens_left))\n"),),
        must_fail=("extend_end_at_least_one_token",),
        hint="an empty extend",
        why="no minimum of one token: a target below one token's cost never finishes the prompt",
    ),
    Mutant(
        "cut_ignores_budget",
        STEM,
        ((_RANGE, "        lo, hi = start + 1, req.device_len\n"),),
        must_fail=("extend_end_cuts_at_the_budget", "random_workloads"),
        hint="ignores tokens_left",
        why="the clock alone: while nothing decodes (no clock) every prompt is whole, whatever the budget",
    ),
    Mutant(
        "prompt_len_limit",
        STEM,
        ((_RANGE, "        lo, hi = start + 1, int(min(req.prompt_len, start + tokens_left))\n"),),
        must_fail=("extend_end_retracted_request", "engine_retracted_request_continues"),
        hint="prompt_len instead of device_len",
        why="a retracted request's outputs are never prefilled again",
    ),
    Mutant(
        "never_decodes_between_chunks",
        STEM,
        ((_FIRST, "        return False\n"),),
        must_fail=("decode_first_only_between_chunks", "random_workloads", "engine_starves_nobody"),
        hint="no decode step between two chunks",
        why="a long prompt's chunks run back to back: the running streams stall for the whole prompt",
    ),
    Mutant(
        "decodes_when_nothing_can",
        STEM,
        ((_FIRST, "        return after_chunk\n"),),
        must_fail=("decode_first_only_between_chunks", "random_workloads"),
        hint="nothing can decode",
        why="decode_first looks at after_chunk only: a decode step after every cut, even with nothing to decode "
        "(a step without a batch); the case (True, 0) has only num_decodable wrong",
        kind="one_argument",
    ),
    Mutant(
        "fit_checks_the_first_sample_only",
        STEM,
        ((_SAMPLE_CHECK, "        if end <= start and not rows:\n"),),
        must_fail=("fit_cost_rejects_bad_samples",),
        hint="raise ValueError",
        why="the first sample checked, the rest taken on trust: an empty extend later in the list is fitted",
        kind="each_part",
    ),
    Mutant(
        "prefills_right_after_a_cut",
        STEM,
        ((_FIRST, "        return not after_chunk and num_decodable > 0\n"),),
        must_fail=("decode_first_only_between_chunks", "random_workloads"),
        hint="the order swapped",
        why="decode and prefill in the wrong order: the next chunk right after a cut, a decode step before a new "
        "prompt",
        kind="order",
    ),
    Mutant(
        "derives_from_the_engine",
        STEM,
        (
            (_IMPORT, _IMPORT + "from minisgl.scheduler.timed import TimedChunking as _Engine\n"),
            (_CLASS, "class TimedChunking(_Engine):\n    pass\n\n\nclass _Unused(ChunkingPolicy):\n"),
        ),
        must_fail=("budget_busy_while_decoding_idle_when_not", "random_workloads"),
        hint="the engine's own",
        why="the engine's TimedChunking under the lab's name: every answer is the reference's",
        kind="engine_reference",
    ),
    Mutant(
        "budget_min_while_decoding",
        STEM,
        ((_CLOCK + "            return busy\n", _CLOCK + "            return min(busy, idle)\n"),),
        must_fail=("budget_busy_while_decoding_idle_when_not", "random_workloads", "budget_idle_below_busy"),
        hint="the smaller of the two budgets",
        why="the smaller budget while decoding: the idle one when it is the smaller (once only a hidden test had "
        "idle < busy)",
        kind="visible_on_cpu",
    ),
]

# correct, written another way: it must keep every point
EQUIVALENT = Mutant(
    "lab07_written_differently",
    STEM,
    (
        (_PAIRS, "    pairs = (end * (end + 1) - start * (start + 1)) / 2\n"),
        (
            "        while lo < hi:  # invariant: lo fits (or is the one-token minimum); nothing past hi may be taken\n"
            "            mid = (lo + hi + 1) // 2\n"
            "            if chunk_time(self.cost, start, mid) <= self.time_left:\n"
            "                lo = mid\n"
            "            else:\n"
            "                hi = mid - 1\n",
            "        while lo < hi and chunk_time(self.cost, start, lo + 1) <= self.time_left:\n            lo += 1\n",
        ),
        (_FIRST, "        return bool(num_decodable) and after_chunk\n"),
    ),
    must_fail=(),
)

HIDDEN_MUTANTS = [
    Mutant(
        "budget_max_when_idle",
        STEM,
        ((_IDLE, "        self.time_left = math.inf\n        return max(busy, idle)\n"),),
        must_fail=("budget_idle_below_busy",),
        why="the larger budget when nothing decodes: the busy one when it is the larger",
    ),
    Mutant(
        "keeps_own_progress",
        STEM,
        (
            (
                "        self.time_left = math.inf  # of the batch being built: budget() starts it, extend_end() "
                "charges it\n",
                "        self.time_left = math.inf\n        self.progress = {}\n",
            ),
            (
                "        start = req.cached_len\n",
                "        start = self.progress.get(req.uid, req.cached_len)\n",
            ),
            (_CHARGE, _CHARGE + "        self.progress[req.uid] = lo\n"),
        ),
        must_fail=("engine_retracted_in_chunks_radix", "engine_retracted_in_chunks_naive"),
        why="its own record of where each prompt was cut, stale once a retracted request is readmitted",
    ),
    Mutant(
        "fit_of_time_per_token",
        STEM,
        ((_ROW, "        rows.append((1, (start + end + 1) / 2, seconds / n))\n"),),
        must_fail=("fit_cost_noisy_measurements",),
        why="least squares of seconds per token: exact samples fit alike, noisy ones weigh short extends more",
    ),
]
