"""Broken variants of solutions/lab07_chunking.py: one per pitfall its docstring names, one of each kind of
``mutants.KINDS`` that can occur here, a correct one written another way (``EQUIVALENT``), and two that the
hidden tests catch (``HIDDEN_MUTANTS``: the larger of the two budgets when nothing decodes, which the visible
budget test now catches too; and a policy that keeps each request's progress itself, which agrees with
``req.cached_len`` until a retracted request is readmitted: the visible ``extend_end_keeps_no_state`` shows
it on one policy, the hidden engine tests on the real scheduler)."""

from mutants import Mutant

STEM = "lab07_chunking"

# every fixed test -> the randomized test, which must fail with it (the int, no-state and retraction tests have
# no partner: the scheduler's budgets are ints and the random workloads never retract)
RANDOMIZED = {
    name: "random_workloads"
    for name in (
        "budget_busy_while_decoding_idle_when_not",
        "extend_end_whole_prompt_when_it_fits",
        "extend_end_cuts_at_the_budget",
        "extend_end_from_a_cached_prefix",
        "decode_first_only_between_chunks",
    )
}

_BUDGET = "        return busy if num_decoding else idle\n"
_END = "        return int(min(req.device_len, req.cached_len + tokens_left))\n"
_FIRST = "        return after_chunk and num_decodable > 0\n"
_CLASS = "class BudgetChunking(ChunkingPolicy):\n"
_IMPORT = "from minisgl.scheduler.chunking import ChunkingPolicy\n"

# no input check and no rule over several parts: every method answers from scalars
NOT_APPLICABLE = {
    "each_part": "no rule of the contract is over several parts: budget and decode_first answer from scalars, "
    "extend_end from one request's two lengths and one budget (nothing is a sum or a list whose elements must "
    "each hold)",
}

MUTANTS = [
    Mutant(
        "idle_budget_while_decoding",
        STEM,
        ((_BUDGET, "        return idle\n"),),
        must_fail=("budget_busy_while_decoding_idle_when_not", "random_workloads", "engine_respects_the_budget"),
        hint="idle here stalls every stream",
        why="the idle budget while requests decode: a long prompt in one batch stalls every running stream",
    ),
    Mutant(
        "busy_budget_when_idle",
        STEM,
        ((_BUDGET, "        return busy\n"),),
        must_fail=("budget_busy_while_decoding_idle_when_not", "random_workloads"),
        hint="needless chunks",
        why="the busy budget when nothing decodes: prompts cut for nobody's sake",
    ),
    Mutant(
        "cut_ignores_budget",
        STEM,
        ((_END, "        return req.device_len\n"),),
        must_fail=("extend_end_cuts_at_the_budget", "random_workloads", "engine_respects_the_budget"),
        hint="ignores tokens_left",
        why="every prompt whole, whatever the budget: no chunking at all",
    ),
    Mutant(
        "one_past_budget",
        STEM,
        ((_END, "        return int(min(req.device_len, req.cached_len + tokens_left + 1))\n"),),
        must_fail=("extend_end_cuts_at_the_budget", "random_workloads", "engine_respects_the_budget"),
        hint="one token past the budget",
        why="an off-by-one cut: each chunk one token over the budget",
    ),
    Mutant(
        "returns_length",
        STEM,
        ((_END, "        return int(min(req.device_len - req.cached_len, tokens_left))\n"),),
        must_fail=("extend_end_from_a_cached_prefix", "random_workloads"),
        hint="the length of the extend, not its end position",
        why="the chunk's length instead of its end: wrong as soon as the extend starts past 0",
    ),
    Mutant(
        "never_reaches_device_len",
        STEM,
        ((_END, "        return int(min(req.device_len - 1, req.cached_len + tokens_left))\n"),),
        must_fail=("extend_end_whole_prompt_when_it_fits", "random_workloads", "engine_tokens_match_unchunked"),
        hint="never samples its first token",
        why="the extend stops one short of device_len: the request never samples",
    ),
    Mutant(
        "prompt_len_limit",
        STEM,
        ((_END, "        return int(min(req.prompt_len, req.cached_len + tokens_left))\n"),),
        must_fail=("extend_end_retracted_request", "engine_retracted_request_continues"),
        hint="prompt_len instead of device_len",
        why="a retracted request's outputs are never prefilled again",
    ),
    Mutant(
        "float_end",
        STEM,
        ((_END, "        return min(req.device_len, req.cached_len + tokens_left)\n"),),
        must_fail=("extend_end_returns_an_int",),
        hint="return an int",
        why="a float position when tokens_left is a float",
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
        "always_decodes_first",
        STEM,
        ((_FIRST, "        return num_decodable > 0\n"),),
        must_fail=("decode_first_only_between_chunks", "random_workloads", "engine_starves_nobody"),
        hint="waiting requests starve while others decode",
        why="decode whenever something decodes: nobody new starts until the running requests finish",
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
        "busy_only_past_one_decoding",
        STEM,
        ((_BUDGET, "        return busy if num_decoding > 1 else idle\n"),),
        must_fail=("budget_busy_while_decoding_idle_when_not", "random_workloads"),
        hint="not > 1",
        why="num_decoding > 1 for > 0: with exactly one request decoding the idle budget stalls its stream",
        kind="boundary",
    ),
    Mutant(
        "prefills_right_after_a_cut",
        STEM,
        ((_FIRST, "        return not after_chunk and num_decodable > 0\n"),),
        must_fail=("decode_first_only_between_chunks", "random_workloads", "engine_starves_nobody"),
        hint="the order swapped",
        why="decode and prefill in the wrong order: the next chunk right after a cut, a decode step before a new "
        "prompt",
        kind="order",
    ),
    Mutant(
        "derives_from_the_engine",
        STEM,
        (
            (_IMPORT, "from minisgl.scheduler.chunking import ChunkingPolicy, GreedyChunking\n"),
            (_CLASS, "class BudgetChunking(GreedyChunking):\n    pass\n\n\nclass _Unused(ChunkingPolicy):\n"),
        ),
        must_fail=("budget_busy_while_decoding_idle_when_not", "random_workloads"),
        hint="the engine's own",
        why="the engine's GreedyChunking under the lab's name: every answer is the reference's",
        kind="engine_reference",
    ),
    Mutant(
        "delegates_to_the_engine",
        STEM,
        (
            (_IMPORT, "from minisgl.scheduler.chunking import ChunkingPolicy, GreedyChunking\n"),
            (_END, "        return GreedyChunking().extend_end(req, tokens_left)\n"),
        ),
        must_fail=("extend_end_whole_prompt_when_it_fits", "random_workloads"),
        hint="the engine's own",
        why="extend_end calls the engine's GreedyChunking.extend_end",
        kind="engine_reference",
    ),
    Mutant(
        "budget_min_while_decoding",
        STEM,
        ((_BUDGET, "        return min(busy, idle) if num_decoding else idle\n"),),
        must_fail=("budget_busy_while_decoding_idle_when_not", "random_workloads", "budget_idle_below_busy"),
        hint="the smaller of the two budgets",
        why="the smaller budget while decoding: the idle one when it is the smaller (once only a hidden test had "
        "idle < busy)",
        kind="visible_on_cpu",
    ),
    Mutant(
        "resumes_where_it_cut",
        STEM,
        (
            (_CLASS, _CLASS + "    def __init__(self):\n        self.cut = {}\n\n"),
            (
                _END,
                "        start = max(req.cached_len, self.cut.get(req.uid, 0))\n"
                "        end = int(min(req.device_len, start + tokens_left))\n"
                "        self.cut[req.uid] = end\n"
                "        return end\n",
            ),
        ),
        must_fail=("extend_end_keeps_no_state",),
        hint="kept progress of its own",
        why="the policy remembers where it cut each request: a readmitted request skips what it must recompute "
        "(once only the hidden engine tests retracted a request that was chunked)",
        kind="visible_on_cpu",
    ),
]

# correct, written another way: it must keep every point
EQUIVALENT = Mutant(
    "lab07_written_differently",
    STEM,
    (
        (_BUDGET, "        return idle if num_decoding == 0 else busy\n"),
        (
            _END,
            "        end = req.cached_len + tokens_left\n"
            "        return req.device_len if end >= req.device_len else int(end)\n",
        ),
        (_FIRST, "        return bool(num_decodable) and after_chunk\n"),
    ),
    must_fail=(),
)

HIDDEN_MUTANTS = [
    Mutant(
        "budget_max_when_idle",
        STEM,
        ((_BUDGET, "        return busy if num_decoding else max(busy, idle)\n"),),
        must_fail=("budget_idle_below_busy",),
        why="the larger budget when nothing decodes: the busy one when it is the larger",
    ),
    Mutant(
        "keeps_own_progress",
        STEM,
        (
            (
                _CLASS,
                _CLASS + "    def __init__(self):\n        self.progress = {}\n\n",
            ),
            (
                _END,
                "        start = self.progress.get(req.uid, req.cached_len)\n"
                "        end = int(min(req.device_len, start + tokens_left))\n"
                "        self.progress[req.uid] = end\n"
                "        return end\n",
            ),
        ),
        must_fail=("engine_retracted_in_chunks_radix", "engine_retracted_in_chunks_naive"),
        why="its own record of where each prompt was cut, stale once a retracted request is readmitted",
    ),
]
