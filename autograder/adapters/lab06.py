"""Lab 06 adapter: the ``RadixCache`` class of ``lab06_radix_cache.py``, used only through the
``PrefixCache`` interface (``minisgl/kvcache/base.py``)."""

from __future__ import annotations

from autograder.impl import require
from minisgl.kvcache.base import PrefixCache

STEM = "lab06_radix_cache"


def cache_class() -> type[PrefixCache]:
    cls = require(STEM, "RadixCache")
    if not (isinstance(cls, type) and issubclass(cls, PrefixCache)):
        raise TypeError("RadixCache must be a class derived from minisgl.kvcache.base.PrefixCache")
    return cls


def make_cache(page_size: int = 1) -> PrefixCache:
    return cache_class()(page_size)
