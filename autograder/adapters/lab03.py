"""Lab 03 adapter: the ``Allocator`` and ``RequestTable`` classes of ``lab03_paged_memory.py``, used
only through the ``PageAllocator`` and ``ReqTable`` interfaces (``minisgl/kvcache/allocator.py``,
``minisgl/kvcache/table.py``), and the swap-in that lets the real engine run on them: the classes
registered in ``minisgl.kvcache.ALLOCATORS`` and ``REQ_TABLES`` as ``"lab03"``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from autograder.impl import require
from minisgl.kvcache import ALLOCATORS, REQ_TABLES
from minisgl.kvcache.allocator import PageAllocator
from minisgl.kvcache.table import ReqTable

STEM = "lab03_paged_memory"


def allocator_class() -> type[PageAllocator]:
    cls = require(STEM, "Allocator")
    if not (isinstance(cls, type) and issubclass(cls, PageAllocator)):
        raise TypeError("Allocator must be a class derived from minisgl.kvcache.allocator.PageAllocator")
    return cls


def table_class() -> type[ReqTable]:
    cls = require(STEM, "RequestTable")
    if not (isinstance(cls, type) and issubclass(cls, ReqTable)):
        raise TypeError("RequestTable must be a class derived from minisgl.kvcache.table.ReqTable")
    return cls


def make_allocator(num_pages: int, page_size: int = 1) -> PageAllocator:
    return allocator_class()(num_pages, page_size)


def make_table(max_rows: int, max_seq_len: int, page_size: int = 1) -> ReqTable:
    return table_class()(max_rows, max_seq_len, page_size, torch.device("cpu"))


@contextmanager
def registered(name: str = "lab03") -> Iterator[dict[str, str]]:
    """The student's allocator and table as the engine's ``components`` inside the block; yields
    the ``components`` argument of ``LLM(...)`` that selects them."""
    allocator, table = allocator_class(), table_class()
    with ALLOCATORS.registered(name, allocator), REQ_TABLES.registered(name, table):
        yield {"allocator": name, "req_table": name}
