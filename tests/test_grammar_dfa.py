"""The regex -> byte DFA compiler (``minisgl/grammar/regex_dfa.py``) against Python's ``re`` on random
strings, and the ``dfa`` grammar backend's masks against xgrammar's on the embedded tokenizer (lab 14's
reference, lesson 14's backend)."""

from __future__ import annotations

import random
import re

import pytest
import torch

from minisgl.grammar.base import GrammarError, bitmask_words
from minisgl.grammar.regex_dfa import DEAD, compile_regex

PATTERNS = [
    r"\d{3}-\d{4}",
    r"(yes|no)",
    r"[A-Z][a-z]{2,8} [A-Z][a-z]{2,8}",
    r"a*b+c?",
    r"(ab|a)*",
    r"[^a-c]x",
    r".{2}",
    r"é+|ü",
    r"\w+@\w+\.com",
    r"(?:a|bc){1,3}d",
    r"x{2,}",
    r"^\s\S\D$",
]
ALPHABET = "abcdxyz0123-é ü@.#ABCcomfn\t"


def full(dfa, text: str) -> bool:
    state = dfa.start
    for b in text.encode():
        state = dfa.table[state][b]
        if state == DEAD:
            return False
    return state in dfa.accepting


@pytest.mark.parametrize("pattern", PATTERNS)
def test_dfa_matches_like_re(pattern):
    dfa = compile_regex(pattern)
    rng = random.Random(pattern)
    ascii_only = not any(s in pattern for s in (".", "[^", r"\S", r"\D"))  # these admit any non-ASCII character
    for _ in range(2000):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 8)))
        want = bool(re.fullmatch(pattern, text, re.ASCII if ascii_only else 0))
        assert full(dfa, text) == want, (pattern, text)


@pytest.mark.parametrize("bad", ["[a-", "(ab", "a**?", r"\p", "(?=a)", "*a"])
def test_unsupported_or_broken_regexes_are_refused(bad):
    with pytest.raises(GrammarError, match="invalid regex"):
        compile_regex(bad)


def test_dfa_backend_masks_equal_xgrammars():
    from transformers import AutoTokenizer

    from autograder.models import tiny_model
    from minisgl.grammar.dfa_backend import DFABackend
    from minisgl.grammar.xgrammar_backend import XGrammarBackend

    tok = AutoTokenizer.from_pretrained(tiny_model("llama"))
    vocab = len(tok) + 32  # a padded LM head: its ids are never allowed (xgrammar leaves the last word's tail set)
    ours, theirs = DFABackend(tok, vocab, [2]), XGrammarBackend(tok, vocab, [2])
    rng = random.Random(0)
    for rx in [r"\d{3}-\d{4}", r"[A-Z][a-z]{2,8} [A-Z][a-z]{2,8}", r"#[0-9a-f]{6}", r"(é|ü){2}\.", r"[a-z ]{1,20}"]:
        m1, m2 = ours.matcher(ours.compile("regex", rx)), theirs.matcher(theirs.compile("regex", rx))
        for _ in range(8):
            if m1.is_terminated():
                break
            rows = torch.zeros(2, bitmask_words(vocab), dtype=torch.int32)
            m1.fill_bitmask(rows, 0)
            m2.fill_bitmask(rows, 1)
            bits = ((rows[:, :, None] >> torch.arange(32)) & 1).flatten(1)[:, :vocab].bool()
            assert torch.equal(bits[0], bits[1]), (rx, (bits[0] ^ bits[1]).nonzero().flatten()[:8].tolist())
            allowed = bits[0].nonzero().flatten().tolist()
            if not allowed:
                break
            t = rng.choice(allowed)
            assert m1.accept_token(t) and m2.accept_token(t)
            assert m1.is_terminated() == m2.is_terminated()
