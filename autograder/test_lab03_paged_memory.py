"""Lab 03 (page allocator + request table): fixed cases, random operation sequences (hypothesis
state machines) against a model of each part, then the engine running on your memory manager.
Run: ``python -m autograder lab03``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from autograder.adapters import lab03 as lab
from autograder.checks import first_token_difference
from autograder.engine_runs import engine_failure
from autograder.points import engine, points
from minisgl.kvcache.table import TensorReqTable
from minisgl.models.config import ModelConfig


def pages_of(t) -> list[int]:
    return t.tolist() if isinstance(t, torch.Tensor) else list(t)


def i64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def expect_runtime_error(call, message: str) -> None:
    """``call()`` must raise RuntimeError (a stub's NotImplementedError, a subclass, does not count)."""
    try:
        call()
    except NotImplementedError:
        raise
    except RuntimeError:
        return
    except Exception as e:
        raise AssertionError(f"{message}; it raised {type(e).__name__}: {e}") from None
    raise AssertionError(message)


# ---- the allocator: helpers --------------------------------------------------------------------------
def expect_alloc(alloc, n: int, free: set[int], what: str) -> list[int]:
    """``alloc.alloc(n)`` must return n distinct pages out of ``free`` (int64); returns them."""
    try:
        got = alloc.alloc(n)
    except MemoryError as e:  # n <= num_free here: the boundary n == num_free must succeed
        raise AssertionError(
            f"{what}: alloc({n}) with {len(free)} pages free raised MemoryError ({e}): only asking for more than "
            f"num_free raises (n > num_free, not n >= num_free); alloc(num_free) hands out every free page"
        ) from None
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int64, (
        f"{what}: alloc({n}) must return an int64 tensor of page ids, got {type(got).__name__} "
        f"{getattr(got, 'dtype', '')}" + (" (torch.tensor([]) is float32: give dtype=torch.int64)" if n == 0 else "")
    )
    pages = pages_of(got)
    assert len(pages) == n, f"{what}: alloc({n}) returned {len(pages)} pages: {pages}"
    twice = sorted({p for p in pages if pages.count(p) > 1})
    assert not twice, (
        f"{what}: alloc({n}) returned {pages}, with pages {twice} handed out twice in one call: take each page "
        "off the free list as you hand it out"
    )
    busy = [p for p in pages if p not in free]
    assert not busy, (
        f"{what}: alloc({n}) returned {pages}, but pages {busy} were not free (free were {sorted(free)}): a page "
        "was handed out twice (alloc must take its pages off the free list, and free must refuse a double free)"
    )
    return pages


def expect_num_free(alloc, want: int, after: str, hint: str = "") -> None:
    got = alloc.num_free
    assert got == want, f"after {after}: num_free is {got}, expected {want}" + (f"; {hint}" if hint else "")


def expect_refused(alloc, pages: list[int], why: str, free_before: int) -> None:
    """``free(pages)`` must raise RuntimeError and change nothing."""
    try:
        alloc.free(i64(pages))
    except NotImplementedError:
        raise  # a subclass of RuntimeError: a stub must not pass for a refusal
    except RuntimeError:
        pass
    except Exception as e:
        raise AssertionError(f"free({pages}) ({why}) raised {type(e).__name__}: {e}; expected RuntimeError") from None
    else:
        raise AssertionError(f"free({pages}) ({why}) did not raise: it must raise RuntimeError and change nothing")
    expect_num_free(
        alloc,
        free_before,
        f"a refused free({pages}) ({why})",
        "a refused free changed the allocator before raising: check every page first, then change anything",
    )


# ---- the allocator: fixed cases ----------------------------------------------------------------------
@points(2)
def test_allocator_starts_free():
    """A new allocator has every page free; alloc hands out distinct free pages as int64 (alloc(0): an
    empty int64 tensor)."""
    a = lab.make_allocator(8)
    expect_num_free(a, 8, "creating an allocator of 8 pages", "every page starts free")
    expect_alloc(a, 0, set(range(8)), "a new allocator of 8 pages")  # an empty int64 tensor
    expect_num_free(a, 8, "alloc(0) on 8 free pages", "alloc(0) hands out nothing")
    expect_alloc(a, 3, set(range(8)), "a new allocator of 8 pages")
    expect_num_free(a, 5, "alloc(3) on 8 free pages")


@points(5)
def test_alloc_hands_out_every_page_once():
    """Allocating the whole pool in pieces hands out every page exactly once."""
    a = lab.make_allocator(10)
    free, got = set(range(10)), []
    for n in (3, 1, 4, 2):
        pages = expect_alloc(a, n, free, f"allocating 10 pages as 3 + 1 + 4 + 2 (after {len(got)})")
        free -= set(pages)
        got += pages
    assert sorted(got) == list(range(10)), f"the pool of 10 pages was handed out as {got}"
    expect_num_free(a, 0, "allocating all 10 pages")


@points(5)
def test_out_of_memory_changes_nothing():
    """Asking for more than num_free (here num_free + 1) raises MemoryError, and the free pages stay free;
    asking for exactly num_free hands them all out."""
    a = lab.make_allocator(6)
    first = expect_alloc(a, 4, set(range(6)), "alloc(4) of 6 pages")
    with pytest.raises(MemoryError):
        a.alloc(3)
        pytest.fail("alloc(3) with 2 pages free must raise MemoryError")
    expect_num_free(
        a,
        2,
        "a refused alloc(3) with 2 free",
        "alloc changed the allocator before raising: check n against num_free before taking any page",
    )
    expect_alloc(a, 2, set(range(6)) - set(first), "alloc(2) (exactly num_free) after a refused alloc(3)")
    with pytest.raises(MemoryError):
        a.alloc(1)
        pytest.fail("alloc(1) with no page free must raise MemoryError")


@points(5)
def test_freed_pages_come_back():
    """free makes pages free again: num_free grows and alloc hands them out again."""
    a = lab.make_allocator(6)
    pages = expect_alloc(a, 6, set(range(6)), "alloc(6) of 6 pages")
    a.free(i64([pages[1], pages[4]]))
    expect_num_free(
        a, 2, f"freeing 2 of 6 handed-out pages ({[pages[1], pages[4]]})", "the freed pages never came back"
    )
    expect_alloc(a, 2, {pages[1], pages[4]}, "alloc(2) right after freeing 2 pages")
    a.free(i64(pages))
    expect_num_free(a, 6, "freeing every page", "the freed pages never came back")
    a.free(i64([]))
    expect_num_free(a, 6, "free() of an empty tensor (a no-op)")


@points(5)
def test_double_free_raises():
    """Freeing a free page (twice, or one never handed out), or one page twice in a call, raises."""
    a = lab.make_allocator(6)
    pages = expect_alloc(a, 3, set(range(6)), "alloc(3) of 6 pages")
    a.free(i64(pages[:1]))
    expect_num_free(a, 4, "alloc(3) then free(1 page)")
    expect_refused(a, pages[:1], "that page was freed already: a double free must raise RuntimeError", 4)
    never = sorted(set(range(6)) - set(pages))[0]
    expect_refused(a, [never], "a page that was never handed out: a double free must raise RuntimeError", 4)
    expect_refused(a, [pages[1], pages[1]], "the same page appears twice in one call", 4)
    a.free(i64(pages[1:]))
    expect_num_free(a, 6, "freeing the other two pages")


@points(4)
def test_bad_free_changes_nothing():
    """A free with one bad page among good ones raises and frees none of them; so does a page
    outside the pool."""
    a = lab.make_allocator(6)
    pages = expect_alloc(a, 6, set(range(6)), "alloc(6) of 6 pages")
    a.free(i64(pages[:1]))
    last = "the last page of the call: check every page, not only the first"
    expect_refused(a, [pages[2], pages[3], pages[0]], f"page {pages[0]} is free already, {last}", 1)
    expect_refused(a, [pages[2], 6], f"page 6 is outside the pool [0, 6), {last}", 1)
    expect_refused(
        a, [-1], "page -1 is outside the pool; a negative id silently indexes from the end of a Python list", 1
    )
    expect_alloc(a, 1, {pages[0]}, "alloc(1) after the refused frees (only the freed page is free)")
    with pytest.raises(MemoryError):
        a.alloc(1)
        pytest.fail("every page is handed out again, so alloc(1) must raise MemoryError")


# ---- the allocator: random operation sequences ------------------------------------------------------
NUM_PAGES = 10


class AllocatorMachine(RuleBasedStateMachine):
    """Random alloc / free / refused operations against a model: the set of free pages."""

    def __init__(self):
        super().__init__()
        self.alloc = lab.make_allocator(NUM_PAGES, 4)
        self.free, self.held, self.log = set(range(NUM_PAGES)), [], []

    def where(self) -> str:
        return "\noperations so far, oldest first:\n" + "\n".join(f"  {line}" for line in self.log[-12:])

    def refused(self, pages: list[int], why: str) -> None:
        self.log.append(f"free({pages}) -> RuntimeError ({why})")
        try:
            expect_refused(self.alloc, pages, why, len(self.free))
        except AssertionError as e:
            raise AssertionError(f"{e}{self.where()}") from None

    @rule(n=st.integers(0, NUM_PAGES + 2))
    def alloc_pages(self, n):
        if n > len(self.free):
            self.log.append(f"alloc({n}) with {len(self.free)} free -> MemoryError")
            with pytest.raises(MemoryError):
                self.alloc.alloc(n)
                pytest.fail(f"alloc({n}) with {len(self.free)} pages free must raise MemoryError{self.where()}")
            if self.alloc.num_free != len(self.free):
                raise AssertionError(
                    f"after a refused alloc({n}): num_free is {self.alloc.num_free}, expected {len(self.free)}: alloc "
                    f"changed the allocator before raising{self.where()}"
                )
            return
        self.log.append(f"alloc({n})")
        try:
            pages = expect_alloc(self.alloc, n, self.free, "random operations")
        except AssertionError as e:
            raise AssertionError(f"{e}{self.where()}") from None
        self.log[-1] += f" -> {pages}"
        self.free -= set(pages)
        self.held += pages

    @rule(data=st.data())
    def free_some(self, data):
        pages = data.draw(st.lists(st.sampled_from(self.held), unique=True) if self.held else st.just([]))
        self.log.append(f"free({pages})")
        self.alloc.free(i64(pages))
        self.free |= set(pages)
        self.held = [p for p in self.held if p not in pages]

    @precondition(lambda self: self.free)
    @rule(data=st.data())
    def double_free(self, data):
        page = data.draw(st.sampled_from(sorted(self.free)))
        others = data.draw(st.lists(st.sampled_from(self.held), unique=True, max_size=3) if self.held else st.just([]))
        self.refused(others + [page], f"page {page} is free already")

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def same_page_twice(self, data):
        page = data.draw(st.sampled_from(self.held))
        self.refused([page, page], f"page {page} appears twice in one call")

    @rule(page=st.sampled_from([-2, -1, NUM_PAGES, NUM_PAGES + 1]), data=st.data())
    def outside_the_pool(self, page, data):
        others = data.draw(st.lists(st.sampled_from(self.held), unique=True, max_size=3) if self.held else st.just([]))
        self.refused(others + [page], f"page {page} is outside the pool [0, {NUM_PAGES})")

    @invariant()
    def num_free_agrees(self):
        got = self.alloc.num_free
        if got != len(self.free):
            raise AssertionError(
                f"num_free is {got}, expected {len(self.free)} (pages {sorted(self.free)} are free){self.where()}"
            )


@points(9, timeout=60)
def test_allocator_random_operations():
    """Random alloc / free sequences (alloc(0) and alloc(num_free) among them), with refused ones (out of
    memory, double frees, pages outside the pool), agree with a model of the free pages after every operation."""
    lab.make_allocator(4).alloc(1)  # a stub fails here, at once
    run_state_machine_as_test(AllocatorMachine, settings=settings(max_examples=150, stateful_step_count=30))


# ---- the request table: helpers ------------------------------------------------------------------------
def both(max_rows: int, max_seq_len: int, page_size: int):
    """Your table and the engine's, built alike."""
    return lab.make_table(max_rows, max_seq_len, page_size), TensorReqTable(
        max_rows, max_seq_len, page_size, torch.device("cpu")
    )


def wrong_maps(rows, starts, ends, pages, p) -> dict[str, list[list[int]]]:
    """What each known mistake in map_pages writes, per request (for the messages)."""
    out: dict[str, list[list[int]]] = {name: [] for name in PITFALLS}
    k = 0
    for s, e in zip(starts, ends):
        page = lambda pos, first=k, s=s: pages[first + (pos - s) // p]  # noqa: E731
        out["slot = page"].append([page(pos) for pos in range(s, e)])
        out["offset counted from the request's start"].append([page(pos) * p + pos - s for pos in range(s, e)])
        out["every request starting at pages[0]"].append([pages[(pos - s) // p] * p + pos % p for pos in range(s, e)])
        out["a bit mask"].append([page(pos) * p + (pos & (p - 1)) for pos in range(s, e)])
        k += (e - s) // p
    first, k = {}, 0  # the share of pages each request gets when the rows are served in ascending order
    for i in sorted(range(len(rows)), key=lambda i: rows[i]):
        first[i], k = k, k + (ends[i] - starts[i]) // p
    for i, (s, e) in enumerate(zip(starts, ends)):
        out["rows sorted"].append([pages[first[i] + (pos - s) // p] * p + pos % p for pos in range(s, e)])
    return out


PITFALLS = {
    "slot = page": "map_pages ignores page_size: slot = page * page_size + pos % page_size, not the page id",
    "offset counted from the request's start": "the offset in a page must restart at 0 on every page "
    "(pos % page_size): counting on from the first page assumes the pages are consecutive",
    "every request starting at pages[0]": "pages are taken in order, request after request: request i starts "
    "where request i - 1's pages end",
    "rows sorted": "the requests take their pages in the order they come in rows (rows[0] first, whatever its "
    "number), not sorted by row number",
    "a bit mask": "the offset in a page is pos % page_size: pos & (page_size - 1) is that only for powers of two",
}


def expect_slots(table, row: int, start: int, want: list[int], what: str, wrong: dict | None = None) -> None:
    got = table.slots(row, start, start + len(want))
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int64, (
        f"{what}: slots({row}, {start}, {start + len(want)}) must return an int64 tensor (the table stores int32: "
        f"convert), got {type(got).__name__} {getattr(got, 'dtype', '')}"
    )
    got_list = got.tolist()
    if got_list == want:
        return
    named = [PITFALLS[name] for name, slots in (wrong or {}).items() if slots == got_list and slots != want]
    if not named and len(want) > 1 and (got_list[1:] == want[:-1] or got_list[:-1] == want[1:]):
        named = ["a write lands one position off (positions start, ..., start + len(slots) - 1 change)"]
    raise AssertionError(
        f"{what}: slots({row}, {start}, {start + len(want)}) is {got_list}, expected {want}"
        + (f"\nthis is what happens when {named[0]}" if named else "")
    )


def map_and_check(tables, rows, starts, ends, pages, what: str) -> None:
    """map_pages on both tables, then each request's new positions compared."""
    mine, ref = tables
    for t in (mine, ref):
        t.map_pages(i64(rows), i64(starts), i64(ends), i64(pages))
    wrong = wrong_maps(rows, starts, ends, pages, ref.page_size)
    for i, (row, s, e) in enumerate(zip(rows, starts, ends)):
        want = ref.slots(row, s, e).tolist()
        call = f"{what}: map_pages(rows={rows}, starts={starts}, ends={ends}, pages={pages}), page_size {ref.page_size}"
        expect_slots(mine, row, s, want, call, {name: w[i] for name, w in wrong.items()})


# ---- the request table: fixed cases ----------------------------------------------------------------
@points(5)
def test_rows():
    """Rows [0, max_rows) are handed out once each, never the dummy row; free_row checks its row (in use,
    and in [0, max_rows): -1 and the dummy row are refused)."""
    t = lab.make_table(4, 32)
    assert t.dummy_row == 4, f"dummy_row is {t.dummy_row}, expected max_rows = 4"
    assert t.num_free_rows == 4, (
        f"a new table of 4 rows has {t.num_free_rows} free rows, expected 4 (the dummy row is never handed out)"
    )
    rows = [t.alloc_row() for _ in range(4)]
    assert sorted(rows) == [0, 1, 2, 3], f"four alloc_row() calls returned {rows}, expected rows 0..3 once each"
    assert t.num_free_rows == 0, f"after handing out every row, num_free_rows is {t.num_free_rows}"
    for row, what in [(-1, "a negative row"), (4, "the dummy row"), (5, "past the dummy row")]:
        expect_runtime_error(
            lambda row=row: t.free_row(row),
            f"free_row({row}) ({what}) with rows 0..3 in use must raise RuntimeError: only a request row in use may "
            "be freed; check 0 <= row < max_rows before looking the row up (a negative row silently indexes from "
            "the end of a Python list: -1 would free row 3)",
        )
        assert t.num_free_rows == 0, f"a refused free_row({row}) changed num_free_rows to {t.num_free_rows}"
    t.free_row(rows[1])
    assert t.num_free_rows == 1 and t.alloc_row() == rows[1], "after free_row(r), alloc_row() must hand r out again"
    t.free_row(rows[2])
    expect_runtime_error(
        lambda: t.free_row(rows[2]),
        f"free_row({rows[2]}) twice must raise RuntimeError: a row freed twice is handed out twice",
    )
    assert t.num_free_rows == 1, f"a refused free_row changed num_free_rows to {t.num_free_rows}"
    fresh = lab.make_table(4, 32)
    expect_runtime_error(lambda: fresh.free_row(2), "free_row(2) of a row never handed out must raise RuntimeError")


@points(5)
def test_map_pages_page_size_1():
    """With one-token pages, position i of a request is its i-th page, request after request."""
    tables = both(4, 16, 1)
    mine, ref = tables
    rows = [mine.alloc_row(), mine.alloc_row()]  # the engine's table is written at the same rows
    map_and_check(tables, rows, [0, 0], [3, 2], [7, 2, 9, 4, 5], "two prompts")
    map_and_check(tables, [rows[1], rows[0]], [2, 3], [3, 3], [11], "a decode step (one request needs no page)")
    expect_slots(mine, rows[0], 0, [7, 2, 9], "the first request after the decode step")
    expect_slots(mine, rows[1], 0, [4, 5, 11], "the second request after the decode step")


@points(6)
def test_map_pages_page_size_4():
    """With 4-token pages, a request's positions fill its pages in order, at page * 4 + offset,
    whatever pages it gets; later growth starts at a page boundary; the requests take their pages in
    the order rows lists them."""
    tables = both(4, 32, 4)
    mine, ref = tables
    rows = [mine.alloc_row(), mine.alloc_row()]  # the engine's table is written at the same rows
    map_and_check(tables, rows, [0, 0], [8, 4], [5, 2, 7], "two prompts, pages 5, 2 and 7")
    expect_slots(mine, rows[0], 0, [20, 21, 22, 23, 8, 9, 10, 11], "the first request (pages 5 and 2)")
    map_and_check(
        tables, rows[::-1], [4, 8], [12, 12], [6, 3, 1], "both grow, the second request listed first (pages 6, 3; 1)"
    )
    got = mine.slots_at(i64([rows[1], rows[0], rows[1]]), i64([0, 9, 11]))
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int64, (
        f"slots_at must return an int64 tensor, got {type(got).__name__} {getattr(got, 'dtype', '')}"
    )
    assert got.tolist() == [28, 5, 15], (
        f"slots_at(rows=[{rows[1]}, {rows[0]}, {rows[1]}], positions=[0, 9, 11]) is {got.tolist()}, expected "
        "[28, 5, 15]: the slot of (rows[i], positions[i]) for every i"
    )


@points(3)
def test_map_pages_page_size_3():
    """With 3-token pages (not a power of two), position pos sits at page * 3 + pos % 3."""
    tables = both(4, 30, 3)
    mine, ref = tables
    rows = [mine.alloc_row(), mine.alloc_row(), mine.alloc_row()]
    map_and_check(tables, rows, [0, 0, 0], [9, 3, 6], [4, 9, 1, 7, 2, 5], "three prompts, pages 4, 9, 1; 7; 2, 5")
    expect_slots(mine, rows[0], 0, [12, 13, 14, 27, 28, 29, 3, 4, 5], "the first request (pages 4, 9, 1)")
    map_and_check(tables, rows, [9, 3, 6], [12, 9, 6], [8, 0, 6], "all grow (page 8; 0 and 6; none)")


@points(5)
def test_set_slots():
    """set_slots points exactly positions [start, start + len(slots)) at the given slots."""
    tables = both(2, 16, 4)
    mine, ref = tables
    row = mine.alloc_row()
    for t in tables:
        t.set_slots(row, 0, i64([40, 41, 42, 43, 16, 17, 18, 19]))  # a cached prefix of two pages
    expect_slots(mine, row, 0, [40, 41, 42, 43, 16, 17, 18, 19], "set_slots(row, 0, 8 slots)")
    map_and_check(tables, [row], [8], [12], [2], "after a cached prefix of 8 tokens")
    for t in tables:
        t.set_slots(row, 2, i64([90, 91, 92]))
    expect_slots(
        mine,
        row,
        0,
        ref.slots(row, 0, 12).tolist(),
        "set_slots(row, 2, [90, 91, 92]) over it (positions 2, 3, 4 change, nothing else): a write one position off?",
    )


@points(4)
def test_dummy_row():
    """The dummy row (max_rows) maps every position to the slot point_dummy_row_at gives, and no
    other row changes."""
    t = lab.make_table(3, 10, 4)
    assert tuple(t.page_table.shape) == (4, 12) and t.page_table.dtype == torch.int32, (
        f"page_table is {list(t.page_table.shape)} {t.page_table.dtype}, expected [4, 12] int32 (rows 0..2 and the "
        "dummy row 3; 10 positions rounded up to whole pages of 4)"
    )
    rows = [t.alloc_row() for _ in range(3)]
    t.map_pages(i64(rows), i64([0, 0, 0]), i64([12, 12, 12]), i64(list(range(9))))
    before = t.page_table[:3].clone()
    t.point_dummy_row_at(99)
    assert t.page_table[t.dummy_row].tolist() == [99] * 12, (
        f"after point_dummy_row_at(99) the dummy row is {t.page_table[t.dummy_row].tolist()}: every position of the "
        "dummy row must map to 99 (the pool's scratch page)"
    )
    assert torch.equal(t.page_table[:3], before), (
        "point_dummy_row_at changed a request's row: it touches no other row than dummy_row"
    )
    assert t.slots(t.dummy_row, 0, 12).tolist() == [99] * 12, "slots() of the dummy row must read 99 everywhere"


# ---- the request table: random operation sequences -------------------------------------------------
MAX_ROWS, WIDTH = 4, 16


class TableMachine(RuleBasedStateMachine):
    """Random row, map_pages, set_slots and dummy-row operations against a model: row -> the slots of
    its positions."""

    def __init__(self):
        super().__init__()
        self.table, self.p = None, 1
        self.rows: dict[int, list[int]] = {}  # row in use -> slots of positions [0, len)
        self.dummy, self.log = None, []

    def where(self) -> str:
        return f"\noperations (page_size {self.p}), oldest first:\n" + "\n".join(f"  {x}" for x in self.log[-12:])

    @initialize(p=st.sampled_from([1, 2, 3, 4]))
    def create(self, p):
        self.p, self.table = p, lab.make_table(MAX_ROWS, WIDTH, p)
        self.log.append(f"RequestTable(max_rows={MAX_ROWS}, max_seq_len={WIDTH}, page_size={p})")

    @precondition(lambda self: self.table is not None and len(self.rows) < MAX_ROWS)
    @rule()
    def alloc_row(self):
        row = self.table.alloc_row()
        self.log.append(f"alloc_row() -> {row}")
        if not (isinstance(row, int) and 0 <= row < MAX_ROWS) or row in self.rows:
            raise AssertionError(
                f"alloc_row() returned {row!r}; rows in use are {sorted(self.rows)}: it must hand out a free row of "
                f"[0, {MAX_ROWS}) (never the dummy row {MAX_ROWS}){self.where()}"
            )
        self.rows[row] = []

    @precondition(lambda self: self.rows)
    @rule(data=st.data())
    def free_row(self, data):
        row = data.draw(st.sampled_from(sorted(self.rows)))
        self.log.append(f"free_row({row})")
        self.table.free_row(row)
        del self.rows[row]

    @precondition(lambda self: self.table is not None and len(self.rows) < MAX_ROWS)
    @rule(data=st.data())
    def free_a_free_row(self, data):
        row = data.draw(st.sampled_from(sorted(set(range(MAX_ROWS)) - set(self.rows))))
        self.log.append(f"free_row({row}) of a free row -> RuntimeError")
        expect_runtime_error(
            lambda: self.table.free_row(row),
            f"free_row({row}) of a row not in use must raise RuntimeError{self.where()}",
        )

    @precondition(lambda self: self.table is not None)
    @rule(row=st.sampled_from([-1, -2, MAX_ROWS, MAX_ROWS + 1]))
    def free_a_row_that_is_not_a_request_row(self, row):
        self.log.append(f"free_row({row}) -> RuntimeError")
        expect_runtime_error(
            lambda: self.table.free_row(row),
            f"free_row({row}) must raise RuntimeError: only rows 0 .. {MAX_ROWS - 1} in use may be freed (a negative "
            f"row silently indexes from the end of a Python list; {MAX_ROWS} is the dummy row){self.where()}",
        )

    @precondition(lambda self: self.rows)
    @rule(data=st.data())
    def map_pages(self, data):
        p = self.p
        rows = data.draw(st.lists(st.sampled_from(sorted(self.rows)), min_size=1, unique=True))
        if data.draw(st.booleans()):  # rows listed high to low half the time: pages go in the order rows lists them
            rows.sort(reverse=True)
        starts, ends = [], []
        for row in rows:
            have = -(-len(self.rows[row]) // p) * p
            starts.append(have)
            ends.append(have + p * data.draw(st.integers(0, max(0, (WIDTH - have) // p))))  # have may pass WIDTH
        n = sum(e - s for s, e in zip(starts, ends)) // p
        pages = data.draw(st.lists(st.integers(0, 40), min_size=n, max_size=n, unique=True))
        self.log.append(f"map_pages(rows={rows}, starts={starts}, ends={ends}, pages={pages})")
        self.table.map_pages(i64(rows), i64(starts), i64(ends), i64(pages))
        k = 0
        for row, s, e in zip(rows, starts, ends):
            slots = self.rows[row]
            slots += [-1] * (s - len(slots))  # a partial page left by set_slots: never read
            slots[s:] = [pages[k + (pos - s) // p] * p + pos % p for pos in range(s, e)]
            k += (e - s) // p

    @precondition(lambda self: self.rows)
    @rule(data=st.data())
    def set_slots(self, data):
        row = data.draw(st.sampled_from(sorted(self.rows)))
        slots = self.rows[row]
        start = data.draw(st.integers(0, len(slots)))
        new = data.draw(st.lists(st.integers(0, 200), max_size=WIDTH - start))
        self.log.append(f"set_slots({row}, {start}, {new})")
        self.table.set_slots(row, start, i64(new))
        slots[start : start + len(new)] = new

    @precondition(lambda self: self.table is not None)
    @rule(slot=st.integers(0, 200))
    def point_dummy_row_at(self, slot):
        self.log.append(f"point_dummy_row_at({slot})")
        self.table.point_dummy_row_at(slot)
        self.dummy = slot

    @invariant()
    def table_agrees(self):
        if self.table is None:
            return
        if self.table.num_free_rows != MAX_ROWS - len(self.rows):
            raise AssertionError(
                f"num_free_rows is {self.table.num_free_rows}, expected {MAX_ROWS - len(self.rows)}{self.where()}"
            )
        cells = [(row, pos) for row, slots in self.rows.items() for pos, s in enumerate(slots) if s >= 0]
        for row, slots in self.rows.items():
            try:
                expect_slots(self.table, row, 0, slots, "random operations") if -1 not in slots else None
            except AssertionError as e:
                raise AssertionError(f"{e}{self.where()}") from None
        if cells:
            got = self.table.slots_at(i64([r for r, _ in cells]), i64([c for _, c in cells]))
            want = [self.rows[r][c] for r, c in cells]
            if not (isinstance(got, torch.Tensor) and got.dtype == torch.int64 and got.tolist() == want):
                raise AssertionError(
                    f"slots_at of every written position gave {getattr(got, 'tolist', lambda: got)()}, expected "
                    f"{want} as int64{self.where()}"
                )
        width = -(-WIDTH // self.p) * self.p  # whole pages
        if self.dummy is not None and self.table.page_table[MAX_ROWS].tolist() != [self.dummy] * width:
            raise AssertionError(
                f"the dummy row is {self.table.page_table[MAX_ROWS].tolist()}, expected {self.dummy} everywhere (and "
                f"no other operation may write it){self.where()}"
            )


@points(9, timeout=60)
def test_table_random_operations():
    """Random alloc_row / free_row (and refused ones) / map_pages / set_slots / point_dummy_row_at
    sequences at page sizes 1, 2, 3 and 4 agree with a model of the table after every operation."""
    lab.make_table(2, 8).alloc_row()  # a stub fails here, at once
    run_state_machine_as_test(TableMachine, settings=settings(max_examples=150, stateful_step_count=25))


# ---- the engine on your allocator and table ------------------------------------------------------------
def _prompts(model, seed: int = 0) -> list[list[list[int]]]:
    """Rounds of prompts: more requests than rows, shared prefixes (cache hits: set_slots), lengths
    that end inside and on page boundaries."""
    g = torch.Generator().manual_seed(seed)
    vocab = ModelConfig.from_path(model).vocab_size
    ids = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    system = ids(32)
    first = [system + ids(n) for n in (5, 16, 9, 23, 1, 12)]
    return [first, [system + ids(n) for n in (7, 30)] + [first[1] + ids(4), ids(41)]]


def run_engine(model, page_size: int, components: dict | None) -> tuple[list[list[int]], int, int, int]:
    """Greedy tokens of every round on one engine; then, with the prefix cache flushed, the free
    pages and rows (and the pool's page count)."""
    from minisgl import LLM, SamplingParams

    llm = LLM(
        str(model),
        device="cpu",
        dtype="float32",
        page_size=page_size,
        num_pages=256 // page_size,
        max_running_requests=4,
        attention_backend="torch",
        debug_checks=True,
        **({"components": components} if components else {}),
    )
    try:
        tokens = []
        for i, prompts in enumerate(_prompts(model)):
            params = SamplingParams(max_tokens=6 + 3 * i, ignore_eos=True)
            tokens += [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        llm.scheduler.flush_cache()
        cache = llm.scheduler.cache
        return tokens, cache.allocator.num_free, llm.scheduler.table.num_free_rows, cache.num_pages
    finally:
        llm.shutdown()


def run_student_engine(model, page_size: int):
    lab.make_allocator(4).alloc(1)  # a stub fails here, before any engine is built
    lab.make_table(2, 8).alloc_row()
    with lab.registered() as components, engine_failure(f"your allocator and table (page_size={page_size})"):
        return run_engine(model, page_size, components)


@points(5, timeout=180)
@engine
@pytest.mark.parametrize("page_size", [1, 16])
def test_engine_matches_reference(tiny_llama, page_size):
    """The engine on your allocator and table generates the reference tokens (prefix-cache hits,
    evictions, rows reused), and passes its memory checks after every step."""
    got, *_ = run_student_engine(tiny_llama, page_size)
    want, *_ = run_engine(tiny_llama, page_size, None)
    diff = first_token_difference(got, want)
    assert diff is None, (
        f"with your allocator and table the engine generated other tokens than the reference (page_size={page_size})"
        f": {diff}; a position probably points at a slot that holds another token's KV (map_pages / set_slots)"
    )


@points(8, timeout=180)
@engine
def test_engine_frees_everything(tiny_qwen3):
    """After a workload on your allocator and table (page size 4), with the prefix cache flushed,
    every page and every row is free again: nothing leaked."""
    _, free, free_rows, num_pages = run_student_engine(tiny_qwen3, 4)
    assert free == num_pages, (
        f"after every request finished and the prefix cache was flushed, num_free is {free} of {num_pages} pages: "
        f"{num_pages - free} pages leaked (freed pages never came back?)"
    )
    assert free_rows == 4, f"after every request finished, num_free_rows is {free_rows} of 4: a row leaked"
