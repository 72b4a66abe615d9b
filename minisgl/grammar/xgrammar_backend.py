"""The engine's grammar backend: xgrammar (the library SGLang and vLLM use). It compiles a JSON
schema, a regex or an EBNF grammar against the tokenizer's vocabulary into a pushdown automaton with
a per-state cache of token masks, so filling a row of the bitmask costs microseconds for most states.

JSON is compiled without free whitespace (``any_whitespace=False``: ``{"a": 1, "b": [2]}`` with
xgrammar's separators): a small model left free to emit whitespace can loop on it until
``max_tokens``, and no JSON parser cares.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from minisgl.grammar.base import GrammarBackend, GrammarError, Matcher

# xgrammar's errors start with "[hh:mm:ss] /path/file.cc:123: " and sometimes "Check failed: (...) is false: "
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
    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: list[int]):
        super().__init__(tokenizer, vocab_size, stop_ids)
        import xgrammar as xgr

        self._xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=self.stop_ids or None
        )
        # one thread: the compile runs beside the scheduler's loop and the forward pass, not instead of them
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=True)

    def compile(self, kind: str, text: str) -> Any:
        c = self._compiler
        try:
            if kind == "json_schema":
                return c.compile_json_schema(text, any_whitespace=False)
            if kind == "regex":
                return c.compile_regex(text)
            if kind == "ebnf":
                return c.compile_grammar(text)
        except Exception as e:  # xgrammar raises RuntimeError (and ValueError / its own) for bad input
            msg = _NOISE.sub("", str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
            raise GrammarError(f"invalid {kind}: {msg}"[:2000]) from None
        raise GrammarError(f"unknown constraint kind {kind!r}")

    def matcher(self, compiled: Any) -> Matcher:
        return XGrammarMatcher(self._xgr.GrammarMatcher(compiled))
