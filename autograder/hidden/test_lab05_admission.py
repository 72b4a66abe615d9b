"""Lab 05, hidden tests: pages of more than one token. The reservation is counted in whole pages
(``ctx.pages_needed``): random workloads at page sizes 2 and 4, and a fixed case where counting in
tokens, or rounding pages down, gives the wrong answer. Each calls the policy first, so a stub fails
at once with its hint."""

from __future__ import annotations

from autograder import scheduler_sim as sim
from autograder.adapters import lab05 as lab
from autograder.points import points
from autograder.test_lab05_admission import check_workload, ids, random_workload, state


@points(5, timeout=90)
def test_random_workloads_at_page_sizes_2_and_4():
    """Random workloads with pages of 2 and 4 tokens: every rule holds and every decision is the reference's."""
    lab.make_policy().reserved_len(sim.request(sim.make_scheduler(), 0, [1, 2, 3], 4))  # a stub fails here
    for page_size in (2, 4):
        for seed in range(12):
            try:
                check_workload(random_workload(1000 + seed, page_size))
            except AssertionError as e:
                raise AssertionError(f"page_size {page_size}, workload seed {seed}: {e}") from None


@points(5)
def test_fits_counts_whole_pages():
    """With 4-token pages a request needs ceil(positions / 4) pages: not its tokens, nor pages rounded down."""
    # a running request holds 2 pages (8 prompt tokens) and reserves 2 more: 6 of the 10 pages are left
    build = lambda: state(10, running=[(ids(70, 8), 8)], page_size=4)  # noqa: E731
    for max_tokens, want in [(20, False), (10, True)]:
        sched = build()
        policy = lab.make_policy()
        ctx = sim.context(sched, policy)
        req = sim.request(sched, 5, ids(71, 6, first=905), max_tokens)
        ok = policy.fits(req, ctx)
        positions = policy.reserved_len(req)
        left = ctx.available_pages() - ctx.reserved_pages
        assert ok is want, (
            f"page_size 4: fits() returned {ok} for a request reserving {positions} positions "
            f"({-(-positions // 4)} pages; {positions // 4} rounded down) with {left} pages left; expected {want}. "
            "Count the reservation in whole pages, rounded up: ctx.pages_needed(req)"
        )
