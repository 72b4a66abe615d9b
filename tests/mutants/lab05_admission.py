"""Broken variants of solutions/lab05_admission.py: one per rule of its contract and per pitfall its docstring
names, one per class of hole of ``mutants.KINDS``, and a correct policy designed another way
(``EQUIVALENT``: a heap, passes counted from an admission log, ties broken newest first), which must keep
every point: the grader checks the rules, not one reference's decisions."""

from mutants import SOLUTIONS, Mutant

STEM = "lab05_admission"

# every fixed test -> the randomized test, which must fail with it
RANDOMIZED = {
    name: "random_workloads"
    for name in (
        "reserved_len_covers_max_tokens",
        "admits_exactly_what_fits",
        "prefix_locked_before_memory_is_counted",
        "refused_request_leaves_no_lock",
        "measuring_prefixes_locks_nothing",
        "budget_and_rows",
        "batch_prefix_waits_one_batch",
        "longest_prefix_first",
        "skips_what_cannot_start",
        "aging_bound",
        "passes_counted_per_admission",
        "ranks_change_within_a_call",
        "aged_request_that_cannot_start_ends_the_call",
        "aged_requests_oldest_first",
        "only_later_arrivals_pass",
        "batch_prefix_waiter_is_passed",
    )
}

_FIT = (
    "                if not ctx.waits_for_batch_prefix(r):\n"
    "                    ctx.match(r)\n"
    "                    if ctx.pages_needed(r) <= ctx.available_pages() - ctx.reserved_pages:\n"
    "                        chosen = r\n"
    "                        break\n"
    "                    ctx.unmatch(r)\n"
)
_NEED = "                    ctx.match(r)\n                    if ctx.pages_needed(r) <= "
_PASS = "                if arrival[r.uid] < arrival[chosen.uid]:\n"
_AGED_RANK = "            if self.passed[r.uid] >= self.AGING:\n                return (0, 0, arrival[r.uid])\n"
_AGED_STOP = "                if self.passed[r.uid] >= self.AGING:\n                    return  #"
_MEASURE = "            prefix[r.uid] = ctx.match(r)\n            ctx.unmatch(r)\n"

MUTANTS = [
    Mutant(
        "reserves_prompt_only",
        STEM,
        (("        return req.max_device_len - 1\n", "        return req.device_len\n"),),
        must_fail=("reserved_len_covers_max_tokens", "random_workloads", "engine_runs_your_policy"),
        hint="reserves only the prompt",
        why="no KV reserved for the outputs: decodes run out of memory and the scheduler retracts",
    ),
    Mutant(
        "ignores_reservations",
        STEM,
        (
            (
                "ctx.pages_needed(r) <= ctx.available_pages() - ctx.reserved_pages:\n",
                "ctx.pages_needed(r) <= ctx.available_pages():\n",
            ),
        ),
        must_fail=("admits_exactly_what_fits", "random_workloads"),
        hint="memory promised twice",
        why="pages promised to running requests are promised again: over-commit",
    ),
    Mutant(
        "fits_strictly_below",
        STEM,
        (
            (
                "ctx.pages_needed(r) <= ctx.available_pages() - ctx.reserved_pages:\n",
                "ctx.pages_needed(r) < ctx.available_pages() - ctx.reserved_pages:\n",
            ),
        ),
        must_fail=("admits_exactly_what_fits", "random_workloads"),
        hint="`<` where a request that needs exactly the pages left fits",
        why="< for <=: a request that needs exactly the pages left is refused",
        kind="boundary",
    ),
    Mutant(
        "need_in_tokens",
        STEM,
        ((_NEED, "                    hit = ctx.match(r)\n                    if self.reserved_len(r) - hit <= "),),
        must_fail=("admits_exactly_what_fits", "random_workloads"),
        hint="in tokens instead of whole pages",
        why="the reservation counted in tokens, compared with pages: a request that fits is refused with pages "
        "of several tokens (the old lab's hidden-only case, now visible at page size 4)",
        kind="visible_on_cpu",
    ),
    Mutant(
        "need_in_pages_rounded_down",
        STEM,
        (
            (
                _NEED,
                "                    hit = ctx.match(r)\n"
                "                    if (self.reserved_len(r) - hit) // ctx.page_size <= ",
            ),
        ),
        must_fail=("admits_exactly_what_fits", "random_workloads"),
        hint="a partial last page not counted",
        why="a partial last page not counted: over-commit with pages of several tokens",
    ),
    Mutant(
        "available_before_match",
        STEM,
        (
            (
                _NEED + "ctx.available_pages() - ctx.reserved_pages:\n",
                "                    left = ctx.available_pages() - ctx.reserved_pages\n"
                "                    ctx.match(r)\n"
                "                    if ctx.pages_needed(r) <= left:\n",
            ),
        ),
        must_fail=("prefix_locked_before_memory_is_counted", "random_workloads"),
        hint="a matched prefix counted as free",
        why="the pages left read before ctx.match (the contract: with the prefix locked): the matched prefix counts "
        "as available and as held, over-commit",
        kind="order",
    ),
    Mutant(
        "checks_before_match",
        STEM,
        (
            (
                _FIT,
                "                if not ctx.waits_for_batch_prefix(r):\n"
                "                    if ctx.pages_needed(r) <= ctx.available_pages() - ctx.reserved_pages:\n"
                "                        ctx.match(r)\n"
                "                        chosen = r\n"
                "                        break\n",
            ),
        ),
        must_fail=("prefix_locked_before_memory_is_counted", "random_workloads"),
        hint="memory checked before ctx.match",
        why="the memory check counts the whole prompt: a request sharing a cached prefix is refused although it fits",
    ),
    Mutant(
        "leaks_refused_lock",
        STEM,
        (("                        break\n                    ctx.unmatch(r)\n", "                        break\n"),),
        must_fail=("refused_request_leaves_no_lock", "random_workloads"),
        hint="leaked lock",
        why="a refused request keeps its cached prefix locked: never evictable",
    ),
    Mutant(
        "measuring_keeps_locks",
        STEM,
        (
            (_MEASURE, "            prefix[r.uid] = ctx.match(r)\n"),
            (
                _FIT,
                "                if not ctx.waits_for_batch_prefix(r):\n"
                "                    if ctx.pages_needed(r) <= ctx.available_pages() - ctx.reserved_pages:\n"
                "                        chosen = r\n"
                "                        break\n",
            ),
            (
                "    def admit(self, waiting: Sequence[Req], ctx: AdmissionContext) -> None:\n",
                "    def admit(self, waiting: Sequence[Req], ctx: AdmissionContext) -> None:\n"
                "        try:\n"
                "            self._admit(waiting, ctx)\n"
                "        finally:  # the prefixes measured stay locked until the call ends\n"
                "            for r in waiting:\n"
                "                if not r.is_admitted:\n"
                "                    ctx.unmatch(r)\n"
                "\n"
                "    def _admit(self, waiting: Sequence[Req], ctx: AdmissionContext) -> None:\n",
            ),
        ),
        must_fail=("measuring_prefixes_locks_nothing", "random_workloads"),
        hint="with other requests' prefixes still locked",
        why="every waiting request is matched to measure its prefix and stays locked until the call ends: a request "
        "that fits only while another's cached prefix is evictable is refused",
    ),
    Mutant(
        "ignores_budget",
        STEM,
        (("        while ctx.has_room:\n", "        while ctx.rows_left > 0:\n"),),
        must_fail=("budget_and_rows", "random_workloads"),
        hint="admitting past the token budget",
        why="admission goes on after the batch's prompt-token budget is spent",
    ),
    Mutant(
        "ignores_rows",
        STEM,
        (("        while ctx.has_room:\n", "        while ctx.tokens_left > 0 and ctx.cut is None:\n"),),
        must_fail=("budget_and_rows", "random_workloads"),
        hint="admitting with no row left",
        why="the stop test looks at the budget and the cut but not at the rows (ctx.has_room checks all three): "
        "admission goes on with no request-table row left although the budget is not spent",
        kind="one_argument",
    ),
    Mutant(
        "admits_batch_prefix_waiters",
        STEM,
        (("                if not ctx.waits_for_batch_prefix(r):\n", "                if True:\n"),),
        must_fail=("batch_prefix_waits_one_batch", "random_workloads"),
        hint="waits_for_batch_prefix",
        why="two requests sharing a new prefix both compute it in one batch instead of the second reusing it",
    ),
    Mutant(
        "stops_at_batch_prefix",
        STEM,
        (
            (
                "                if not ctx.waits_for_batch_prefix(r):\n",
                "                if ctx.waits_for_batch_prefix(r):\n"
                "                    return\n"
                "                if True:\n",
            ),
        ),
        must_fail=("batch_prefix_waits_one_batch", "random_workloads"),
        hint="could start",
        why="a request that waits for this batch's prefix ends the call: the requests behind it wait too",
    ),
    Mutant(
        "arrival_order",
        STEM,
        (("            return (1, -prefix[r.uid], arrival[r.uid])\n", "            return (1, 0, arrival[r.uid])\n"),),
        must_fail=("longest_prefix_first", "random_workloads"),
        hint="longest cached prefix first",
        why="first come, first served among the requests that are not aged: the cache is ignored",
    ),
    Mutant(
        "shortest_prefix_first",
        STEM,
        (
            (
                "            return (1, -prefix[r.uid], arrival[r.uid])\n",
                "            return (1, prefix[r.uid], arrival[r.uid])\n",
            ),
        ),
        must_fail=("longest_prefix_first", "random_workloads"),
        hint="longest cached prefix first",
        why="the ranking's sign flipped: the shortest cached prefix first",
    ),
    Mutant(
        "longest_prompt_first",
        STEM,
        (
            (
                "            return (1, -prefix[r.uid], arrival[r.uid])\n",
                "            return (1, -len(r.fill_ids), arrival[r.uid])\n",
            ),
        ),
        must_fail=("longest_prefix_first", "random_workloads"),
        hint="longest cached prefix first",
        why="ranked by the prompt's length instead of its cached prefix",
    ),
    Mutant(
        "ties_broken_at_random",
        STEM,
        (
            (
                "            return (1, -prefix[r.uid], arrival[r.uid])\n",
                '            return (1, -prefix[r.uid], __import__("random").random())\n',
            ),
        ),
        must_fail=("shared_prefix_hit_rate",),
        hint="never on time or randomness",
        why="ties among equal cached prefixes broken at random: two runs of a workload (two tensor-parallel "
        "ranks) decide differently",
    ),
    Mutant(
        "head_of_line_blocking",
        STEM,
        (("                cannot.add(r.uid)\n", "                return\n"),),
        must_fail=("skips_what_cannot_start", "random_workloads"),
        hint="head-of-line blocking",
        why="no skip-ahead: the first request that cannot start ends the call",
    ),
    Mutant(
        "no_aging",
        STEM,
        (("    AGING = 4  #", "    AGING = 10**9  #"),),
        must_fail=("aging_bound", "random_workloads"),
        hint="after AGING = 4 passes nobody passes it",
        why="pure longest-prefix-first: a request that shares nothing starves while shared ones keep coming",
    ),
    Mutant(
        "aged_one_pass_late",
        STEM,
        (
            (_AGED_RANK, _AGED_RANK.replace(">=", ">")),
            (_AGED_STOP, _AGED_STOP.replace(">=", ">")),
        ),
        must_fail=("aging_bound", "random_workloads"),
        hint="after AGING = 4 passes nobody passes it",
        why="aged after AGING + 1 passes (> for >=): the bound is broken by one",
        kind="boundary",
    ),
    Mutant(
        "passes_counted_once_per_call",
        STEM,
        (
            ("        cannot: set[int] = set()", "        counted: set[int] = set()\n        cannot: set[int] = set()"),
            (
                _PASS + "                    self.passed[r.uid] += 1\n",
                "                if arrival[r.uid] < arrival[chosen.uid] and r.uid not in counted:\n"
                "                    counted.add(r.uid)\n"
                "                    self.passed[r.uid] += 1\n",
            ),
        ),
        must_fail=("passes_counted_per_admission", "random_workloads"),
        hint="after AGING = 4 passes nobody passes it",
        why="a request is counted passed once per batch, however many newer requests start past it",
        kind="each_part",
    ),
    Mutant(
        "passes_only_when_refused",
        STEM,
        ((_PASS, "                if arrival[r.uid] < arrival[chosen.uid] and r.uid in cannot:\n"),),
        must_fail=("aging_bound", "random_workloads"),
        hint="whatever keeps it waiting",
        why="a request is counted passed only when it was tried and could not start (the old lab's count): one "
        "that the rows or the budget never reach starves",
    ),
    Mutant(
        "passes_by_older_requests",
        STEM,
        ((_PASS, "                if True:\n"),),
        must_fail=("only_later_arrivals_pass", "random_workloads"),
        hint="only requests that arrived after it pass it",
        why="every admission counts as a pass, also of requests that arrived earlier: a newer request is aged too "
        "early and starts before longer prefixes",
    ),
    Mutant(
        "batch_prefix_waiter_not_passed",
        STEM,
        (
            (
                _PASS,
                "                if arrival[r.uid] < arrival[chosen.uid] and not ctx.waits_for_batch_prefix(r):\n",
            ),
        ),
        must_fail=("batch_prefix_waiter_is_passed", "random_workloads"),
        hint="which ends the call",
        why="a request that waits for this batch's prefix is not counted passed: it is passed more than AGING times",
    ),
    Mutant(
        "ranks_fixed_per_call",
        STEM,
        (
            (
                "        arrival = {r.uid: i for i, r in enumerate(queue)}\n",
                "        arrival = {r.uid: i for i, r in enumerate(queue)}\n        start = dict(self.passed)\n",
            ),
            (_AGED_RANK, _AGED_RANK.replace("self.passed[r.uid]", "start[r.uid]")),
            (_AGED_STOP, _AGED_STOP.replace("self.passed[r.uid]", "start[r.uid]")),
        ),
        must_fail=("ranks_change_within_a_call", "random_workloads"),
        hint="after AGING = 4 passes nobody passes it",
        why="aged requests are found once, at the start of the call: one aged by an admission of this call is "
        "passed again in the same call",
    ),
    Mutant(
        "skips_an_aged_request",
        STEM,
        ((_AGED_STOP + " an aged request that cannot start: the memory that frees up is its\n", ""),),
        must_fail=("aged_request_that_cannot_start_ends_the_call", "random_workloads"),
        hint="which ends the call",
        why="an aged request that cannot start is skipped like any other: newer small requests keep taking the memory",
    ),
    Mutant(
        "aged_ranked_by_prefix",
        STEM,
        ((_AGED_RANK, _AGED_RANK.replace("(0, 0, arrival[r.uid])", "(0, -prefix[r.uid], arrival[r.uid])")),),
        must_fail=("aged_requests_oldest_first", "random_workloads"),
        hint="an aged request ranks first, oldest first",
        why="aged requests ordered by cached prefix: a newer aged one passes an older aged one",
    ),
    Mutant(
        "inherits_reserved_len",
        STEM,
        (("    def reserved_len(self, req: Req) -> int:\n", "    def _unused_reserved_len(self, req: Req) -> int:\n"),),
        must_fail=("reserved_len_covers_max_tokens", "random_workloads"),
        hint="yourself",
        why="reserved_len left to the interface's default, which is the answer",
        kind="engine_reference",
    ),
    Mutant(
        "reserved_len_calls_super",
        STEM,
        (
            (
                "        return req.max_device_len - 1\n        # END SOLUTION\n",
                "        return super().reserved_len(req)\n        # END SOLUTION\n",
            ),
        ),
        must_fail=("reserved_len_covers_max_tokens", "random_workloads"),
        hint="your code calls the engine's own",
        why="reserved_len delegates to the interface's default, which is the answer",
        kind="engine_reference",
    ),
    Mutant(
        "derives_from_optimistic",
        STEM,
        (
            (
                "from minisgl.scheduler.admission import AdmissionContext, AdmissionPolicy\n",
                "from minisgl.scheduler.admission import AdmissionContext, Optimistic\n",
            ),
            ("class CacheAwareAdmission(AdmissionPolicy):\n", "class CacheAwareAdmission(Optimistic):\n"),
        ),
        must_fail=("reserved_len_covers_max_tokens", "aging_bound", "random_workloads"),
        hint="the engine's own",
        why="the lab class derives from the engine's Optimistic policy (its own methods unchanged)",
        kind="engine_reference",
    ),
    Mutant(
        "fits_by_the_graders_probe",
        STEM,
        (
            (
                _NEED + "ctx.available_pages() - ctx.reserved_pages:\n",
                "                    from autograder.scheduler_sim import Probe\n"
                "\n"
                "                    ctx.match(r)\n"
                "                    if Probe(ctx).fits(r):\n",
            ),
        ),
        must_fail=("admits_exactly_what_fits", "random_workloads"),
        hint="the engine's own Probe",
        why="the memory test taken from the grader's read-only view of the context",
        kind="engine_reference",
    ),
]


def _admit_body() -> str:
    """The solution's whole admit body (between its markers), replaced whole by the equivalent."""
    text = (SOLUTIONS / f"{STEM}.py").read_text()
    start = text.index("\n", text.index('# BEGIN SOLUTION what="the admission')) + 1
    return text[start : text.index("        # END SOLUTION", start)]


# correct, designed another way: it must keep every point
EQUIVALENT = Mutant(
    "lab05_written_differently",
    STEM,
    (
        (
            "from collections.abc import Sequence\n",
            "import heapq\nfrom collections import Counter\nfrom collections.abc import Sequence\n",
        ),
        (
            "    def admit(self, waiting: Sequence[Req], ctx: AdmissionContext) -> None:\n",
            "    @staticmethod\n"
            "    def _starts(r: Req, ctx: AdmissionContext) -> bool:\n"
            "        ctx.match(r)\n"
            "        if ctx.pages_needed(r) + ctx.reserved_pages > ctx.available_pages():\n"
            "            ctx.unmatch(r)\n"
            "            return False\n"
            "        return True\n"
            "\n"
            "    def admit(self, waiting: Sequence[Req], ctx: AdmissionContext) -> None:\n",
        ),
        (
            _admit_body(),
            "        # a heap at each step, ties broken newest first; the aged ones by age\n"
            "        order = {r.uid: i for i, r in enumerate(waiting)}\n"
            "        self.passed = Counter({u: n for u, n in self.passed.items() if u in order})\n"
            "        cached = {}\n"
            "        for r in waiting:\n"
            "            cached[r.uid] = ctx.match(r)\n"
            "            ctx.unmatch(r)\n"
            "        left, dead = list(waiting), set()\n"
            "        while ctx.has_room:\n"
            "            aged = [r for r in left if self.passed[r.uid] >= self.AGING]\n"
            "            if aged:\n"
            "                pick = min(aged, key=lambda r: order[r.uid])\n"
            "                if ctx.waits_for_batch_prefix(pick) or not self._starts(pick, ctx):\n"
            "                    return\n"
            "            else:\n"
            "                by_uid = {r.uid: r for r in left}\n"
            "                heap = [(-cached[r.uid], -order[r.uid], r.uid) for r in left if r.uid not in dead]\n"
            "                heapq.heapify(heap)\n"
            "                pick = None\n"
            "                while heap and pick is None:\n"
            "                    r = by_uid[heapq.heappop(heap)[2]]\n"
            "                    if not ctx.waits_for_batch_prefix(r) and self._starts(r, ctx):\n"
            "                        pick = r\n"
            "                    else:\n"
            "                        dead.add(r.uid)\n"
            "                if pick is None:\n"
            "                    return\n"
            "            ctx.admit(pick)\n"
            "            left.remove(pick)\n"
            "            del self.passed[pick.uid]\n"
            "            for r in left:\n"
            "                if order[r.uid] < order[pick.uid]:\n"
            "                    self.passed[r.uid] += 1\n",
        ),
    ),
    must_fail=(),
)
