"""The request table: one row per running request.

    page_table[row, pos]  -> KV slot of token ``pos``   (device; the attention backend reads it)
    token_pool[row, pos]  -> token id at ``pos``         (device; next inputs are gathered from it,
                                                          so sampled tokens never go through the host)
    page_table_cpu        -> host mirror of page_table  (the scheduler allocates and frees from it)

The last row is reserved for the dummy requests that pad a CUDA-graph batch.
"""

from __future__ import annotations

import numpy as np
import torch


class ReqTable:
    def __init__(self, page_table: torch.Tensor):
        self.page_table = page_table
        self.device = page_table.device
        self.page_table_cpu = page_table if self.device.type == "cpu" else torch.zeros_like(page_table, device="cpu")
        self.token_pool = torch.zeros_like(page_table)
        self.max_rows = page_table.shape[0] - 1
        self.dummy_row = self.max_rows
        self._free_rows = list(range(self.max_rows - 1, -1, -1))
        self._dirty: list[tuple[torch.Tensor, torch.Tensor]] = []  # (rows, cols) of page_table_cpu to push

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int:
        return self._free_rows.pop()

    def free_row(self, row: int) -> None:
        self._free_rows.append(row)

    def set_slots(self, rows: torch.Tensor, cols: torch.Tensor, slots: torch.Tensor) -> None:
        """``page_table[rows[i], cols[i]] = slots[i]`` (pushed to the device by ``sync``)."""
        self.page_table_cpu[rows, cols] = slots.to(torch.int32)
        self._dirty.append((rows, cols))

    def slots(self, row: int, start: int, end: int) -> torch.Tensor:
        return self.page_table_cpu[row, start:end].to(torch.int64)

    def set_tokens(self, row: int, token_ids: list[int]) -> None:
        ids = torch.tensor(token_ids, dtype=torch.int32)
        self.token_pool[row, : len(token_ids)].copy_(ids, non_blocking=True)

    def sync(self) -> None:
        """Push the page-table entries written since the last sync to the device, in one copy."""
        if not self._dirty:
            return
        if self.device.type != "cpu":
            rows = torch.cat([r for r, _ in self._dirty])
            cols = torch.cat([c for _, c in self._dirty])
            vals = self.page_table_cpu[rows, cols]
            dev = lambda t: t.to(self.device, non_blocking=True)  # pageable: staged, no device sync
            self.page_table[dev(rows), dev(cols)] = dev(vals)
        self._dirty.clear()


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
