"""Lab 06 adapter: the ``RadixCache`` class of ``lab06_radix_cache.py``, used only through the
``PrefixCache`` interface (``minisgl/kvcache/base.py``), and the swap-in that lets the real engine
run on it: the class registered in ``minisgl.kvcache.PREFIX_CACHES`` as ``"lab06"``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from autograder.impl import require
from minisgl.kvcache import PREFIX_CACHES
from minisgl.kvcache.base import PrefixCache

STEM = "lab06_radix_cache"


def cache_class() -> type[PrefixCache]:
    cls = require(STEM, "RadixCache")
    if not (isinstance(cls, type) and issubclass(cls, PrefixCache)):
        raise TypeError("RadixCache must be a class derived from minisgl.kvcache.base.PrefixCache")
    return cls


def make_cache(page_size: int = 1) -> PrefixCache:
    return cache_class()(page_size)


@contextmanager
def registered_cache(cls: type[PrefixCache], name: str = "lab06") -> Iterator[str]:
    """``cls`` as the engine's ``cache_type=name`` inside the block; yields the name."""
    with PREFIX_CACHES.registered(name, cls):
        yield name
