"""The request table: one row per running request.

    page_table[row, pos]  -> KV slot of token ``pos``   (device; the attention backend reads it)
    token_pool[row, pos]  -> token id at ``pos``         (device; next inputs are gathered from it,
                                                          so sampled tokens never go through the host)
    page_table_cpu        -> host mirror of page_table  (the scheduler allocates and frees from it)

The last row is reserved for the dummy requests that pad a CUDA-graph batch.
"""

from __future__ import annotations

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
        self._dirty: list[tuple[int, int, int]] = []  # (row, start, end) of page_table_cpu to push

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int:
        return self._free_rows.pop()

    def free_row(self, row: int) -> None:
        self._free_rows.append(row)

    def set_slots(self, row: int, start: int, slots: torch.Tensor) -> None:
        self.page_table_cpu[row, start : start + len(slots)] = slots.to(torch.int32)
        self._dirty.append((row, start, start + len(slots)))

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
            rows = torch.cat([torch.full((e - s,), r, dtype=torch.int64) for r, s, e in self._dirty])
            cols = torch.cat([torch.arange(s, e) for _, s, e in self._dirty])
            vals = self.page_table_cpu[rows, cols]
            self.page_table[rows.to(self.device), cols.to(self.device)] = vals.to(self.device)
        self._dirty.clear()
