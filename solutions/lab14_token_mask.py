"""Lab 14: constrained decoding's token mask, from a DFA over bytes.

A regex constrains *characters*; the model picks *tokens*, each a string of bytes that may span
several DFA states, stop in the middle of a UTF-8 character, or be no text at all. You write the
token-level part of a grammar backend for regexes: which tokens may come next in each DFA state, as
the packed bitmask the engine applies to the logits, and the matcher that follows one request. It
plugs into the engine through the seam of ``minisgl/grammar/base.py`` (read it first: the layout of
the bitmask and the ``Matcher`` contract are there): the grader registers ``LabGrammarBackend`` in
``GRAMMAR_BACKENDS`` as ``"lab14"`` and runs the engine with ``components={"grammar": "lab14"}``. The
engine's own backends are off limits (a lab that derives from, calls or aliases
``minisgl.grammar.dfa_backend``, xgrammar's backend or ``pack_bitmask`` scores 0)::

    regex "\\d+-\\d"      DFA (bytes)   start -[0-9]-> D -[0-9]-> D -[-]-> M -[0-9]-> END (accepting)
    after "1":    "12" allowed (it stays among the digits)   "4-" allowed (a token spans states)
                  "1a" refused (it dies at "a", although "1" alone was fine)
                  EOS refused (not accepting yet)   "" refused   <|im_start|> refused (special)
    after "1-2":  only EOS

Provided, and yours to use: ``compile_regex(text) -> DFA`` and ``DEAD`` (``minisgl/grammar/
regex_dfa.py``: the course's own regex -> DFA compiler for a regex subset, over UTF-8 *bytes*; not the
PyPI ``interegular``, whose automata read characters). A ``DFA`` has ``start``, ``accepting`` (a set of
states), ``num_states``, ``table`` (one row of 256 next states per state) and ``step`` (one byte from a
live state; the result is a state or ``DEAD``, and nothing may be stepped from ``DEAD``). Also
provided: ``BYTE_DECODER`` (GPT-2's byte-level alphabet, read backwards: ``BYTE_DECODER["Ġ"] == 0x20``),
``bitmask_words`` (words per row) and the ``Compiled`` holder (a DFA and its cache of rows).

Contract (the grader compares every result with the engine's ``minisgl/grammar/dfa_backend.py``):

* ``token_bytes(tokenizer)``: a list with one entry per token id of the tokenizer (``len(tokenizer)``
  of them), the bytes that token writes. A byte-level vocabulary (``tokenizer.get_vocab()``: text ->
  id) spells each byte with one printable character: ``"Ġthe"`` writes ``b" the"``, ``"Ċ"`` a newline,
  ``"Ã"`` the lone byte 0xC3 (half of a UTF-8 character). An added token
  (``tokenizer.added_tokens_decoder``: id -> ``AddedToken``) marked ``special`` writes no text and is
  ``None`` (``<|im_end|>``, but also ``<repo_name>``: ``tokenizer.all_special_ids`` lists only three of
  the embedded tokenizer's 17 special tokens); an added token that is not special writes its text
  as UTF-8 (``"café"`` -> ``b"caf\\xc3\\xa9"``).
* ``walk(dfa, state, data)``: the state the DFA is in after reading every byte of ``data`` from the
  live ``state``, or ``DEAD`` if any byte is refused on the way (nothing revives it: under ``\\d+``,
  ``b"1a2"`` is ``DEAD``). ``walk(dfa, s, b"") == s``.
* ``allowed_tokens(dfa, state, vocab, stop_ids)``: the ids of ``vocab`` that may come next in the
  live ``state``, in ascending order, each once. A stop id is allowed exactly when ``state`` is
  accepting, and is never judged by its bytes. Any other id is allowed exactly when it writes at
  least one byte and the DFA survives all of them. ``None`` (special) and ``b""`` (it would leave the
  state as it is, and the output would never advance) are never allowed.
  Example, regex ``\\d+-\\d``, stop id 0, ``vocab = [None, b"", b"1", b"12", b"12a", b"-", b"4-",
  b"-5", b"a"]``: after ``"1"`` -> ``[2, 3, 5, 6, 7]``; after ``"1-2"`` -> ``[0]``; at the start ->
  ``[2, 3, 6]``.
* ``pack_row(allowed, vocab_size)``: one row of the packed bitmask (``base.py``'s layout) as an
  int32 tensor of ``bitmask_words(vocab_size)`` words, with exactly the ids of ``allowed`` set: every
  other bit, also past ``vocab_size`` in the last word, is 0. A word whose top bit is set is negative
  (int32 is two's complement). ``ValueError`` for an id outside ``[0, vocab_size)``. Examples:
  ``pack_row([0, 31, 33], 40)`` -> ``tensor([-2147483647, 2], dtype=torch.int32)``;
  ``pack_row([31], 32)`` -> ``tensor([-2147483648], dtype=torch.int32)``; ``pack_row([], 33)`` -> two
  zero words.
* ``LabGrammarBackend(tokenizer, vocab_size, stop_ids)``: ``vocab_size`` is the model's (its LM head
  may have more rows than the tokenizer has tokens: those ids are never allowed). ``ValueError`` when
  ``vocab_size`` is smaller than the tokenizer's number of tokens (equal is fine), and, checked on its
  own, when any stop id is outside ``[0, vocab_size)``. ``compile("regex", text)`` returns a
  ``Compiled`` holding the DFA of ``text`` (``compile_regex``'s ``GrammarError`` for a bad regex
  passes through); any other kind raises ``GrammarError``. ``row(compiled, state)`` is that state's
  packed row for ``vocab_size`` (the tokens ``allowed_tokens`` gives, called through the module's
  name), computed at most once per compiled regex and state: a state's mask never changes, and a
  scan of the vocabulary costs milliseconds, per step and per request.
* ``LabMatcher`` (``base.py``'s ``Matcher``) starts at the DFA's start state. ``fill_bitmask(bitmask,
  row)`` writes the current state's row over the whole of row ``row`` of ``bitmask`` (the engine's
  bitmask starts all ones; its width is ``bitmask_words(vocab_size)``). ``accept_token(t)`` returns
  True and moves on exactly when ``t`` is in the current row: a text token moves the state by all of
  its bytes, a stop token terminates the matcher (``is_terminated()`` True from then on). Any other
  token returns False and changes nothing; after termination every token is refused.

Pitfalls the grader recognises (its messages name them):

* byte-level tokens: a token's spelling encoded as UTF-8 (``"Ġ"`` is the space byte, not
  ``b"\\xc4\\xa0"``); special tokens taken from ``all_special_ids`` alone (``<repo_name>`` becomes
  text); a non-special added token dropped;
* dead states: a token allowed because a prefix of it was fine; a walk that "revives" after ``DEAD``
  (``DEAD`` is -1, and ``table[-1]`` is the last state's row in Python) because only the final state
  is looked at;
* the empty token allowed; EOS allowed outside accepting states, or never (the request can then not
  stop);
* the bitmask: bits in the wrong order within a word; the top bit overflowing int32 (a word of
  exactly that bit too); a word too many or too few; the row sized by the tokenizer, not the model's
  vocabulary, so the padded LM-head tokens keep the engine's all-ones;
* the matcher: a token that spans states advanced by its first byte only; a refused token that moves
  the state anyway; a stop token accepted without terminating; the state's mask recomputed at every
  step instead of once;
* the checks: ``vocab_size`` equal to the tokenizer's size refused; a stop id out of range accepted.

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
    # BEGIN SOLUTION what="the bytes each token id writes (None for a special added token)" hint="map each character of a vocabulary token through BYTE_DECODER; an added token is None if special, else its text as UTF-8"
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
    # BEGIN SOLUTION what="the state after all the bytes of data, or DEAD" hint="step the DFA byte by byte and return DEAD at the first DEAD step (never step from DEAD)"
    for b in data:
        nxt = dfa.step(state, b)
        if nxt == DEAD:
            return DEAD
        state = nxt
    return state
    # END SOLUTION


def allowed_tokens(dfa: DFA, state: int, vocab: list[bytes | None], stop_ids: list[int]) -> list[int]:
    # BEGIN SOLUTION what="the ids allowed next in a state, ascending" hint="a stop id where the state accepts; any other id with non-empty bytes whose whole walk is not DEAD"
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
    # BEGIN SOLUTION what="the packed int32 row with exactly the allowed ids set" hint="token t is bit t % 32 (the lowest first) of word t // 32; a word >= 1 << 31 stands for word - (1 << 32) in int32"
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
        # BEGIN SOLUTION what="the matcher's own state at the start (where it is in the DFA, and whether it has ended)" hint="the DFA's start state, and a flag that accept_token sets on a stop token"
        self.state, self.terminated = compiled.dfa.start, False
        # END SOLUTION

    def accept_token(self, token_id: int) -> bool:
        # BEGIN SOLUTION what="move on by a token the current row allows, refuse any other and change nothing" hint="after termination refuse all; a stop id terminates where the state accepts; a text token walks all its bytes, and a DEAD walk changes nothing"
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
        # BEGIN SOLUTION what="the current state's row written over the whole bitmask row" hint="assign backend.row(compiled, state) to bitmask[row]"
        bitmask[row] = self.backend.row(self.compiled, self.state)
        # END SOLUTION

    def is_terminated(self) -> bool:
        # BEGIN SOLUTION what="whether a stop token was accepted" hint="the flag accept_token sets"
        return self.terminated
        # END SOLUTION


class LabGrammarBackend(GrammarBackend):
    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: list[int]):
        super().__init__(tokenizer, vocab_size, stop_ids)
        self.vocab = token_bytes(tokenizer)
        # BEGIN SOLUTION what="the checks of vocab_size and of the stop ids" hint="ValueError when vocab_size is below the number of tokens; ValueError when any stop id is outside [0, vocab_size)"
        if vocab_size < len(self.vocab):
            raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {len(self.vocab)} tokens")
        if any(not 0 <= s < vocab_size for s in self.stop_ids):
            raise ValueError(f"a stop id outside [0, {vocab_size}): {self.stop_ids}")
        # END SOLUTION

    def compile(self, kind: str, text: str) -> Compiled:
        # BEGIN SOLUTION what="the compiled regex, and GrammarError for any other kind" hint="wrap compile_regex(text) in a Compiled for kind 'regex'"
        if kind != "regex":
            raise GrammarError(f"lab 14's backend compiles regexes only, not {kind}")
        return Compiled(compile_regex(text))
        # END SOLUTION

    def matcher(self, compiled: Compiled) -> LabMatcher:
        return LabMatcher(self, compiled)

    def row(self, compiled: Compiled, state: int) -> torch.Tensor:
        # BEGIN SOLUTION what="a state's packed row for the model's vocabulary, computed once per compiled regex and state" hint="pack_row of allowed_tokens(...) at self.vocab_size, kept in compiled.rows by state"
        if state not in compiled.rows:
            allowed = allowed_tokens(compiled.dfa, state, self.vocab, self.stop_ids)
            compiled.rows[state] = pack_row(allowed, self.vocab_size)
        return compiled.rows[state]
        # END SOLUTION
