"""A grammar backend for regexes built from a byte-level DFA (``regex_dfa.py``): the token-level
mask that lesson 14 derives and lab 14 asks for, registered as ``components={"grammar": "dfa"}``.

A token is allowed in a DFA state when the DFA can read *all* of its bytes from there without
reaching ``DEAD`` (so the output can still be completed); a stop token only where the state is
accepting; a special token, an empty token or an id past the tokenizer's vocabulary (the padded LM
head) never. Each state's packed bitmask row is computed once, the first time a matcher is there,
and cached with the compiled regex (a matcher's ``fill_bitmask`` is then a row copy). The tokens are
indexed by their first byte, so a state walks only the tokens whose first byte it accepts (a state
of ``\\d`` walks only the tokens that start with a digit). xgrammar (the
engine's default) does the same for context-free grammars, with a per-state cache of the tokens
whose fate the state alone decides.
"""

from __future__ import annotations

from typing import Any

import torch

from minisgl.grammar.base import GrammarBackend, GrammarError, Matcher, bitmask_words, pack_bitmask
from minisgl.grammar.regex_dfa import BYTE_DECODER, DEAD, DFA, compile_regex


def vocab_bytes(tokenizer: Any) -> list[bytes | None]:
    """Each token id's bytes (``None``: a special token). Byte-level BPE vocabularies spell bytes with
    GPT-2's printable alphabet (``Ġ`` is a space); added tokens that are not special are plain text."""
    out: list[bytes | None] = [None] * len(tokenizer)
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    for text, i in tokenizer.get_vocab().items():
        if i >= len(out):
            continue
        tok = added.get(i)
        if tok is not None:
            out[i] = None if tok.special else text.encode("utf-8")
        else:
            out[i] = bytes(BYTE_DECODER[c] for c in text)
    return out


def walk(dfa: DFA, state: int, data: bytes) -> int:
    """The state after reading all of ``data`` from ``state`` (``DEAD`` as soon as a byte is refused)."""
    for b in data:
        state = dfa.table[state][b]
        if state == DEAD:
            return DEAD
    return state


class _Compiled:
    """A compiled regex: its DFA and the cache of its states' bitmask rows."""

    def __init__(self, dfa: DFA):
        self.dfa, self.rows = dfa, {}


class DFABackend(GrammarBackend):
    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: list[int], vocab: list[bytes | None] | None = None):
        """``vocab`` (token id -> bytes or None) instead of the tokenizer's: a hand-made vocabulary
        (lesson 14, lab 14's tests)."""
        super().__init__(tokenizer, vocab_size, stop_ids)
        self.vocab = vocab_bytes(tokenizer) if vocab is None else list(vocab)
        if vocab_size < len(self.vocab):
            raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {len(self.vocab)} tokens")
        if any(not 0 <= s < vocab_size for s in self.stop_ids):
            raise ValueError(f"a stop id outside [0, {vocab_size}): {self.stop_ids}")
        self._stops = [s for s in self.stop_ids if s < len(self.vocab)]  # a stop id is never a text token
        self._by_first: list[list[tuple[int, bytes]]] = [[] for _ in range(256)]  # text tokens by first byte
        for i, data in enumerate(self.vocab):
            if data and i not in self.stop_ids:
                self._by_first[data[0]].append((i, data[1:]))

    def compile(self, kind: str, text: str) -> Any:
        if kind != "regex":
            raise GrammarError(f"the dfa grammar backend does regexes only, not {kind}")
        return _Compiled(compile_regex(text))

    def matcher(self, compiled: Any) -> Matcher:
        return DFAMatcher(self, compiled)

    def allowed(self, compiled: _Compiled, state: int) -> torch.Tensor:
        """The ``[vocab_size]`` bool mask of the tokens allowed in the live ``state``."""
        allowed = torch.zeros(self.vocab_size, dtype=torch.bool)
        table, ids = compiled.dfa.table, []
        for first, tokens in enumerate(self._by_first):  # a first byte the state refuses rules out its tokens
            after = table[state][first]
            if after != DEAD:
                ids += [i for i, rest in tokens if walk(compiled.dfa, after, rest) != DEAD]
        allowed[ids] = True
        if state in compiled.dfa.accepting:
            allowed[self._stops] = True
        return allowed

    def row(self, compiled: _Compiled, state: int) -> torch.Tensor:
        if state not in compiled.rows:
            compiled.rows[state] = pack_bitmask(self.allowed(compiled, state))
        return compiled.rows[state]


class DFAMatcher(Matcher):
    def __init__(self, backend: DFABackend, compiled: _Compiled):
        self.backend, self.compiled = backend, compiled
        self.state, self.done = compiled.dfa.start, False

    def accept_token(self, token_id: int) -> bool:
        dfa, b = self.compiled.dfa, self.backend
        if self.done:
            return False
        if token_id in b.stop_ids:
            self.done = self.state in dfa.accepting
            return self.done
        data = b.vocab[token_id] if 0 <= token_id < len(b.vocab) else None
        nxt = walk(dfa, self.state, data) if data else DEAD
        if nxt == DEAD:
            return False
        self.state = nxt
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        words = self.backend.row(self.compiled, self.state)
        assert bitmask.shape[1] == bitmask_words(self.backend.vocab_size), "a bitmask row per the model's vocabulary"
        bitmask[row].copy_(words)

    def is_terminated(self) -> bool:
        return self.done
