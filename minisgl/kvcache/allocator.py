from __future__ import annotations

import torch


class PageAllocator:
    """Free list of KV pages. Pages are the unit of allocation; a request's slots in a page are
    ``page * page_size + [0, page_size)``. Freeing a page twice or one never handed out raises."""

    def __init__(self, num_pages: int, page_size: int):
        self.num_pages, self.page_size = num_pages, page_size
        self._free = torch.arange(num_pages, dtype=torch.int64)
        self._is_free = torch.ones(num_pages, dtype=torch.bool)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> torch.Tensor:
        if n > len(self._free):
            raise MemoryError(f"asked for {n} KV pages, {len(self._free)} free")
        pages, self._free = self._free[:n], self._free[n:]
        self._is_free[pages] = False
        return pages

    def free(self, pages: torch.Tensor) -> None:
        if len(pages) == 0:
            return
        if bool(self._is_free[pages].any()) or len(torch.unique(pages)) != len(pages):
            raise RuntimeError("double free of a KV page")
        self._is_free[pages] = True
        self._free = torch.cat([self._free, pages.to(torch.int64)])

    def pages_of(self, slots: torch.Tensor) -> torch.Tensor:
        """The pages that page-aligned runs of ``slots`` cover."""
        return slots[:: self.page_size] // self.page_size
