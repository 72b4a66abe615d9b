"""Broken variants of solutions/lab05_admission.py: one per pitfall its docstring names, one per class of
hole of ``mutants.KINDS``, a correct one written another way (``EQUIVALENT``), and two that once only
the hidden tests caught (``HIDDEN_MUTANTS``: the reservation counted in tokens, or in pages rounded
down, which agree with whole pages when a page is one token; the visible tests now try 4-token pages
too, ``need_in_tokens_visibly``)."""

from mutants import Mutant

STEM = "lab05_admission"

# every fixed test -> the randomized test, which must fail with it
RANDOMIZED = {
    name: "random_workloads"
    for name in (
        "reserved_len_covers_max_tokens",
        "fits_respects_reservations",
        "fits_matches_first",
        "fits_unmatches_refused",
        "admit_respects_budget",
        "admit_respects_rows",
        "admit_skips_ahead",
        "admit_ages",
        "admit_fifo",
    )
}

_FITS = (
    "        ctx.match(req)\n"
    "        if ctx.pages_needed(req) <= ctx.available_pages() - ctx.reserved_pages:\n"
    "            return True\n"
    "        ctx.unmatch(req)\n"
    "        return False\n"
)

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
                "        if ctx.pages_needed(req) <= ctx.available_pages() - ctx.reserved_pages:\n",
                "        if ctx.pages_needed(req) <= ctx.available_pages():\n",
            ),
        ),
        must_fail=("fits_respects_reservations", "random_workloads"),
        hint="ignoring ctx.reserved_pages over-commits",
        why="pages promised to running requests are promised again: over-commit",
    ),
    Mutant(
        "available_before_match",
        STEM,
        (
            (
                _FITS,
                "        left = ctx.available_pages() - ctx.reserved_pages\n"
                "        ctx.match(req)\n"
                "        if ctx.pages_needed(req) <= left:\n"
                "            return True\n"
                "        ctx.unmatch(req)\n"
                "        return False\n",
            ),
        ),
        must_fail=("fits_matches_first", "random_workloads"),
        hint="available_pages() read before ctx.match(req)",
        why="available_pages() read before ctx.match (the contract: both after it): the matched prefix counts as "
        "available and as held, over-commit",
        kind="order",
    ),
    Mutant(
        "checks_before_match",
        STEM,
        (
            (
                _FITS,
                "        if ctx.pages_needed(req) <= ctx.available_pages() - ctx.reserved_pages:\n"
                "            ctx.match(req)\n"
                "            return True\n"
                "        return False\n",
            ),
        ),
        must_fail=("fits_matches_first", "random_workloads"),
        hint="Match first",
        why="the memory check counts the whole prompt: a request sharing a cached prefix is refused although it fits",
    ),
    Mutant(
        "leaks_refused_lock",
        STEM,
        (("            return True\n        ctx.unmatch(req)\n", "            return True\n"),),
        must_fail=("fits_unmatches_refused", "random_workloads"),
        hint="leaked lock",
        why="a refused request keeps its cached prefix locked: never evictable",
    ),
    Mutant(
        "ignores_budget",
        STEM,
        (("            if not ctx.has_room or any(", "            if ctx.rows_left <= 0 or any("),),
        must_fail=("admit_respects_budget", "random_workloads"),
        hint="admitting past the token budget",
        why="admission goes on after the batch's prompt-token budget is spent",
    ),
    Mutant(
        "ignores_rows",
        STEM,
        (
            (
                "            if not ctx.has_room or any(",
                "            if ctx.tokens_left <= 0 or ctx.cut is not None or any(",
            ),
        ),
        must_fail=("admit_respects_rows", "random_workloads"),
        hint="ignoring rows_left",
        why="the stop test looks at the budget and the cut but not at the rows (ctx.has_room checks all three): "
        "admission goes on with no request-table row left although the budget is not spent",
        kind="one_argument",
    ),
    Mutant(
        "head_of_line_blocking",
        STEM,
        (("                skipped.append(req)\n                continue\n", "                break\n"),),
        must_fail=("admit_skips_ahead", "random_workloads"),
        hint="head-of-line blocking",
        why="no skip-ahead: one request that does not fit blocks every request behind it",
    ),
    Mutant(
        "no_aging",
        STEM,
        (
            (
                " or any(self.passed_over.get(r.uid, 0) >= self.AGING for r in skipped):\n",
                ":\n",
            ),
        ),
        must_fail=("admit_ages", "random_workloads"),
        hint="skip-ahead without aging starves",
        why="a big request is passed over forever while small ones keep coming",
    ),
    Mutant(
        "out_of_order",
        STEM,
        (("        for req in waiting:\n", "        for req in sorted(waiting, key=lambda r: len(r.fill_ids)):\n"),),
        must_fail=("admit_fifo", "random_workloads"),
        hint="out of arrival order",
        why="shortest prompt first instead of first come, first served among those that fit",
    ),
    Mutant(
        "ignores_batch_prefix",
        STEM,
        (("            if ctx.waits_for_batch_prefix(req):\n                continue\n", ""),),
        must_fail=("random_workloads",),
        hint="waits_for_batch_prefix",
        why="two requests sharing a new prefix both compute it in one batch instead of the second reusing it",
    ),
]

MUTANTS += [
    Mutant(
        "fits_strictly_below",
        STEM,
        (
            (
                "        if ctx.pages_needed(req) <= ctx.available_pages() - ctx.reserved_pages:\n",
                "        if ctx.pages_needed(req) < ctx.available_pages() - ctx.reserved_pages:\n",
            ),
        ),
        must_fail=("fits_respects_reservations", "random_workloads"),
        hint="so it fits",
        why="< for <=: a request that needs exactly the pages left is refused",
        kind="boundary",
    ),
    Mutant(
        "aging_counts_summed",
        STEM,
        (
            (
                " or any(self.passed_over.get(r.uid, 0) >= self.AGING for r in skipped):\n",
                " or sum(self.passed_over.get(r.uid, 0) for r in skipped) >= self.AGING:\n",
            ),
        ),
        must_fail=("admit_ages", "random_workloads"),
        hint="a sum of the counts reaches it too soon",
        why="the stop compares the sum of the passed-over counts with AGING instead of each request's own count: "
        "with two requests passed over, admission stops after AGING / 2",
        kind="each_part",
    ),
    Mutant(
        "inherits_reserved_len",
        STEM,
        (("    def reserved_len(self, req: Req) -> int:\n", "    def _unused_reserved_len(self, req: Req) -> int:\n"),),
        must_fail=("reserved_len_covers_max_tokens", "fits_respects_reservations", "random_workloads"),
        hint="yourself",
        why="reserved_len left to the interface's default, which is the answer (max_device_len - 1)",
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
        must_fail=("reserved_len_covers_max_tokens", "fits_respects_reservations", "random_workloads"),
        hint="your code calls the engine's own",
        why="reserved_len delegates to the interface's default, which is the answer (max_device_len - 1)",
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
            ("class FairAdmission(AdmissionPolicy):\n", "class FairAdmission(Optimistic):\n"),
        ),
        must_fail=("reserved_len_covers_max_tokens", "admit_ages", "random_workloads"),
        hint="the engine's own",
        why="the lab class derives from the engine's Optimistic policy (its own methods unchanged)",
        kind="engine_reference",
    ),
    Mutant(
        "need_in_tokens_visibly",
        STEM,
        (
            (
                "        ctx.match(req)\n        if ctx.pages_needed(req) <= ",
                "        hit = ctx.match(req)\n        if self.reserved_len(req) - hit <= ",
            ),
        ),
        must_fail=("fits_respects_reservations", "random_workloads"),
        hint="counted in tokens",
        why="the reservation counted in tokens, compared with pages (once caught only by the hidden tests at "
        "page sizes 2 and 4)",
        kind="visible_on_cpu",
    ),
    Mutant(
        "need_in_pages_rounded_down_visibly",
        STEM,
        (
            (
                "        ctx.match(req)\n        if ctx.pages_needed(req) <= ",
                "        hit = ctx.match(req)\n        if (self.reserved_len(req) - hit) // ctx.page_size <= ",
            ),
        ),
        must_fail=("fits_respects_reservations", "random_workloads"),
        hint="partial last page not counted",
        why="a partial last page not counted: over-commit with pages of several tokens (once caught only by the "
        "hidden tests)",
        kind="visible_on_cpu",
    ),
]

# correct, written another way: it must keep every point
EQUIVALENT = Mutant(
    "lab05_written_differently",
    STEM,
    (
        (
            "        if ctx.pages_needed(req) <= ctx.available_pages() - ctx.reserved_pages:\n",
            "        if ctx.pages_needed(req) + ctx.reserved_pages <= ctx.available_pages():\n",
        ),
        (
            "        skipped: list[Req] = []\n"
            "        for req in waiting:\n"
            "            if not ctx.has_room or any(self.passed_over.get(r.uid, 0) >= self.AGING for r in skipped):\n"
            "                break\n"
            "            if ctx.waits_for_batch_prefix(req):\n"
            "                continue\n"
            "            if not self.fits(req, ctx):\n"
            "                skipped.append(req)\n"
            "                continue\n"
            "            ctx.admit(req)\n"
            "            self.passed_over.pop(req.uid, None)\n"
            "            for r in skipped:\n"
            "                self.passed_over[r.uid] = self.passed_over.get(r.uid, 0) + 1\n",
            "        skipped, aged, queue = [], False, list(waiting)\n"
            "        while queue and ctx.has_room and not aged:\n"
            "            req = queue.pop(0)\n"
            "            if ctx.waits_for_batch_prefix(req):\n"
            "                continue\n"
            "            if self.fits(req, ctx):\n"
            "                ctx.admit(req)\n"
            "                self.passed_over.pop(req.uid, None)\n"
            "                for r in skipped:\n"
            "                    self.passed_over[r.uid] += 1\n"
            "                aged = any(self.passed_over[r.uid] >= self.AGING for r in skipped)\n"
            "            else:\n"
            "                self.passed_over.setdefault(req.uid, 0)\n"
            "                skipped.append(req)\n"
            "                aged = self.passed_over[req.uid] >= self.AGING\n",
        ),
    ),
    must_fail=(),
)

HIDDEN_MUTANTS = [
    Mutant(
        "need_in_tokens",
        STEM,
        (
            (
                "        ctx.match(req)\n        if ctx.pages_needed(req) <= ",
                "        hit = ctx.match(req)\n        if self.reserved_len(req) - hit <= ",
            ),
        ),
        must_fail=("random_workloads_at_page_sizes_2_and_4", "fits_counts_whole_pages"),
        why="the reservation counted in tokens, compared with pages: too cautious when a page holds several tokens",
    ),
    Mutant(
        "need_in_pages_rounded_down",
        STEM,
        (
            (
                "        ctx.match(req)\n        if ctx.pages_needed(req) <= ",
                "        hit = ctx.match(req)\n        if (self.reserved_len(req) - hit) // ctx.page_size <= ",
            ),
        ),
        must_fail=("random_workloads_at_page_sizes_2_and_4", "fits_counts_whole_pages"),
        why="a partial last page not counted: over-commit when a page holds several tokens",
    ),
]
