"""Lab 14 adapter: the functions and the ``LabGrammarBackend`` class of ``lab14_token_mask.py`` (the
class used only through the ``GrammarBackend`` / ``Matcher`` interfaces of ``minisgl/grammar/base.py``,
plus its ``row``), and the swap-in: the class registered in ``minisgl.grammar.GRAMMAR_BACKENDS`` as
``"lab14"`` (``LLM(components={"grammar": "lab14"})``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from autograder.impl import load, require
from minisgl.grammar.base import GRAMMAR_BACKENDS, GrammarBackend

STEM = "lab14_token_mask"


def token_bytes(tokenizer: Any) -> list[bytes | None]:
    return require(STEM, "token_bytes")(tokenizer)


def walk(dfa, state: int, data: bytes) -> int:
    return require(STEM, "walk")(dfa, state, data)


def allowed_tokens(dfa, state: int, vocab: list[bytes | None], stop_ids: list[int]) -> list[int]:
    return require(STEM, "allowed_tokens")(dfa, state, vocab, stop_ids)


def pack_row(allowed: list[int], vocab_size: int) -> torch.Tensor:
    return require(STEM, "pack_row")(allowed, vocab_size)


def backend_class() -> type[GrammarBackend]:
    cls = require(STEM, "LabGrammarBackend")
    require(STEM, "LabMatcher")  # checked too: the engine runs it
    if not (isinstance(cls, type) and issubclass(cls, GrammarBackend)):
        raise TypeError("LabGrammarBackend must be a class derived from minisgl.grammar.base.GrammarBackend")
    return cls


def make_backend(tokenizer: Any, vocab_size: int, stop_ids: list[int]) -> GrammarBackend:
    return backend_class()(tokenizer, vocab_size, stop_ids)


@contextmanager
def counting_allowed_tokens() -> Iterator[list[tuple[int, int]]]:
    """Inside the block, every call of the lab's ``allowed_tokens`` (made by the backend through the
    module's global name) is recorded as ``(id of the dfa, state)``."""
    module = load(STEM)
    inner = require(STEM, "allowed_tokens")
    calls: list[tuple[int, int]] = []

    def counted(dfa, state, vocab, stop_ids):
        calls.append((id(dfa), state))
        return inner(dfa, state, vocab, stop_ids)

    module.allowed_tokens = counted
    try:
        yield calls
    finally:
        module.allowed_tokens = inner


@contextmanager
def registered_backend(cls: type[GrammarBackend], name: str = "lab14") -> Iterator[str]:
    """``cls`` as the engine's ``components={"grammar": name}`` inside the block; yields the name."""
    with GRAMMAR_BACKENDS.registered(name, cls):
        yield name
