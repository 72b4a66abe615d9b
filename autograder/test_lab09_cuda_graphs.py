"""Lab 09 (the CUDA-graph plan): each method against the engine's ``BucketPlan`` on fixed and random
inputs; padded batches through the model's decode forward on CPU (``autograder/graph_sim.py``): the KV
outside the scratch page and the real rows' logits must be the unpadded batch's; simulated graphs captured
by your plan (order, pool) and replayed through it (inputs copied into the captured buffers, the output
sliced); then a CPU engine whose graphs your plan captures and whose decode batches it replays.
Run: ``python -m autograder lab09``.

The GPU-marked tests, which capture real CUDA graphs with your plan, are ``autograder/test_gpu_lab09.py``
(``pytest autograder/test_gpu_lab09.py``; skipped without CUDA)."""

from __future__ import annotations

import math
import random
from functools import cache

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autograder import graph_sim as sim
from autograder.adapters import lab09 as lab
from autograder.checks import first_token_difference
from autograder.points import engine, points
from minisgl.engine.graph import BucketPlan, GraphInputs, GraphState

REFERENCE = BucketPlan()  # the engine's plan: the contract's answers
INF = math.inf
LOGIT_ATOL = 1e-4  # float32: a batch of bs rows rounds its matmuls a little differently from n rows


def linear_cost(per_graph: int, per_row: int):
    return lambda bs: per_graph + per_row * bs


# ---- candidates and sizes ---------------------------------------------------------------------------
@points(5)
def test_candidates():
    """The sizes worth a graph: 1, 2, 4, 8 below max_bs, multiples of 16 below max_bs, then max_bs."""
    plan = lab.make_plan()
    for max_bs in (1, 2, 3, 4, 5, 8, 9, 15, 16, 17, 31, 32, 33, 40, 64, 100, 256):
        got, want = plan.candidates(max_bs), REFERENCE.sizes(max_bs, INF, float)
        if got == want:
            continue
        if list(got) == want[:-1]:
            hint = f"max_bs = {max_bs} is missing: it must always be a candidate (the largest batch needs a graph)"
        elif list(got).count(max_bs) > 1:
            hint = f"max_bs = {max_bs} came twice (a multiple of 16): the multiples of STEP stop below max_bs"
        elif sorted(set(got)) == want:
            hint = "the right sizes, but in another order or repeated: ascending, each once"
        else:
            hint = "SMALL sizes below max_bs, then the multiples of STEP below max_bs, then max_bs"
        raise AssertionError(f"candidates({max_bs}) returned {got}, expected {want}: {hint}")


@points(4)
def test_sizes_without_budget():
    """With budget = inf every candidate is captured, ascending, ending with max_bs."""
    plan = lab.make_plan()
    for max_bs in (1, 3, 8, 16, 20, 48, 256):
        got, want = plan.sizes(max_bs, INF, linear_cost(1 << 20, 1 << 16)), REFERENCE.sizes(max_bs, INF, float)
        if got == want:
            continue
        if sorted(got) == want:
            hint = "sizes out of order: return them ascending (bucket() bisects them)"
        elif max_bs not in got:
            hint = f"max_bs = {max_bs} is missing: a batch of max_bs requests would find no graph"
        else:
            hint = "with no budget, every candidate is taken"
        raise AssertionError(f"sizes({max_bs}, budget=inf) returned {got}, expected {want}: {hint}")


SIZE_CASES = [
    # (max_bs, per graph, per row, budget, why)
    (40, 0, 1, 40 + 1 + 2 + 4 + 8, "the budget holds max_bs (40) and 1, 2, 4, 8 exactly; 16 and 32 do not fit"),
    (40, 0, 1, 40 + 1 + 2 + 4 + 8 - 1, "one byte short of taking 8 as well: 1, 2, 4 fit, 8 does not"),
    (40, 10, 1, 50, "only max_bs fits (10 + 40 bytes)"),
    (40, 10, 1, 49, "not even max_bs fits: no graphs, []"),
    (64, 100, 10, 100 + 640 + 110 + 120 + 140 + 180 + 260, "max_bs, then 1, 2, 4, 8, 16 while they fit"),
    (256, 1 << 20, 152_064, 1 << 30, "Qwen3-0.6B-like: bfloat16 logits per row, 1 MiB per graph, a 1 GiB budget"),
    (17, 5, 3, 5 * 5 + 3 * (17 + 1 + 2 + 4 + 8 + 16), "exactly everything: every candidate fits"),
]
# costs that do not grow with the batch (a kernel's workspace that jumps at some sizes): a candidate that does
# not fit is skipped, and a larger one after it may still fit
TABLE_CASES = [
    # (max_bs, {bs: cost}, budget, why)
    (
        40,
        {1: 10, 2: 10, 4: 10, 8: 10, 16: 60, 32: 12, 40: 40},
        92,
        "16 (60 bytes) does not fit beside 40, 1, 2, 4 and 8; 32 (12 bytes) still does, to exactly 92",
    ),
    (
        40,
        {1: 5, 2: 50, 4: 5, 8: 5, 16: 5, 32: 5, 40: 10},
        30,
        "2 (50 bytes) never fits; 4, 8 and 16 after it do, to exactly 30; 32 no longer does",
    ),
]


def table_cost(table: dict[int, int]):
    return lambda bs: table[bs]


def stop_at_first_misfit(max_bs: int, budget: float, cost) -> list[int]:
    """What a plan that stops at the first candidate over the budget would choose (the pitfall): the longest
    run of the smallest candidates that fits beside max_bs."""
    if cost(max_bs) > budget:
        return []
    rest = REFERENCE.sizes(max_bs, INF, cost)[:-1]
    k = 0
    while k < len(rest) and cost(max_bs) + sum(map(cost, rest[: k + 1])) <= budget:
        k += 1
    return rest[:k] + [max_bs]


@points(9)
def test_sizes_under_budget():
    """max_bs first ([] if it alone is over budget), then each candidate, smallest first, that still fits
    beside what was taken (one that does not is skipped, and a later one may fit); ascending."""
    plan = lab.make_plan()
    cases = [(m, linear_cost(g, r), b, f"cost(bs) = {g} + {r} * bs", why) for m, g, r, b, why in SIZE_CASES]
    cases += [(m, table_cost(t), b, f"costs {t}", why) for m, t, b, why in TABLE_CASES]
    for max_bs, cost, budget, costs, why in cases:
        got, want = plan.sizes(max_bs, budget, cost), REFERENCE.sizes(max_bs, budget, cost)
        if got == want:
            continue
        spent = sum(cost(bs) for bs in got) if isinstance(got, list) else None
        if spent is not None and spent > budget:
            hint = f"sizes over the budget: they cost {spent} bytes, the budget is {budget}"
        elif got == stop_at_first_misfit(max_bs, budget, cost):
            hint = (
                "stopped at the first candidate that does not fit: costs need not grow with the batch, so a "
                "larger candidate after it may still fit (skip the misfit and go on)"
            )
        elif got == [] and cost(max_bs) == budget:
            hint = f"max_bs alone costs exactly the budget ({budget}): it fits (no graphs only when cost > budget)"
        elif isinstance(got, list) and set(got) < set(want) and sum(map(cost, want)) == budget:
            hint = (
                f"the reference's sizes cost exactly the budget ({budget}): a total equal to the budget fits "
                "(take a candidate while the total stays <= budget, not < budget)"
            )
        elif want and max_bs not in got:
            hint = f"max_bs = {max_bs} is missing: it is taken first, whatever else fits"
        elif not want:
            hint = "max_bs alone is over the budget: return [] (no graphs)"
        elif _prefers_large(got, want, max_bs):
            hint = "large sizes were preferred: after max_bs, take the candidates from the smallest up"
        elif sorted(got) != got:
            hint = "sizes out of order: return them ascending"
        else:
            hint = "after max_bs, take the candidates from the smallest up while the total stays within budget"
        raise AssertionError(
            f"sizes(max_bs={max_bs}, budget={budget}, {costs}) returned {got}, expected {want} ({why}):\n{hint}"
        )


def _prefers_large(got, want: list[int], max_bs: int) -> bool:
    rest_got = [s for s in got if s != max_bs] if isinstance(got, list) else []
    rest_want = [s for s in want if s != max_bs]
    return bool(rest_got) and (not rest_want or max(rest_got) > max(rest_want))


def check_sizes(plan, max_bs: int, budget: int, cost, costs: str) -> None:
    got, want = plan.sizes(max_bs, budget, cost), REFERENCE.sizes(max_bs, budget, cost)
    where = f"sizes(max_bs={max_bs}, budget={budget}, {costs})"
    assert got == sorted(set(got)), f"{where} returned {got}: sizes must be ascending, each once"
    assert not got or got[-1] == max_bs, f"{where} returned {got}: max_bs = {max_bs} must be the last size"
    spent = sum(cost(bs) for bs in got)
    assert spent <= budget, f"{where} returned {got}: sizes over the budget ({spent} bytes > {budget})"
    if got != want and got == stop_at_first_misfit(max_bs, budget, cost):
        raise AssertionError(
            f"{where} returned {got}, expected {want}: stopped at the first candidate that does not fit (a larger "
            "one after it may still fit: costs need not grow with the batch)"
        )
    assert got == want, f"{where} returned {got}, expected {want} (max_bs first, then the smallest while they fit)"


@points(5)
def test_sizes_random():
    """Random max_bs, costs (growing with the batch, or a random cost per size) and budgets: ascending,
    max_bs last, within the budget, and the reference's choice."""
    check_sizes(lab.make_plan(), 40, 60, linear_cost(0, 1), "cost(bs) = bs")  # a stub fails here
    _sizes_random()
    _sizes_random_table()


@settings(max_examples=150)
@given(
    max_bs=st.integers(1, 300),
    per_graph=st.integers(0, 1000),
    per_row=st.integers(0, 100),
    share=st.floats(0.0, 1.2),
)
def _sizes_random(max_bs, per_graph, per_row, share):
    cost = linear_cost(per_graph, per_row)
    total = sum(cost(bs) for bs in REFERENCE.sizes(max_bs, INF, cost))
    check_sizes(lab.make_plan(), max_bs, int(total * share), cost, f"cost(bs) = {per_graph} + {per_row} * bs")


@settings(max_examples=100)
@given(max_bs=st.integers(1, 300), seed=st.integers(0, 10**6), share=st.floats(0.0, 1.2))
def _sizes_random_table(max_bs, seed, share):
    rng = random.Random(seed)
    table = {bs: rng.randrange(0, 100) for bs in REFERENCE.sizes(max_bs, INF, float)}
    budget = int(sum(table.values()) * share)
    check_sizes(lab.make_plan(), max_bs, budget, table_cost(table), f"costs {table}")


# ---- bucket -----------------------------------------------------------------------------------------
SIZE_LISTS = ([1, 2, 4, 8], [1, 2, 4, 8, 16, 32, 40], [3, 5, 6], [7], [1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 100])


def check_buckets(plan, sizes: list[int]) -> None:
    for n in range(1, sizes[-1] + 1):
        want = REFERENCE.bucket(n, sizes)
        try:
            got = plan.bucket(n, list(sizes))
        except (NotImplementedError, AssertionError):
            raise
        except Exception as e:
            got = f"{type(e).__name__}: {e}"
        if got == want:
            continue
        if isinstance(got, str) and got.startswith("ValueError") and n == sizes[-1]:
            hint = (
                f"n = {n} is the largest captured size: its own graph holds it. ValueError only when "
                "n > sizes[-1], not n >= sizes[-1]"
            )
        elif isinstance(got, int) and got < n:
            hint = f"bucket too small: a graph of {got} rows cannot run {n} requests (the last ones are dropped)"
        elif got == sizes[-1]:
            hint = f"that is the largest graph, not the smallest that fits: {got - n} rows of padding wasted"
        elif n in sizes and isinstance(got, int) and got > n:
            hint = f"{n} is itself a captured size, so it is its own bucket: bisect_left, not bisect_right"
        elif isinstance(got, int) and got not in sizes:
            hint = f"{got} is not a captured size: only sizes {sizes} have graphs"
        else:
            hint = "the smallest captured size >= n"
        raise AssertionError(f"bucket({n}, {sizes}) returned {got!r}, expected {want}: {hint}")


@points(7)
def test_bucket_every_batch_size():
    """Every batch size up to the largest graph maps to the smallest captured size not below it."""
    plan = lab.make_plan()
    for sizes in SIZE_LISTS:
        check_buckets(plan, sizes)


def check_refuses(plan, sizes: list[int]) -> None:
    """One request more than the largest graph (n = sizes[-1] + 1) raises ValueError."""
    n = sizes[-1] + 1
    try:
        got = plan.bucket(n, list(sizes))
    except ValueError:
        return
    except NotImplementedError:
        raise  # a stub: its hint says what to write
    except Exception as e:
        raise AssertionError(
            f"bucket({n}, {sizes}) raised {type(e).__name__}: {e}; expected ValueError: check n > sizes[-1] first "
            "(no graph holds the batch) instead of letting the lookup fail"
        ) from None
    raise AssertionError(
        f"bucket({n}, {sizes}) returned {got!r}; expected ValueError: {n} > sizes[-1] = {sizes[-1]}, so no graph "
        "holds the batch (a graph of fewer rows would drop its last requests)"
    )


@points(3)
def test_bucket_refuses_a_batch_past_the_largest():
    """One request more than the largest graph (n = sizes[-1] + 1) raises ValueError: no graph holds it (a
    bucket too small would drop its last row; an IndexError says nothing)."""
    plan = lab.make_plan()
    for sizes in SIZE_LISTS:
        check_refuses(plan, sizes)


@points(3)
def test_bucket_random():
    """Random ascending size lists: every n up to the largest maps to the smallest size >= n; one more raises
    ValueError."""
    check_buckets(lab.make_plan(), [2, 3, 9])  # a stub fails here
    _bucket_random()


@settings(max_examples=60)
@given(st.lists(st.integers(1, 200), min_size=1, max_size=12, unique=True))
def _bucket_random(sizes):
    check_buckets(lab.make_plan(), sorted(sizes))
    check_refuses(lab.make_plan(), sorted(sizes))


# ---- padding ----------------------------------------------------------------------------------------
SCRATCH, DUMMY = 1000, 40


def _ints(values, dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def check_static(static: GraphInputs, before: GraphInputs, addresses, batch: GraphInputs, bs: int, scratch, dummy):
    """The contract on the static buffers after pad(): in place, the batch's rows, padding rows on the
    scratch slot and the dummy row."""
    n = len(batch.input_ids)
    where = f"pad({n} rows -> {bs})"
    for name, buf, addr, old in zip(GraphInputs._fields, static, addresses, before):
        assert buf.data_ptr() == addr and buf.shape == old.shape, (
            f"{where}: static.{name} is another tensor now: a graph reads the addresses it was captured with, so "
            "write into the static buffers (copy_ / fill_ / slice assignment), never assign new tensors"
        )
    written = [name for name, buf, rows in zip(GraphInputs._fields, static, batch) if buf[:n].equal(rows[:n])]
    for name, buf, rows in zip(GraphInputs._fields, static, batch):
        got = buf[:n].tolist()
        if got != rows.tolist():
            hint = ""
            if got == before[GraphInputs._fields.index(name)][:n].tolist() and written:
                hint = (
                    f": static.{name} kept what an earlier batch left, while {', '.join(written)} got the batch's "
                    "rows: each of the four buffers (input_ids, positions, out_loc, table_idx) gets rows [0, n)"
                )
            elif got == before[GraphInputs._fields.index(name)][:n].tolist():
                hint = (
                    ": the static buffers were not written (a new tensor bound to a name is never seen by the graph, "
                    "which reads the buffers' addresses): copy_ into them"
                )
            elif n and got[:-1] == rows.tolist()[:-1]:
                hint = ": the last real row was overwritten (off by one in the pad range: padding starts at n)"
            want = rows.tolist()
            raise AssertionError(f"{where}: rows [0, {n}) of static.{name} are {got}, expected {want}{hint}")
    pad_out, pad_rows = static.out_loc[n:bs].tolist(), static.table_idx[n:bs].tolist()
    if pad_out != [scratch] * (bs - n):
        stale = before.out_loc[n:bs].tolist()
        if bs - n > 1 and pad_out[:-1] == [scratch] * (bs - n - 1):
            hint = f"the last padding row ({bs - 1}) was left out: off by one in the pad range, it is [n, bs)"
        elif bs - n > 1 and pad_out[1:] == [scratch] * (bs - n - 1):
            hint = f"the first padding row ({n}) was left out: off by one in the pad range, it is [n, bs)"
        elif pad_out == stale:
            hint = (
                "padding out_loc left at stale values (what an earlier, larger batch wrote there: real requests' "
                "slots, whose KV the padding rows would overwrite)"
            )
        elif all(s == 0 for s in pad_out):
            hint = "padding into slot 0 instead of the scratch slot: slot 0 belongs to a real request"
        else:
            hint = f"every padding row writes only the scratch page: out_loc = scratch_slot ({scratch})"
        raise AssertionError(f"{where}: out_loc of the padding rows [{n}, {bs}) is {pad_out}: {hint}")
    if pad_rows != [dummy] * (bs - n):
        raise AssertionError(
            f"{where}: table_idx of the padding rows [{n}, {bs}) is {pad_rows}: padding rows given a real table "
            f"row read (and, in a backend that writes through the table, overwrite) a real request's KV; they take "
            f"the dummy row ({dummy}), which maps every position to the scratch page"
        )


@points(8)
def test_pad_fills_rows():
    """pad() writes the static buffers in place: the batch's rows, then padding rows whose out_loc is the
    scratch slot and whose table row is the dummy row."""
    plan = lab.make_plan()
    rng = random.Random(9)
    for n, bs, prev in [(5, 8, 8), (3, 4, 8), (1, 8, 6), (4, 4, 8), (13, 16, 40), (1, 1, 1), (2, 7, 40)]:
        size = 40
        before = GraphInputs(
            _ints([rng.randrange(3, 900) for _ in range(size)], torch.int32),
            _ints([rng.randrange(0, 60) for _ in range(size)], torch.int64),
            # an earlier batch of `prev` requests left real slots in rows [0, prev); rows past it: scratch
            _ints([rng.randrange(1, 900) if i < prev else SCRATCH for i in range(size)], torch.int64),
            _ints([rng.randrange(0, DUMMY) if i < prev else DUMMY for i in range(size)], torch.int64),
        )
        static = GraphInputs(*(t.clone() for t in before))
        addresses = [t.data_ptr() for t in static]
        batch = GraphInputs(
            _ints([rng.randrange(3, 900) for _ in range(n)], torch.int32),
            _ints([rng.randrange(0, 60) for _ in range(n)], torch.int64),
            _ints(rng.sample(range(1, 900), n), torch.int64),
            _ints(rng.sample(range(DUMMY), n), torch.int64),
        )
        plan.pad(static, batch, bs, SCRATCH, DUMMY)
        check_static(static, before, addresses, batch, bs, SCRATCH, DUMMY)


@cache
def bench(page_size: int = 1) -> sim.Bench:
    from autograder.models import tiny_model

    torch.manual_seed(0)
    return sim.Bench(tiny_model("llama"), page_size=page_size)


def check_padding(plan, b: sim.Bench, n: int, bs: int, seed: int) -> None:
    """A decode batch of ``n`` real requests padded by ``plan`` into the graph of ``bs``, run through the
    decode forward: the static buffers follow the contract, every slot outside the scratch page holds what
    the unpadded batch leaves there, and the real rows' logits are the unpadded batch's."""
    batch, stale, owner = b.state(n, seed, stale_bs=max(bs, 40))
    start = b.pool.buffer.clone()
    want_logits = sim.decode_forward(b.engine, batch)
    want_kv = b.pool.buffer.clone()
    b.pool.buffer.copy_(start)
    static = GraphInputs(*(t.clone() for t in stale))
    addresses = [t.data_ptr() for t in static]
    plan.pad(static, batch, bs, b.scratch_slot, b.dummy_row)
    try:  # what is wrong in the buffers, if anything: it explains what the forward shows
        check_static(static, stale, addresses, batch, bs, b.scratch_slot, b.dummy_row)
        problem = None
    except AssertionError as e:
        problem = str(e)
    got_logits = sim.decode_forward(b.engine, GraphInputs(*(t[:bs] for t in static)))
    # per slot: the largest change against the unpadded run, over layers, K/V, heads and dims
    per_slot = (b.pool.buffer - want_kv).abs().flatten(2, 3).amax(dim=(0, 1, 3, 4))
    moved = [s for s in (per_slot > 1e-4).nonzero().flatten().tolist() if s not in b.scratch_slots]
    where = f"a decode batch of {n} padded into the graph of {bs} (seed {seed})"
    if moved:
        hit = sorted({owner[s] for s in moved if s in owner})
        raise AssertionError(
            f"{where}: after the forward, KV slots {moved[:8]} differ from the unpadded batch's"
            + (f" (they hold requests {hit}'s KV)" if hit else "")
            + ". Padded rows must write only the scratch page (out_loc = scratch_slot). "
            + (problem or "")
        )
    diff = (got_logits[:n] - want_logits).abs().max().item() if n else 0.0
    assert diff <= LOGIT_ATOL, (
        f"{where}: the real rows' logits differ from the unpadded batch's by up to {diff:.3g}: rows [0, n) must be "
        f"the batch's own inputs, in order. {problem or ''}"
    )
    assert problem is None, problem


PAD_CASES = [(3, 4), (5, 8), (1, 8), (8, 8), (13, 16), (17, 32), (1, 1), (33, 40)]


@points(10, timeout=120)
def test_padding_never_touches_real_kv():
    """Padded decode batches through the model (torch backend, float32): no real request's KV slot
    changes beyond what the unpadded batch writes, and the real rows' logits are the unpadded ones."""
    plan, b = lab.make_plan(), bench()
    for k, (n, bs) in enumerate(PAD_CASES):
        check_padding(plan, b, n, bs, seed=k)


@points(6, timeout=120)
def test_padding_random():
    """Random batch sizes, buckets and decode states (contexts, slots, what an earlier batch left in the
    static buffers): the contract on the buffers, the KV and the logits as in the fixed cases."""
    check_padding(lab.make_plan(), bench(), 2, 4, seed=100)  # a stub fails here
    _padding_random()


@settings(max_examples=25)
@given(n=st.integers(1, 40), extra=st.integers(0, 24), seed=st.integers(0, 10**6))
def _padding_random(n, extra, seed):
    check_padding(lab.make_plan(), bench(), n, min(40, n + extra), seed)


# ---- use_graph: which batches run in a graph --------------------------------------------------------
@points(5)
def test_use_graph():
    """Only a decode batch of at least one request that a captured size holds runs in a graph; a prefill or
    mixed batch, an empty batch, a batch past the largest graph and every batch when nothing was captured run
    eagerly (n from 0 to two past the largest size)."""
    plan = lab.make_plan()
    for sizes in ([1, 2, 4, 8], [3, 5, 6], [7], [1, 2, 4, 8, 16, 32, 40], []):
        top = sizes[-1] if sizes else 4
        for phase in ("decode", "prefill"):
            for n in range(0, top + 3):
                want = REFERENCE.use_graph(phase, n, list(sizes))
                try:
                    got = plan.use_graph(phase, n, list(sizes))
                except NotImplementedError:
                    raise
                except Exception as e:
                    raise AssertionError(
                        f"use_graph({phase!r}, {n}, {sizes}) raised {type(e).__name__}: {e}; expected {want}"
                        + (": with no graphs (sizes == []) every batch runs eagerly: False" if not sizes else "")
                    ) from None
                if bool(got) == want and isinstance(got, bool):
                    continue
                if phase == "prefill" and got:
                    hint = (
                        "a prefill or mixed batch sent to a graph: a graph replays one decode token per row; a "
                        "prefill (or a mixed batch, whose phase is 'prefill') runs eagerly"
                    )
                elif got and n == 0 and phase == "decode":
                    hint = (
                        "an empty batch (n = 0) sent to a graph: there is nothing to replay; a graph runs a batch of "
                        "at least one request"
                    )
                elif want and n == top:
                    hint = (
                        f"a batch of exactly sizes[-1] = {top} sent to eager mode: its own graph holds it "
                        "(n <= sizes[-1], not n < sizes[-1])"
                    )
                elif not sizes:
                    hint = "no graphs were captured (sizes == []): every batch runs eagerly"
                elif got and n > top:
                    hint = f"a batch of {n} is larger than every graph (the largest is {top}): it runs eagerly"
                elif not isinstance(got, bool):
                    hint = "return a bool"
                else:
                    hint = "a decode batch of at least one request, no larger than the largest size, runs in a graph"
                raise AssertionError(f"use_graph({phase!r}, {n}, {sizes}) returned {got!r}, expected {want}: {hint}")


# ---- capture: order and pool ------------------------------------------------------------------------
class _NoModel:
    """Enough of an engine for capturing simulated graphs (they are not replayed here)."""

    class model_config:  # noqa: N801
        vocab_size = 8


CAPTURE_CASES = ([1, 2, 4, 8], [7], [1, 2, 4, 8, 16, 32, 40], [3, 5, 6])


@points(7)
def test_capture():
    """Every size captured once into state.graphs / state.outputs, largest first, all in the first graph's
    pool: together they cost what the largest graph costs."""
    plan = lab.make_plan()
    for sizes in CAPTURE_CASES:
        state = GraphState(list(sizes), sim.static_buffers(sizes[-1], SCRATCH, DUMMY), SCRATCH, DUMMY)
        cost = linear_cost(1000, 100)
        cap = sim.SimCapture(_NoModel(), state, cost)
        plan.capture(state, cap)
        where = f"capture(sizes {sizes})"
        desc = sorted(sizes, reverse=True)
        assert sorted(cap.order) == sorted(sizes), (
            f"{where} captured the sizes {cap.order}: each of {sizes} exactly once"
        )
        assert sorted(state.graphs) == sorted(sizes) and sorted(state.outputs) == sorted(sizes), (
            f"{where}: state.graphs holds sizes {sorted(state.graphs)} and state.outputs {sorted(state.outputs)}; "
            f"both must hold every captured size {sizes} (state.graphs[bs], state.outputs[bs] = capture_one(...))"
        )
        for bs in sizes:
            graph = state.graphs[bs]
            assert getattr(graph, "bs", None) == bs and state.outputs[bs] is graph.output, (
                f"{where}: state.graphs[{bs}] / state.outputs[{bs}] are not what capture_one({bs}, ...) returned"
            )
        if len(cap.pools) > 1:
            raise AssertionError(
                f"{where} made {len(cap.pools)} memory pools: each graph in a pool of its own (pool=None at every "
                "capture). Pass None only for the first graph, then its .pool(): one memory pool for all graphs "
                f"(here they cost {cap.bytes} bytes, one pool captured largest first {cost(sizes[-1])})"
            )
        if cap.order != desc:
            raise AssertionError(
                f"{where} captured in the order {cap.order}, expected {desc}: graphs captured smallest first grow "
                "the pool whenever a graph is larger than what it holds (it cannot reuse the smaller ones' "
                "blocks); largest first, the smaller ones reuse the largest's (cost "
                f"{cap.bytes} bytes, largest first {cost(sizes[-1])})"
            )
        assert cap.bytes == cost(sizes[-1]), f"{where}: the graphs cost {cap.bytes} bytes, expected {cost(sizes[-1])}"


# ---- replay: the bookkeeping through simulated graphs -----------------------------------------------
REPLAY_SIZES = [1, 2, 4, 8, 16]
REPLAY_CASES = [(13, 16), (5, 8), (8, 8), (1, 1), (3, 4), (6, 8)]  # (n, its bucket): each after a larger one


def check_replays(plan, b: sim.Bench, cases, seed: int) -> None:
    """The engine's graphs of REPLAY_SIZES (captured by the reference's capture), replayed through
    ``plan.replay`` one batch after another: the logits are the unpadded batch's, ``[n, vocab]``, from the
    bucket's graph, and no real request's KV changes beyond what the unpadded batch writes."""
    state = GraphState(
        list(REPLAY_SIZES), sim.static_buffers(16, b.scratch_slot, b.dummy_row), b.scratch_slot, b.dummy_row
    )
    cap = sim.SimCapture(b.engine, state)
    REFERENCE.capture(state, cap)
    for k, (n, bs) in enumerate(cases):
        batch, stale, owner = b.state(n, seed + k, stale_bs=16)
        if k == 0:  # the buffers as an earlier batch of 16 left them
            for buf, old in zip(state.static, stale):
                buf.copy_(old[:16])
        start = b.pool.buffer.clone()
        want_logits = sim.decode_forward(b.engine, batch)
        want_kv = b.pool.buffer.clone()
        b.pool.buffer.copy_(start)
        captured = [t.data_ptr() for t in state.static]
        counts = {s: g.replays for s, g in state.graphs.items()}
        before = cases[k - 1][0] if k else 16
        where = f"replay of a decode batch of {n} (bucket {bs}, after a batch of {before})"
        try:
            got = plan.replay(state, batch, cap.prepare)
        except (NotImplementedError, ValueError):
            raise
        except AssertionError as e:
            raise AssertionError(f"{where}: {e}") from None
        ran = [s for s, g in state.graphs.items() if g.replays != counts[s]]
        assert ran == [bs], f"{where}: the graphs of sizes {ran} replayed; expected the bucket's alone ({bs})" + (
            "" if ran else ": call state.graphs[bs].replay()"
        )
        if [t.data_ptr() for t in state.static] != captured:
            raise AssertionError(
                f"{where}: state.static is bound to other tensors now; the graphs read the tensors they were "
                "captured with: pad into state.static's buffers in place"
            )
        assert isinstance(got, torch.Tensor) and got.dim() == 2, f"{where}: returned {type(got).__name__}, not logits"
        if got.shape[0] != n:
            raise AssertionError(
                f"{where}: returned {got.shape[0]} rows of logits, expected {n}: "
                + (
                    "the whole output returned (the padding rows' logits are no request's; the sampler would "
                    "sample them too): return the first n rows"
                    if got.shape[0] == bs
                    else "return rows [0, n) of the bucket's output"
                )
            )
        per_slot = (b.pool.buffer - want_kv).abs().flatten(2, 3).amax(dim=(0, 1, 3, 4))
        moved = [s for s in (per_slot > 1e-4).nonzero().flatten().tolist() if s not in b.scratch_slots]
        diff = (got - want_logits).abs().max().item()
        if moved or diff > LOGIT_ATOL:
            fresh = all(buf[:n].equal(rows[:n]) for buf, rows in zip(state.static, batch))
            raise AssertionError(
                f"{where}: "
                + (f"KV slots {moved[:8]} differ from the unpadded batch's; " if moved else "")
                + f"the real rows' logits differ from the unpadded batch's by up to {diff:.3g}. "
                + (
                    "The padding rows [n, bs) must write only the scratch page."
                    if fresh
                    else "The captured buffers do not hold the batch: copy the batch's inputs into state.static "
                    "(the graph reads only the buffers it was captured with) before the replay"
                )
            )
        if got.data_ptr() != state.outputs[bs].data_ptr():
            raise AssertionError(f"{where}: the logits are not rows [0, n) of state.outputs[{bs}] (the graph's output)")


@points(8, timeout=120)
def test_replay():
    """Batches replayed one after another through your replay and simulated graphs: the bucket's graph
    runs, on the batch's inputs copied into the captured buffers and padded, and the first n rows of its
    output come back; the KV outside the scratch page is the unpadded batch's."""
    check_replays(lab.make_plan(), bench(), REPLAY_CASES, seed=300)


# ---- the engine on your plan ------------------------------------------------------------------------
@points(10, timeout=180)
@engine
def test_engine_runs_your_plan(tiny_llama):
    """A CPU engine whose graphs your plan captures (simulated: graph_sim.SimGraphRunner) and whose every
    decode batch your use_graph sends to a graph and your replay runs generates the reference engine's
    tokens, in the reference's buckets; prefill batches stay eager."""
    from minisgl import LLM, SamplingParams

    plan = lab.make_plan()
    max_bs = 6
    sizes = plan.sizes(max_bs, INF, linear_cost(0, 1))  # a stub fails here
    want_sizes = REFERENCE.sizes(max_bs, INF, float)
    assert sizes == want_sizes, f"sizes({max_bs}, budget=inf) returned {sizes}, expected {want_sizes}"
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 4000) for _ in range(k)] for k in (9, 4, 13, 6, 7, 11)]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in (3, 12, 5, 9, 16, 7)]

    def play(p):
        llm = LLM(str(tiny_llama), device="cpu", dtype="float32", attention_backend="torch", num_pages=512)
        try:
            runner = None
            if p is not None:  # None: the reference engine, every batch eager and unpadded
                runner = llm.scheduler.engine.graph_runner = sim.SimGraphRunner(llm.scheduler.engine, p, sizes)
            outs = llm.generate(prompts, params, use_tqdm=False)
            return [o.token_ids for o in outs], runner
        finally:
            llm.shutdown()

    try:
        got, runner = play(plan)
    except (NotImplementedError, AssertionError) as e:
        raise type(e)(f"the engine failed with your plan: {e}") from e
    except Exception as e:
        raise AssertionError(f"the engine failed with your plan: {type(e).__name__}: {e}") from e
    want, _ = play(None)
    replays = runner.replays
    assert runner.eager_decodes == [], (
        f"decode batches of {sorted(set(runner.eager_decodes))} requests ran eagerly although graphs of {sizes} "
        "were captured: use_graph must send every decode batch of 1 <= n <= sizes[-1] to a graph"
    )
    wrong = [(n, bs) for n, bs in replays if bs != REFERENCE.bucket(n, sizes)]
    assert not wrong, f"decode batches of n requests ran in the graphs of (n, bucket) {wrong}; sizes {sizes}"
    assert any(bs > n for n, bs in replays), f"no decode batch was padded ({replays}): the test needs one"
    diff = first_token_difference(got, want)
    assert diff is None, (
        f"with your plan capturing and replaying every decode batch, the engine generated other tokens: {diff}"
    )
