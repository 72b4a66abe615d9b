"""Lab 14, hidden tests: added tokens that are not special (their text's UTF-8), vocabulary sizes on
and just past a word boundary, and every state of regexes with negated classes and non-ASCII
characters on the real vocabulary. Each calls the lab first, so a stub fails at once with its hint."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from autograder.adapters import lab14 as lab
from autograder.points import points
from autograder.test_lab14_token_mask import (
    SMALL,
    STOP,
    FakeTokenizer,
    _pair,
    _row,
    bits,
    expect_allowed,
    real_tokenizer,
    warm_before_fork,  # noqa: F401  (the grader's hook: the tokenizer, loaded once before forking)
)
from minisgl.grammar.base import bitmask_words
from minisgl.grammar.regex_dfa import compile_regex


@points(3)
def test_token_bytes_added_tokens_not_special():
    """An added token that is not special is text, even when its characters are GPT-2's alphabet: "Ġcafé"
    is its UTF-8 (b"\\xc4\\xa0caf\\xc3\\xa9"), not b" caf\\xe9" (the vocabulary's spelling read back)."""
    tok = FakeTokenizer([b"a", "<s>", b"b"])
    tok.vocab["Ġcafé"] = 3
    tok.added_tokens_decoder[3] = SimpleNamespace(content="Ġcafé", special=False)
    got = lab.token_bytes(tok)
    want = [b"a", None, b"b", "Ġcafé".encode()]
    assert got == want, (
        f"token_bytes = {got}, expected {want}: an added token whose special is False is plain text, its UTF-8, "
        "whatever its characters (only the vocabulary's own tokens spell bytes with GPT-2's alphabet)"
    )


@points(3)
def test_padded_vocab_word_boundaries():
    """vocab_size exactly one word (32), one id into the next word (33), and 63/64: the padded ids are
    never allowed and the row has bitmask_words(vocab_size) words."""
    tok = FakeTokenizer(SMALL)
    for size in (32, 33, 63, 64):
        _, mine, ref = _pair(tok, size, STOP, r"\d+-\d")
        assert mine.accept_token(3) and ref.accept_token(3)
        got, want = _row(mine, size, -1), _row(ref, size, -1)
        assert torch.equal(got, want), (
            f"vocab_size {size} ({bitmask_words(size)} words): the row allows {bits(got, 32 * bitmask_words(size))}, "
            f"expected {bits(want, 32 * bitmask_words(size))}: ids from len(tokenizer) = {len(SMALL)} on are padding"
        )


@points(4)
def test_every_state_of_unicode_regexes(tiny_llama):
    """Every state of regexes with negated classes, '.', and non-ASCII characters, on the real vocabulary."""
    lab.walk(compile_regex("a"), 0, b"a")  # a stub fails here, before the tokenizer loads
    tok = real_tokenizer(tiny_llama)
    vocab = lab.token_bytes(tok)
    for regex in [r"[^0-9 ]{2}é\d", r"ü.ß?", r"(ça|va)+!"]:
        dfa = compile_regex(regex)
        for state in range(dfa.num_states):
            expect_allowed(dfa, state, vocab, [2, 0], f"the real vocabulary, {regex!r}")
