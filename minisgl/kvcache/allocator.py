"""The page allocator: which KV pages are free.

A page is ``page_size`` consecutive slots of the pool (page ``k`` = slots ``k*page_size + [0,
page_size)``); pages are the unit of allocation. Every page is either free (here) or held by
someone else (a running request or the prefix cache), never both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from minisgl.registry import Registry


class PageAllocator(ABC):
    """Hands out and takes back KV pages ``[0, num_pages)``."""

    def __init__(self, num_pages: int, page_size: int):
        self.num_pages, self.page_size = num_pages, page_size

    @property
    @abstractmethod
    def num_free(self) -> int:
        """Pages that ``alloc`` can hand out now."""

    @abstractmethod
    def alloc(self, n: int) -> torch.Tensor:
        """``n`` free pages (int64 page ids, each handed out once until freed). Asking for more than
        ``num_free`` raises ``MemoryError`` and changes nothing."""

    @abstractmethod
    def free(self, pages: torch.Tensor) -> None:
        """Take pages back. Freeing a page twice, or one never handed out, raises ``RuntimeError``
        and changes nothing; freeing none is a no-op."""

    def pages_of(self, slots: torch.Tensor) -> torch.Tensor:
        """The pages that page-aligned runs of ``slots`` cover."""
        return slots[:: self.page_size] // self.page_size


class FreeListAllocator(PageAllocator):
    """A queue of free page ids (freed pages go to the back), and a flag per page for the checks."""

    def __init__(self, num_pages: int, page_size: int):
        super().__init__(num_pages, page_size)
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
        pages = pages.to(torch.int64)
        if bool(((pages < 0) | (pages >= self.num_pages)).any()):
            raise RuntimeError("free of a page outside the pool")
        if bool(self._is_free[pages].any()) or len(torch.unique(pages)) != len(pages):
            raise RuntimeError("double free of a KV page")
        self._is_free[pages] = True
        self._free = torch.cat([self._free, pages])


# name -> factory(num_pages, page_size)
ALLOCATORS: Registry[type[PageAllocator]] = Registry("page allocator", {"default": FreeListAllocator})
