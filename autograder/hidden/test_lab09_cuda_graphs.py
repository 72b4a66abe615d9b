"""Lab 09, hidden tests: costs that do not grow with the batch (a candidate that does not fit is skipped,
and a later one may still fit), a batch larger than every graph (``ValueError``), and padding with pages of
4 tokens (the scratch page holds 4 slots; padding writes the first). Each calls the plan first, so a stub
fails at once with its hint."""

from __future__ import annotations

import math

from autograder.adapters import lab09 as lab
from autograder.points import points
from autograder.test_lab09_cuda_graphs import REFERENCE, bench, check_padding

# bytes per graph of bs rows: a workspace that jumps at 16 rows and falls back at 32 (e.g. a kernel that
# splits the KV of small batches only), so a larger candidate can cost less than a smaller one
STEPPED = {1: 10, 2: 10, 4: 10, 8: 10, 16: 60, 32: 12, 40: 40, 48: 14, 64: 20}


@points(4)
def test_sizes_skip_what_does_not_fit():
    """A candidate over the budget is skipped, not the end of the list: later, cheaper ones still fit."""
    plan = lab.make_plan()
    cost = STEPPED.__getitem__
    for max_bs, budget in ((40, 40 + 40 + 12), (64, 20 + 40 + 12 + 14), (48, 14 + 30)):
        got, want = plan.sizes(max_bs, budget, cost), REFERENCE.sizes(max_bs, budget, cost)
        costs = {bs: STEPPED[bs] for bs in REFERENCE.sizes(max_bs, math.inf, cost)}
        assert got == want, (
            f"sizes(max_bs={max_bs}, budget={budget}) with costs {costs} returned {got}, expected {want}: a "
            "candidate that does not fit is skipped; the ones after it may still fit (do not stop at the first)"
        )


@points(3)
def test_bucket_refuses_a_batch_larger_than_every_graph():
    """bucket(n, sizes) raises ValueError when n > sizes[-1]: no graph holds the batch."""
    plan = lab.make_plan()
    for n, sizes in ((9, [1, 2, 4, 8]), (41, [1, 2, 4, 8, 16, 32, 40]), (2, [1])):
        try:
            got = plan.bucket(n, sizes)
        except ValueError:
            continue
        except NotImplementedError:
            raise  # a stub: its hint says what to write
        except Exception as e:
            raise AssertionError(
                f"bucket({n}, {sizes}) raised {type(e).__name__}: {e}; expected ValueError (n > sizes[-1])"
            ) from None
        raise AssertionError(f"bucket({n}, {sizes}) returned {got!r}; expected ValueError (no graph holds {n})")


@points(3, timeout=120)
def test_padding_with_pages_of_4():
    """With 4-token pages the scratch page is 4 slots: padding still writes only there, never a real slot."""
    plan, b = lab.make_plan(), bench(page_size=4)
    for k, (n, bs) in enumerate([(3, 4), (6, 8), (1, 16), (40, 40), (25, 32)]):
        check_padding(plan, b, n, bs, seed=200 + k)
