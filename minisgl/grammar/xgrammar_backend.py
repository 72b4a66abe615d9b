"""The engine's grammar backend: xgrammar (the library SGLang and vLLM use). It compiles a JSON
schema, a regex or an EBNF grammar against the tokenizer's vocabulary into a pushdown automaton with
a per-state cache of token masks, so filling a row of the bitmask costs microseconds for most states.

JSON is compiled without free whitespace (``any_whitespace=False``: ``{"a": 1, "b": [2]}`` with
xgrammar's separators): a small model left free to emit whitespace can loop on it until
``max_tokens``, and no JSON parser cares.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from typing import Any

import torch

from minisgl.grammar.base import GrammarBackend, GrammarError, Matcher, tokenizer_of
from minisgl.grammar.compiler import forked

# xgrammar's errors start with "[hh:mm:ss] /path/file.cc:123: " and sometimes "Check failed: (...) is false: "
CACHE_BYTES = 2 << 20  # xgrammar's compiler cache: the manager keeps the compiled constraints (compiler.py)
_NOISE = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


class XGrammarMatcher(Matcher):
    def __init__(self, matcher: Any):
        self._m = matcher

    def accept_token(self, token_id: int) -> bool:
        return bool(self._m.accept_token(token_id))

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return bool(self._m.is_terminated())


class XGrammarBackend(GrammarBackend):
    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: list[int], info: Any = None):
        """``info``: xgrammar's tables of the tokenizer's vocabulary, instead of ``tokenizer``."""
        super().__init__(tokenizer, vocab_size, stop_ids)
        import xgrammar as xgr

        self._xgr = xgr
        self.info = info = info or xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=self.stop_ids or None
        )
        # one thread: the compile runs beside the scheduler's loop and the forward pass, not instead of them
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_limit_bytes=CACHE_BYTES)
        self._pid = os.getpid()

    @classmethod
    def build(cls, model_path: Any, vocab_size: int, stop_ids: list[int]) -> XGrammarBackend:
        """The vocabulary's tables are made in a forked child and come back serialised: loading a tokenizer
        takes memory that would stay in the scheduler's process (docs/structured-output.md)."""
        import xgrammar as xgr

        def tables() -> bytes:
            tokenizer = tokenizer_of(model_path)
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids or None)
            return info.serialize_json().encode()

        data = forked(tables) if hasattr(os, "fork") else tables()
        return cls(None, vocab_size, stop_ids, info=xgr.TokenizerInfo.deserialize_json(data.decode()))

    @classmethod
    def check(cls, kind: str, text: str) -> None:
        import xgrammar as xgr

        parse = {"json_schema": lambda t: xgr.Grammar.from_json_schema(t, any_whitespace=False),
                 "regex": xgr.Grammar.from_regex, "ebnf": xgr.Grammar.from_ebnf}  # fmt: skip
        if kind not in parse:
            raise GrammarError(f"unknown constraint kind {kind!r}")
        with _errors(kind):
            parse[kind](text)

    def compile(self, kind: str, text: str) -> Any:
        if os.getpid() != self._pid:  # in a forked child (compiler.py's trial) a compiler of its own: a thread
            # of the parent may have held the shared one's cache lock at the fork
            self._compiler = self._xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
            self._pid = os.getpid()
        c = self._compiler
        with _errors(kind):
            if kind == "json_schema":
                return c.compile_json_schema(text, any_whitespace=False)
            if kind == "regex":
                return c.compile_regex(text)
            if kind == "ebnf":
                return c.compile_grammar(text)
        raise GrammarError(f"unknown constraint kind {kind!r}")

    def matcher(self, compiled: Any) -> Matcher:
        return XGrammarMatcher(self._xgr.GrammarMatcher(compiled))

    def nbytes(self, compiled: Any) -> int:
        return int(compiled.memory_size_bytes)


@contextmanager
def _errors(kind: str):
    """xgrammar's errors (RuntimeError, ValueError, its own) as a ``GrammarError`` without its noise."""
    try:
        yield
    except Exception as e:
        msg = _NOISE.sub("", str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
        raise GrammarError(f"invalid {kind}: {msg}"[:2000]) from None
