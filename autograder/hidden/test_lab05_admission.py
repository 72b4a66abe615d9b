"""Lab 05, hidden tests: the same contract on other workloads. Random workloads with pages of 2, 3 and 4
tokens (3: not a power of two), and a long stream of requests sharing a system prompt with several that
share nothing mixed in (each starts after at most AGING passes). Each calls the policy first, so a stub fails
at once with its message."""

from __future__ import annotations

from autograder import scheduler_sim as sim
from autograder.adapters import lab05 as lab
from autograder.points import points
from autograder.test_lab05_admission import AGING, SYSTEM, admission_order, ids, play, random_workload


@points(5, timeout=120)
def test_random_workloads_at_page_sizes_2_3_and_4():
    """Random workloads with pages of 2, 3 and 4 tokens: every rule holds at every call."""
    lab.make_policy().reserved_len(sim.request(sim.make_scheduler(), 0, [1, 2, 3], 4))  # a stub fails here
    for page_size in (2, 3, 4):
        for seed in range(10):
            play(random_workload(1000 + seed, page_size), f"page_size {page_size}, workload seed {seed}")


@points(5, timeout=60)
def test_long_stream_with_loners():
    """Forty requests sharing the cached system prompt arrive two per step on two rows, with five requests
    that share nothing among them: each of those five starts after at most AGING passes."""
    lab.make_policy().reserved_len(sim.request(sim.make_scheduler(), 0, [1, 2, 3], 4))  # a stub fails here
    reqs = [(0, SYSTEM + ids(200, 3, first=988), 2)]
    loners = []
    for i in range(40):
        reqs.append((i // 2, SYSTEM + ids(201 + i, 3, first=900 + i), 2))
        if i % 8 == 3:
            loners.append(len(reqs))
            reqs.append((i // 2, ids(300 + i, 5, first=950 + i), 3))
    w = sim.Workload(reqs, num_pages=120, page_size=2, max_running=2, budget=None)
    run = play(w, "a stream with requests that share nothing")
    order = admission_order(run)
    assert run.max_passes <= AGING, f"a request was passed {run.max_passes} times (admission order {order})"
    assert sorted(order) == list(range(len(reqs))), f"admission order {order}: not everyone started"
