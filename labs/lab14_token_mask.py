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
    raise NotImplementedError("Lab 14: map each vocabulary token's characters through BYTE_DECODER; special added tokens are None")


def walk(dfa: DFA, state: int, data: bytes) -> int:
    raise NotImplementedError("Lab 14: step the DFA over every byte of data; return DEAD as soon as a step is DEAD")


def allowed_tokens(dfa: DFA, state: int, vocab: list[bytes | None], stop_ids: list[int]) -> list[int]:
    raise NotImplementedError("Lab 14: stop ids where the state accepts; non-empty tokens whose whole walk is not DEAD")


def pack_row(allowed: list[int], vocab_size: int) -> torch.Tensor:
    raise NotImplementedError("Lab 14: bit t % 32 of word t // 32 for each allowed t; words >= 1 << 31 wrap to negative int32")


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
        raise NotImplementedError("Lab 14: stop id: terminate if the state accepts; text: walk all its bytes, refuse DEAD unchanged")

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        raise NotImplementedError("Lab 14: copy backend.row(compiled, state) over the whole row of the bitmask")

    def is_terminated(self) -> bool:
        return self.terminated


class LabGrammarBackend(GrammarBackend):
    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: list[int]):
        super().__init__(tokenizer, vocab_size, stop_ids)
        self.vocab = token_bytes(tokenizer)
        raise NotImplementedError("Lab 14: ValueError if vocab_size < len(self.vocab), or if a stop id is outside [0, vocab_size)")

    def compile(self, kind: str, text: str) -> Compiled:
        raise NotImplementedError("Lab 14: regex: Compiled(compile_regex(text)); any other kind: GrammarError")

    def matcher(self, compiled: Compiled) -> LabMatcher:
        return LabMatcher(self, compiled)

    def row(self, compiled: Compiled, state: int) -> torch.Tensor:
        raise NotImplementedError("Lab 14: pack_row(allowed_tokens(...), self.vocab_size), computed once per state in compiled.rows")
