"""Lab 14: constrained decoding's token mask, from a DFA over bytes.

A regex constrains *characters*; the model picks *tokens*, each a string of bytes that may span
several DFA states, stop in the middle of a UTF-8 character, or be no text at all. You write the
token-level part of a grammar backend for regexes: which tokens may come next in each DFA state, as
the packed bitmask the engine applies to the logits, and the matcher that follows one request. It
plugs into the engine through the seam of ``minisgl/grammar/base.py`` (read it first): the grader
registers ``LabGrammarBackend`` in ``GRAMMAR_BACKENDS`` as ``"lab14"`` and runs the engine with
``components={"grammar": "lab14"}``. The engine's own backends are off limits (a lab that derives
from, calls or aliases ``minisgl.grammar.dfa_backend``, xgrammar's backend or ``pack_bitmask``
scores 0)::

    regex "\\d+-\\d"      DFA (bytes)   0 -[0-9]-> 1 -[0-9]-> 1 -[-]-> 2 -[0-9]-> 3 (accepting)
    in state 1:   "12" allowed (1 -> 1 -> 1)     "4-" allowed (1 -> 1 -> 2: a token spans states)
                  "1a" refused (1 -> 1 -> DEAD, although its prefix "1" was fine)
                  EOS refused (1 is not accepting)   "" refused   <|im_start|> refused (special)
    in state 3:   only EOS

Provided, and yours to use: ``compile_regex(text) -> DFA`` and ``DEAD`` (``minisgl/grammar/
regex_dfa.py``: the course's own regex -> DFA compiler for a regex subset, over UTF-8 *bytes*, so
a token's bytes can be walked one by one; not the PyPI ``interegular``, whose automata read
characters), ``dfa.step(state, byte)`` / ``dfa.table[state][byte]`` (the next state or ``DEAD``;
only a live state may be stepped from), ``dfa.accepting``, ``dfa.start``; ``BYTE_DECODER`` (GPT-2's
byte-level alphabet, inverted: ``BYTE_DECODER["Ġ"] == 0x20``); ``bitmask_words(vocab_size)``; the
``Compiled`` holder (a DFA and its cache of rows).

Contract (the grader compares every result with the engine's ``minisgl/grammar/dfa_backend.py``):

* ``token_bytes(tokenizer)`` -> a list of ``len(tokenizer)`` entries, entry ``i`` the bytes of token
  ``i``: a token of the byte-level vocabulary (``tokenizer.get_vocab()``: text -> id) spells its
  bytes with GPT-2's alphabet (``"Ġthe"`` is ``b" the"``, ``"Ċ"`` is ``b"\\n"``, ``"Ã"`` the lone
  byte ``0xC3``), so map each character through ``BYTE_DECODER``; an added token
  (``tokenizer.added_tokens_decoder``: id -> ``AddedToken``) is ``None`` if its ``special`` is true
  (``<|im_end|>``, but also ``<repo_name>``: ``tokenizer.all_special_ids`` lists only three of the
  embedded tokenizer's 17 special tokens), else its text's UTF-8.
* ``walk(dfa, state, data)`` -> the state after reading every byte of ``data`` from the live
  ``state``; ``DEAD`` as soon as one byte is refused (a later byte never brings it back).
* ``allowed_tokens(dfa, state, vocab, stop_ids)`` -> the ids ``i`` in ``range(len(vocab))``,
  ascending, that may come next in ``state``: a stop id exactly when ``state`` is accepting (a stop
  id is never a text token, whatever its bytes); any other ``i`` when ``vocab[i]`` is non-empty
  bytes (not ``None``, not ``b""``: an empty token would never advance the output) and
  ``walk(...)`` over all of them is not ``DEAD``.
* ``pack_row(allowed, vocab_size)`` -> an int32 tensor of ``bitmask_words(vocab_size)`` words: bit
  ``b`` (``b = 0`` the lowest) of word ``w`` is 1 exactly when token ``32 * w + b`` is in
  ``allowed``; every other bit, including those past ``vocab_size`` in the last word, is 0. A word
  whose bit 31 is set is negative (int32 is two's complement: a word ``>= 1 << 31`` stands for
  ``word - (1 << 32)``). ``ValueError`` for an id outside ``[0, vocab_size)``.
* ``LabGrammarBackend(tokenizer, vocab_size, stop_ids)``: ``vocab_size`` is the model's (the LM
  head may have more rows than the tokenizer has tokens: those ids are never allowed).
  ``ValueError`` when ``vocab_size < len(tokenizer)`` and (each on its own) when a stop id is
  outside ``[0, vocab_size)``. ``compile("regex", text)`` returns ``Compiled(compile_regex(text))``
  (whose ``GrammarError`` passes through); any other kind raises ``GrammarError``. ``row(compiled,
  state)`` is that state's packed row for ``vocab_size``, from ``allowed_tokens``, which it calls at
  most once per compiled regex and state (cache it in ``compiled.rows``: a state's mask is the same
  every time, and a scan of the vocabulary costs milliseconds, per step and per request).
* ``LabMatcher`` (``base.py``'s ``Matcher``): ``fill_bitmask(bitmask, row)`` overwrites the whole
  row ``row`` (the engine's bitmask starts all ones; its width is ``bitmask_words(vocab_size)``).
  ``accept_token(t)`` returns False and changes nothing for a token the current row does not allow
  (after termination, every token); a text token advances the state by *all* its bytes; an allowed
  stop token terminates the matcher (``is_terminated()`` True from then on).

Pitfalls the grader recognises (its messages name them):

* byte-level tokens: a token's text encoded as UTF-8 (``"Ġ"`` is the space byte, not ``b"\\xc4\\xa0"``);
  special tokens taken from ``all_special_ids`` alone (``<repo_name>`` becomes text);
* dead states: a token allowed because a prefix of it was fine (the walk stopped at the first
  refused byte but kept the state before it); a walk that goes on after ``DEAD`` (``table[-1]`` is
  the last state's row in Python: a later byte "revives" it) and looks at the final state only;
* the empty token allowed (it leaves the state as it is); EOS allowed outside accepting states, or
  never (the request can then not stop);
* the bitmask: bits in the wrong order within a word; bit 31 overflowing int32; the row sized by the
  tokenizer, not the model's vocabulary, so the padded LM-head tokens keep the engine's all-ones;
* the matcher: a token that spans states advanced by its first byte only; a refused token that moves
  the state anyway; a stop token accepted without terminating; the state's mask recomputed at every
  step instead of cached.

Grading: ``python -m autograder lab14`` checks each function on hand-made vocabularies and on the
embedded tokenizer's 49,152 tokens against the engine's DFA backend (fixed regexes and random ones),
then runs the engine on a tiny model with the real tokenizer and ``components={"grammar": "lab14"}``
under six regexes (the greedy tokens of the reference backend, ``"dfa"``, are known): every output
full-matches its regex, ends with "stop", and equals the reference's tokens. The padded LM head is
checked on hand-made vocabularies (``vocab_size = len(tokenizer) + 40``).
"""

from __future__ import annotations

from typing import Any

import torch

from minisgl.grammar.base import GrammarBackend, GrammarError, Matcher, bitmask_words
from minisgl.grammar.regex_dfa import BYTE_DECODER, DEAD, DFA, compile_regex


def token_bytes(tokenizer: Any) -> list[bytes | None]:
    # BEGIN SOLUTION hint="map each vocabulary token's characters through BYTE_DECODER; special added tokens are None"
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    out: list[bytes | None] = [None] * len(tokenizer)
    for text, i in tokenizer.get_vocab().items():
        if i < len(out):
            tok = added.get(i)
            if tok is None:
                out[i] = bytes(BYTE_DECODER[c] for c in text)
            elif not tok.special:
                out[i] = text.encode("utf-8")
    return out
    # END SOLUTION


def walk(dfa: DFA, state: int, data: bytes) -> int:
    # BEGIN SOLUTION hint="step the DFA over every byte of data; return DEAD as soon as a step is DEAD"
    for b in data:
        nxt = dfa.step(state, b)
        if nxt == DEAD:
            return DEAD
        state = nxt
    return state
    # END SOLUTION


def allowed_tokens(dfa: DFA, state: int, vocab: list[bytes | None], stop_ids: list[int]) -> list[int]:
    # BEGIN SOLUTION hint="stop ids where the state accepts; non-empty tokens whose whole walk is not DEAD"
    stops, accepting = set(stop_ids), state in dfa.accepting
    out = []
    for i, data in enumerate(vocab):
        if i in stops:
            if accepting:
                out.append(i)
        elif data and walk(dfa, state, data) != DEAD:
            out.append(i)
    return out
    # END SOLUTION


def pack_row(allowed: list[int], vocab_size: int) -> torch.Tensor:
    # BEGIN SOLUTION hint="bit t % 32 of word t // 32 for each allowed t; words >= 1 << 31 wrap to negative int32"
    words = [0] * bitmask_words(vocab_size)
    for t in allowed:
        if not 0 <= t < vocab_size:
            raise ValueError(f"token {t} is outside the vocabulary [0, {vocab_size})")
        words[t // 32] |= 1 << (t % 32)
    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)
    # END SOLUTION


class Compiled:
    """A compiled regex: its DFA, and the packed rows of the states seen so far (state -> row)."""

    def __init__(self, dfa: DFA):
        self.dfa = dfa
        self.rows: dict[int, torch.Tensor] = {}


class LabMatcher(Matcher):
    def __init__(self, backend: LabGrammarBackend, compiled: Compiled):
        self.backend, self.compiled = backend, compiled
        self.state, self.terminated = compiled.dfa.start, False

    def accept_token(self, token_id: int) -> bool:
        # BEGIN SOLUTION hint="stop id: terminate if the state accepts; text: walk all its bytes, refuse DEAD unchanged"
        backend, dfa = self.backend, self.compiled.dfa
        if self.terminated:
            return False
        if token_id in backend.stop_ids:
            self.terminated = self.state in dfa.accepting
            return self.terminated
        data = backend.vocab[token_id] if 0 <= token_id < len(backend.vocab) else None
        nxt = walk(dfa, self.state, data) if data else DEAD
        if nxt == DEAD:
            return False
        self.state = nxt
        return True
        # END SOLUTION

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        # BEGIN SOLUTION hint="copy backend.row(compiled, state) over the whole row of the bitmask"
        bitmask[row] = self.backend.row(self.compiled, self.state)
        # END SOLUTION

    def is_terminated(self) -> bool:
        return self.terminated


class LabGrammarBackend(GrammarBackend):
    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: list[int]):
        super().__init__(tokenizer, vocab_size, stop_ids)
        self.vocab = token_bytes(tokenizer)
        # BEGIN SOLUTION hint="ValueError if vocab_size < len(self.vocab), or if a stop id is outside [0, vocab_size)"
        if vocab_size < len(self.vocab):
            raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {len(self.vocab)} tokens")
        if any(not 0 <= s < vocab_size for s in self.stop_ids):
            raise ValueError(f"a stop id outside [0, {vocab_size}): {self.stop_ids}")
        # END SOLUTION

    def compile(self, kind: str, text: str) -> Compiled:
        # BEGIN SOLUTION hint="regex: Compiled(compile_regex(text)); any other kind: GrammarError"
        if kind != "regex":
            raise GrammarError(f"lab 14's backend compiles regexes only, not {kind}")
        return Compiled(compile_regex(text))
        # END SOLUTION

    def matcher(self, compiled: Compiled) -> LabMatcher:
        return LabMatcher(self, compiled)

    def row(self, compiled: Compiled, state: int) -> torch.Tensor:
        # BEGIN SOLUTION hint="pack_row(allowed_tokens(...), self.vocab_size), computed once per state in compiled.rows"
        if state not in compiled.rows:
            allowed = allowed_tokens(compiled.dfa, state, self.vocab, self.stop_ids)
            compiled.rows[state] = pack_row(allowed, self.vocab_size)
        return compiled.rows[state]
        # END SOLUTION
