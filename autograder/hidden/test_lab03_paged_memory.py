"""Lab 03, hidden tests: ``alloc(0)``, ``free_row`` of the dummy row and of a negative row, and
``map_pages`` at page sizes that are not powers of two. Each calls the lab first, so a stub fails at
once with its hint."""

from __future__ import annotations

import random

import pytest
import torch

from autograder.adapters import lab03 as lab
from autograder.points import points
from minisgl.kvcache.table import TensorReqTable


def _i64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


@points(3)
def test_alloc_zero_pages():
    """alloc(0) returns an empty int64 tensor and changes nothing, even when no page is free."""
    a = lab.make_allocator(5)
    for free in (5, 0):
        got = a.alloc(0)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.int64 and got.numel() == 0, (
            f"alloc(0) with {free} pages free returned {got!r}; expected an empty int64 tensor "
            "(torch.tensor([]) is float32: give the dtype)"
        )
        assert a.num_free == free, f"alloc(0) changed num_free from {free} to {a.num_free}"
        if free:
            a.alloc(free)


@points(3)
def test_free_row_rejects_dummy_and_negative_rows():
    """free_row of the dummy row, of -1 and of max_rows + 1 raises RuntimeError and changes nothing,
    also while the last request row is in use."""
    t = lab.make_table(3, 8)
    rows = [t.alloc_row() for _ in range(3)]
    for row in (t.dummy_row, -1, t.dummy_row + 1):
        try:
            t.free_row(row)
        except NotImplementedError:
            raise  # a subclass of RuntimeError: a stub must not pass for a refusal
        except RuntimeError:
            pass
        except Exception as e:
            raise AssertionError(
                f"free_row({row}) raised {type(e).__name__}: {e}; expected RuntimeError (check 0 <= row < max_rows "
                "before looking the row up)"
            ) from None
        else:
            raise AssertionError(
                f"free_row({row}) with rows {rows} in use did not raise: only a request row in use may be freed "
                "(a negative row silently indexes from the end of a Python list)"
            )
        assert t.num_free_rows == 0, f"a refused free_row({row}) changed num_free_rows to {t.num_free_rows}"


@points(2)
@pytest.mark.parametrize("page_size", [3, 6])
def test_map_pages_odd_page_sizes(page_size):
    """map_pages at page sizes 3 and 6 (not powers of two), several requests growing over random
    pages, gives the engine's table."""
    p, rng = page_size, random.Random(page_size)
    mine, ref = lab.make_table(4, 10 * p, p), TensorReqTable(4, 10 * p, p, torch.device("cpu"))
    rows = [mine.alloc_row() for _ in range(4)]
    have = [0] * 4
    for step in range(4):
        grow = [rng.randrange(3) for _ in rows]
        starts, ends = [h * p for h in have], [(h + g) * p for h, g in zip(have, grow)]
        pages = rng.sample(range(100), sum(grow))
        for t in (mine, ref):
            t.map_pages(_i64(rows), _i64(starts), _i64(ends), _i64(pages))
        have = [h + g for h, g in zip(have, grow)]
        for row, h in zip(rows, have):
            got, want = mine.slots(row, 0, h * p).tolist(), ref.slots(row, 0, h * p).tolist()
            assert got == want, (
                f"page_size {p}, step {step}: map_pages(rows={rows}, starts={starts}, ends={ends}, pages={pages}); "
                f"row {row} now maps to {got}, expected {want}: slot = page * page_size + pos % page_size for any "
                "page size (a bit mask such as pos & (page_size - 1) works only for powers of two)"
            )
