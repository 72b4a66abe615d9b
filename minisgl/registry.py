"""Registries: the implementations of one swappable part of the engine, by name.

Every part the course swaps (sampler, prefix cache, attention backend, norm, rotary, activation,
page allocator, request table, admission and chunking policies, scheduler loop, TP layers,
communicator) is looked up here by the name its config gives, never imported directly. A lab
registers its own implementation under a new name and selects that name::

    NORMS.register("lab01", my_rms_norm)
    LLM(components={"norm": "lab01"})

A value is the implementation itself, or ``"module:attr"``, imported on first use (GPU-only code
stays out of import time). A name may also be a ``"module:attr"`` path that was never registered:
it is imported where it is looked up, so it works in processes started with ``spawn`` (the other
tensor-parallel ranks), which do not see what their parent registered at run time.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, what: str, entries: dict[str, T | str] | None = None, aliases: dict[str, str] | None = None):
        self.what = what
        self._entries: dict[str, T | str] = dict(entries or {})
        self.aliases = dict(aliases or {})  # other spellings of a name (e.g. mini-sglang's)

    def register(self, name: str, impl: T | str) -> None:
        """Add (or replace) the implementation called ``name``."""
        self._entries[name] = impl

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    @contextmanager
    def registered(self, name: str, impl: T | str) -> Iterator[str]:
        """``register`` for the duration of a ``with`` block (tests, graders)."""
        saved = self._entries.get(name)
        self.register(name, impl)
        try:
            yield name
        finally:
            if saved is None:
                self.unregister(name)
            else:
                self._entries[name] = saved

    def names(self) -> list[str]:
        return sorted(self._entries)

    def ordered(self) -> list[str]:
        """The names in the order they were registered."""
        return list(self._entries)

    def canonical(self, name: str) -> str:
        return self.aliases.get(name, name)

    def __contains__(self, name: str) -> bool:
        key = self.canonical(name)
        return key in self._entries or ":" in key

    def get(self, name: str) -> T:
        """The implementation called ``name``; ``ValueError`` lists the names there are."""
        key = self.canonical(name)
        if key not in self._entries and ":" not in key:
            raise ValueError(f"unknown {self.what} {name!r}; choose one of {self.names()} or give 'module:attr'")
        impl = self._entries.get(key, key)
        if isinstance(impl, str):
            module, _, attr = impl.partition(":")
            try:
                impl = getattr(importlib.import_module(module), attr)
            except AttributeError:
                raise ValueError(f"{self.what} {impl!r}: module {module!r} has no {attr!r}") from None
            except ImportError as e:
                if key in self._entries:  # a registered implementation whose dependency is missing
                    raise
                raise ValueError(f"{self.what} {key!r}: cannot import {module!r} ({e})") from e
            self._entries[key] = impl
        return impl

    def is_default(self, impl: object) -> bool:
        """True when ``impl`` is the implementation registered as ``default`` (the engine's own,
        which may take a fused kernel path that a swapped-in implementation must not)."""
        return "default" in self._entries and self.get("default") is impl
