"""The request table: where each running request's tokens and KV slots are.

::

    page_table[row, pos]  -> KV slot of token ``pos``  (device; attention backends read it)
    token_pool[row, pos]  -> token id at ``pos``        (device; the next inputs are gathered from it,
                                                         so sampled tokens never go through the host)
    row max_rows          -> the dummy row: padding requests of a CUDA-graph batch use it, and it
                             points at the pool's scratch page, so they never touch real KV

A request owns one row from admission to its end. Its positions are mapped to slots a page at a
time: with ``page_size = p``, positions ``[k*p, (k+1)*p)`` sit in one page, at slots
``page*p + [0, p)``. This file is the only one that knows the table's layout.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch

from minisgl.registry import Registry


class ReqTable(ABC):
    """Rows of running requests: their page table (positions -> KV slots) and token ids.

    The scheduler writes it on the host; ``sync()`` makes the writes visible to the device before
    a forward pass reads ``page_table``. Rows are reused: a freed row's old entries are garbage
    until the next request writes them, and nothing reads a row past what its request wrote."""

    page_table: torch.Tensor  # [max_rows + 1, width] int32 on the device (the last row: dummy_row)
    token_pool: torch.Tensor  # [max_rows + 1, width] int32 on the device
    max_rows: int
    dummy_row: int
    page_size: int

    @property
    @abstractmethod
    def num_free_rows(self) -> int: ...

    @abstractmethod
    def alloc_row(self) -> int:
        """A free row (never ``dummy_row``); the caller checks ``num_free_rows`` first."""

    @abstractmethod
    def free_row(self, row: int) -> None:
        """Give a row back; freeing a row that is not in use raises."""

    @abstractmethod
    def map_pages(self, rows: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, pages: torch.Tensor) -> None:
        """Request ``rows[i]`` gets fresh pages for positions ``[starts[i], ends[i])`` (both multiples
        of ``page_size``), taken in order from ``pages`` (int64 page ids, one per ``page_size``
        positions, request after request)."""

    @abstractmethod
    def set_slots(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Positions ``[start, start + len(slots))`` of ``row`` point at ``slots`` (a cached prefix)."""

    @abstractmethod
    def slots(self, row: int, start: int, end: int) -> torch.Tensor:
        """The KV slots (int64, host) of positions ``[start, end)`` of ``row``."""

    @abstractmethod
    def slots_at(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The KV slots (int64, host) of ``(rows[i], positions[i])``, for every ``i``."""

    @abstractmethod
    def set_tokens(self, row: int, token_ids: list[int]) -> None:
        """``token_pool[row, :len(token_ids)] = token_ids`` (a newly admitted prompt)."""

    @abstractmethod
    def sync(self) -> None:
        """Push the page-table writes made since the last call to the device."""

    @abstractmethod
    def point_dummy_row_at(self, slot: int) -> None:
        """Every position of the dummy row maps to ``slot`` (the pool's scratch page)."""


class TensorReqTable(ReqTable):
    """Dense tensors of ``max_rows + 1`` rows of ``width`` positions, with a host mirror of the
    page table that the scheduler writes (one batched copy to the device per step)."""

    def __init__(self, max_rows: int, max_seq_len: int, page_size: int, device: torch.device):
        width = -(-max_seq_len // page_size) * page_size
        self.max_rows, self.page_size, self.device = max_rows, page_size, device
        self.dummy_row = max_rows
        self.page_table = torch.zeros(max_rows + 1, width, dtype=torch.int32, device=device)
        self.page_table_cpu = (
            self.page_table if device.type == "cpu" else torch.zeros_like(self.page_table, device="cpu")
        )
        self.token_pool = torch.zeros_like(self.page_table)
        self._free_rows = list(range(max_rows - 1, -1, -1))
        self._in_use = [False] * max_rows
        self._dirty: list[tuple[torch.Tensor, torch.Tensor]] = []  # (rows, cols) of page_table_cpu to push

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int:
        row = self._free_rows.pop()
        self._in_use[row] = True
        return row

    def free_row(self, row: int) -> None:
        if not (0 <= row < self.max_rows and self._in_use[row]):
            raise RuntimeError(f"free_row({row}): the row is not in use")
        self._in_use[row] = False
        self._free_rows.append(row)

    def _write(self, rows: torch.Tensor, cols: torch.Tensor, slots: torch.Tensor) -> None:
        self.page_table_cpu[rows, cols] = slots.to(torch.int32)
        self._dirty.append((rows, cols))

    def map_pages(self, rows: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, pages: torch.Tensor) -> None:
        p = self.page_size
        new_rows, new_cols = ragged_index(rows, starts, ends)
        slots = (pages[:, None] * p + torch.arange(p, dtype=torch.int64)[None, :]).flatten()
        self._write(new_rows, new_cols, slots)

    def set_slots(self, row: int, start: int, slots: torch.Tensor) -> None:
        n = len(slots)
        if n:
            self._write(torch.full((n,), row, dtype=torch.int64), torch.arange(start, start + n), slots)

    def slots(self, row: int, start: int, end: int) -> torch.Tensor:
        return self.page_table_cpu[row, start:end].to(torch.int64)

    def slots_at(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.page_table_cpu[rows, positions].to(torch.int64)

    def set_tokens(self, row: int, token_ids: list[int]) -> None:
        ids = torch.tensor(token_ids, dtype=torch.int32)
        self.token_pool[row, : len(token_ids)].copy_(ids, non_blocking=True)

    def sync(self) -> None:
        if not self._dirty:
            return
        if self.device.type != "cpu":
            rows = torch.cat([r for r, _ in self._dirty])
            cols = torch.cat([c for _, c in self._dirty])
            vals = self.page_table_cpu[rows, cols]
            dev = lambda t: t.to(self.device, non_blocking=True)  # pageable: staged, no device sync
            self.page_table[dev(rows), dev(cols)] = dev(vals)
        self._dirty.clear()

    def point_dummy_row_at(self, slot: int) -> None:
        self.page_table[self.dummy_row].fill_(slot)
        if self.page_table_cpu is not self.page_table:
            self.page_table_cpu[self.dummy_row].fill_(slot)


def ragged_index(rows: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every ``(rows[i], p)`` for ``p`` in ``[starts[i], ends[i])``, flattened in order (int64).

    numpy, not torch: these arrays have a few hundred entries and torch's CPU ops on them cost
    more in dispatch (and thread-pool wake-ups) than the work itself, on every step."""
    r, s, e = rows.numpy(), starts.numpy(), ends.numpy()
    lens = e - s
    if (lens == 1).all():  # a decode batch
        return rows, starts
    flat_rows = np.repeat(r, lens)
    flat_pos = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens - s, lens)
    return torch.from_numpy(flat_rows), torch.from_numpy(flat_pos)


# name -> factory(max_rows, max_seq_len, page_size, device)
REQ_TABLES: Registry[type[ReqTable]] = Registry("request table", {"default": TensorReqTable})
