"""Lab 03: paged KV memory, the page allocator and the request table.

You implement the two bookkeeping parts of the engine's KV memory, behind the interfaces the scheduler
calls, ``PageAllocator`` and ``ReqTable`` (imported below; their docstrings say what a caller relies on,
and the engine's own implementations of them are off limits: a lab that subclasses, aliases or calls
them is graded 0):

* ``Allocator``, a ``PageAllocator``: which of the pool's pages ``[0, num_pages)`` are free;
* ``RequestTable``, a ``ReqTable``: one row per running request, mapping each of its token
  positions to the KV slot that holds that token's K and V::

    pool slots:   page 0      page 1      page 2      page 3        (page_size = 4)
                 [0 1 2 3]   [4 5 6 7]   [8 9 10 11] [12 13 14 15]
    page_table[row r] = [8 9 10 11 | 0 1 2 3 | ...]   positions 0..7 of request r live in pages 2, 0

Contract (the grader compares every result with the engine's own allocator and table, and with a
simple model of both):

**Allocator**

* A new allocator has every page free: ``num_free == num_pages``.
* ``alloc(n)`` returns ``n`` distinct free pages as an int64 tensor (``alloc(0)``: an empty int64
  tensor) and they stop being free; which free pages, and in what order, is up to you. Asking for
  more than ``num_free`` raises ``MemoryError`` and changes nothing (the same pages stay free);
  asking for exactly ``num_free`` hands them all out.
* ``free(pages)`` makes handed-out pages free again (a later ``alloc`` may hand them out). It raises
  ``RuntimeError`` and changes nothing when any page in it is outside ``[0, num_pages)``, is already
  free (a double free, or a page never handed out), or appears twice in the call: one bad page
  refuses the whole call, wherever it sits in it. Freeing an empty tensor is a no-op. The engine
  passes int64 tensors.
* ``num_free`` is the number of pages ``alloc`` can hand out now.
* Example, ``Allocator(num_pages=4, page_size=16)``: ``alloc(3)`` -> three distinct pages, say
  ``[0, 1, 2]``, and ``num_free == 1``; ``alloc(2)`` raises ``MemoryError`` and ``num_free`` stays 1;
  ``free([1])`` -> ``num_free == 2``; then each of ``free([1])``, ``free([2, 2])``, ``free([0, 4])``
  and ``free([-1])`` raises ``RuntimeError``, and ``num_free`` stays 2 (page 0 is still handed out).

**RequestTable** (``__init__``, ``write``, ``set_tokens`` and ``sync`` are given)

* Rows ``[0, max_rows)`` are for requests; row ``dummy_row == max_rows`` is the dummy row (padding
  requests of a CUDA-graph batch read and write it) and is never handed out. A new table has every
  request row free (``num_free_rows == max_rows``).
* ``alloc_row()`` hands out a free row (the caller checks ``num_free_rows`` first); ``free_row(row)``
  gives it back, and raises ``RuntimeError`` and changes nothing when ``row`` is not a row in use
  (never handed out, already freed, the dummy row, or any other number, negative ones included).
* ``map_pages(rows, starts, ends, pages)``: request ``rows[i]`` gets positions ``[starts[i],
  ends[i])`` (both multiples of ``page_size``, possibly equal), backed by its share of ``pages``:
  the shares are consecutive runs of ``pages``, one page per ``page_size`` positions, handed out in
  the order of ``rows`` (``rows[0]``'s share first, whatever the row numbers). Within a request, its
  pages hold its positions in order, ``page_size`` consecutive positions each, and a position sits in
  its page at the offset ``pos mod page_size``, at the slot the pool gives that page and offset (the
  sketch above). Pages need not be consecutive, nor page sizes powers of two. Example, ``page_size =
  4``: ``map_pages(rows=[2, 0], starts=[0, 4], ends=[8, 8], pages=[5, 1, 3])`` maps row 2's
  positions 0..7 to slots ``[20, 21, 22, 23, 4, 5, 6, 7]`` and row 0's positions 4..7 to ``[12, 13,
  14, 15]``, and nothing else.
* ``set_slots(row, start, slots)``: positions ``[start, start + len(slots))`` of ``row`` point at
  ``slots`` (the prefix cache's slots of a matched prefix); no other position changes. Example:
  ``set_slots(1, 2, [40, 41])`` changes positions 2 and 3 of row 1 only.
* ``slots(row, start, end)`` and ``slots_at(rows, positions)`` read the table back: int64 tensors on
  the host (the table stores int32). ``slots_at`` gives one slot per ``(rows[j], positions[j])``.
  After the example above, ``slots(0, 4, 6)`` -> ``[12, 13]`` and ``slots_at([2, 0], [5, 7])`` ->
  ``[5, 15]``.
* ``point_dummy_row_at(slot)`` maps every position of the dummy row to ``slot``, on the device
  (``page_table``) and in the host copy, and touches no other row.
* All writes go through ``write(rows, cols, slots)``, which fills the host copy and remembers what
  ``sync()`` must push to the device (on a CPU the two are one tensor, on a GPU they are not).

Pitfalls the grader recognises (its messages name them):

* allocator: a page handed out twice (one still counted as free after ``alloc``); ``free`` that
  accepts a double free, or the same page twice in one call, or a page outside the pool (a negative
  page id silently indexes a Python list from its end); a check that looks at some pages of the call
  only; ``alloc`` or ``free`` that changes some state before it raises; freed pages that never come
  back (``num_free`` too low); ``alloc(num_free)`` refused;
* table: ``map_pages`` that puts a position at its page's number instead of at its slot, or keeps
  counting the offset past the end of a page (right only while pages are consecutive), or computes
  the offset in a way that holds for powers of two only, or gives every request the first pages of
  ``pages`` instead of its own share, or shares them out in row-number order instead of the order
  of ``rows``; ``set_slots`` writing one position off; ``slots`` returning int32; the dummy row
  handed out as a request's row, or not filled everywhere; ``free_row`` that does not check its row
  (``-1`` would free the last row).

Grading: ``python -m autograder lab03`` (``--hint`` prints a hint per method) runs fixed cases,
random operation sequences (hypothesis state machines) against a model of each part, then runs the
engine on your allocator and table
(``LLM(components={"allocator": ..., "req_table": ...})``) at page sizes 1, 4 and 16: the generated
tokens must equal the reference engine's, the memory checks must pass after every step, and once
the cache is flushed every page and row must be free again.
"""

from __future__ import annotations

from collections import deque

import torch

from minisgl.kvcache.allocator import PageAllocator
from minisgl.kvcache.table import ReqTable


class Allocator(PageAllocator):
    """A queue of free page ids (freed pages go to the back) and a flag per page."""

    def __init__(self, num_pages: int, page_size: int):
        super().__init__(num_pages, page_size)
        self.free_pages: deque[int] = deque(range(num_pages))  # the pages alloc may hand out, next first
        self.is_free: list[bool] = [True] * num_pages  # is_free[page]: the page is in free_pages

    @property
    def num_free(self) -> int:
        # BEGIN SOLUTION what="the number of pages alloc can hand out now" hint="how many pages are on the free list"
        return len(self.free_pages)
        # END SOLUTION

    def alloc(self, n: int) -> torch.Tensor:
        # BEGIN SOLUTION what="n free pages handed out, or MemoryError with nothing changed" hint="check n against the free list first (MemoryError), then take n pages off its front and clear their flags"
        if n > len(self.free_pages):
            raise MemoryError(f"asked for {n} KV pages, {len(self.free_pages)} free")
        pages = [self.free_pages.popleft() for _ in range(n)]
        for page in pages:
            self.is_free[page] = False
        return torch.tensor(pages, dtype=torch.int64)
        # END SOLUTION

    def free(self, pages: torch.Tensor) -> None:
        # BEGIN SOLUTION what="pages taken back, or RuntimeError with nothing changed" hint="check every page of the call first (in [0, num_pages), not flagged free, no duplicate: a set), and only then set their flags and append them to the free list"
        ids = [int(page) for page in pages.tolist()]
        if any(not 0 <= page < self.num_pages for page in ids):
            raise RuntimeError(f"free of a page outside the pool [0, {self.num_pages}): {ids}")
        if len(set(ids)) != len(ids) or any(self.is_free[page] for page in ids):
            raise RuntimeError(f"double free of a KV page: {ids}")
        for page in ids:
            self.is_free[page] = True
        self.free_pages.extend(ids)
        # END SOLUTION


class RequestTable(ReqTable):
    """``max_rows + 1`` rows of ``width`` positions (the last row: the dummy row). On a GPU the
    scheduler writes a host copy (``page_table_cpu``) and ``sync`` pushes the changes."""

    def __init__(self, max_rows: int, max_seq_len: int, page_size: int, device: torch.device):
        width = -(-max_seq_len // page_size) * page_size  # whole pages
        self.max_rows, self.page_size, self.device = max_rows, page_size, torch.device(device)
        self.dummy_row = max_rows
        self.page_table = torch.zeros(max_rows + 1, width, dtype=torch.int32, device=self.device)
        self.page_table_cpu = self.page_table if self.device.type == "cpu" else self.page_table.cpu()
        self.token_pool = torch.zeros_like(self.page_table)
        self.dirty: list[tuple[torch.Tensor, torch.Tensor]] = []  # (rows, cols) written since the last sync
        self.free_rows: list[int] = list(range(max_rows - 1, -1, -1))  # pop() hands out row 0 first
        self.in_use: list[bool] = [False] * max_rows

    # ---- given: writes, tokens, sync ----------------------------------------------------------
    def write(self, rows, cols, slots: torch.Tensor) -> None:
        """``page_table[rows, cols] = slots`` on the host copy (``rows``/``cols``: ints or int64
        tensors that broadcast against ``slots``), remembered for ``sync``."""
        rows, cols = torch.as_tensor(rows, dtype=torch.int64), torch.as_tensor(cols, dtype=torch.int64)
        rows, cols = torch.broadcast_tensors(rows, cols)
        self.page_table_cpu[rows, cols] = slots.to(torch.int32)
        self.dirty.append((rows.flatten(), cols.flatten()))

    def set_tokens(self, row: int, token_ids: list[int]) -> None:
        ids = torch.tensor(token_ids, dtype=torch.int32)
        self.token_pool[row, : len(token_ids)].copy_(ids, non_blocking=True)

    def sync(self) -> None:
        if self.dirty and self.page_table_cpu is not self.page_table:
            rows = torch.cat([r for r, _ in self.dirty])
            cols = torch.cat([c for _, c in self.dirty])
            self.page_table[rows.to(self.device), cols.to(self.device)] = self.page_table_cpu[rows, cols].to(
                self.device
            )
        self.dirty.clear()

    # ---- rows --------------------------------------------------------------------------------
    @property
    def num_free_rows(self) -> int:
        return len(self.free_rows)

    def alloc_row(self) -> int:
        # BEGIN SOLUTION what="a free request row, handed out" hint="take a row off free_rows and mark it in use"
        row = self.free_rows.pop()
        self.in_use[row] = True
        return row
        # END SOLUTION

    def free_row(self, row: int) -> None:
        # BEGIN SOLUTION what="a row given back, or RuntimeError for a row not in use" hint="raise RuntimeError unless the row is in [0, max_rows) and in use; then mark it free and put it back on free_rows"
        if not (0 <= row < self.max_rows and self.in_use[row]):
            raise RuntimeError(f"free_row({row}): the row is not in use")
        self.in_use[row] = False
        self.free_rows.append(row)
        # END SOLUTION

    # ---- the page table ----------------------------------------------------------------------
    def map_pages(self, rows: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, pages: torch.Tensor) -> None:
        # BEGIN SOLUTION what="each request's positions mapped onto its share of the pages" hint="walk the requests in order with a running index k into pages; position pos of request i is in pages[k + (pos - start) // page_size] at offset pos % page_size; write(row, positions, slots); advance k by the request's page count"
        p, k = self.page_size, 0  # k: the first page of this request's share of pages
        for row, start, end in zip(rows.tolist(), starts.tolist(), ends.tolist()):
            pos = torch.arange(start, end, dtype=torch.int64)
            page = pages[k + (pos - start) // p]
            self.write(row, pos, page * p + pos % p)
            k += (end - start) // p
        # END SOLUTION

    def set_slots(self, row: int, start: int, slots: torch.Tensor) -> None:
        # BEGIN SOLUTION what="a run of positions pointed at the given slots" hint="write slots at positions start, start + 1, ..., start + len(slots) - 1"
        self.write(row, torch.arange(start, start + len(slots), dtype=torch.int64), slots)
        # END SOLUTION

    def slots(self, row: int, start: int, end: int) -> torch.Tensor:
        # BEGIN SOLUTION what="a row's slots for a range of positions, as int64" hint="read the host copy, as int64"
        return self.page_table_cpu[row, start:end].to(torch.int64)
        # END SOLUTION

    def slots_at(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION what="one slot per (row, position) pair, as int64" hint="advanced indexing of the host copy with both tensors, as int64"
        return self.page_table_cpu[rows, positions].to(torch.int64)
        # END SOLUTION

    def point_dummy_row_at(self, slot: int) -> None:
        # BEGIN SOLUTION what="every position of the dummy row mapped to one slot, on the device and the host" hint="fill the dummy row with slot, in page_table and in page_table_cpu"
        self.page_table[self.dummy_row].fill_(slot)
        self.page_table_cpu[self.dummy_row].fill_(slot)
        # END SOLUTION
