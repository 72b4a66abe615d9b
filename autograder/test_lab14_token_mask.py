"""Lab 14 (constrained decoding's token mask): each function on hand-made vocabularies and on the
embedded tokenizer against the engine's DFA backend (``minisgl/grammar/dfa_backend.py``), random
regexes, then the engine generating under regexes with your backend. Run: ``python -m autograder lab14``."""

from __future__ import annotations

import functools
import random
import re
from types import SimpleNamespace

import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from autograder.adapters import lab14 as lab
from autograder.engine_runs import engine_failure
from autograder.points import engine, points
from minisgl.grammar.base import GrammarError, bitmask_words, pack_bitmask
from minisgl.grammar.dfa_backend import DFABackend, vocab_bytes
from minisgl.grammar.dfa_backend import walk as ref_walk
from minisgl.grammar.regex_dfa import BYTE_DECODER, DEAD, compile_regex

_ENCODE = {b: c for c, b in BYTE_DECODER.items()}  # a byte -> the character a byte-level vocabulary spells it with


class FakeTokenizer:
    """What ``token_bytes`` reads of a byte-level tokenizer: ``get_vocab()``, ``len()`` and
    ``added_tokens_decoder`` (and ``all_special_ids``, which lists token 0 only, as HF's lists only some).
    ``tokens``: bytes for a vocabulary token, a str for a special added token."""

    def __init__(self, tokens: list[bytes | str]):
        self.vocab, self.added_tokens_decoder = {}, {}
        self.all_special_ids = [0]  # as in HF, not every special added token is listed here
        for i, t in enumerate(tokens):
            if isinstance(t, str):
                self.vocab[t] = i
                self.added_tokens_decoder[i] = SimpleNamespace(content=t, special=True)
            else:
                self.vocab["".join(_ENCODE[b] for b in t)] = i

    def __len__(self) -> int:
        return len(self.vocab)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)


# a hand-made vocabulary: every kind of token the contract names (regex r"\d+-\d" in the comments)
SMALL = [
    "<eos>",  # 0: the stop token (special)
    "<pad>",  # 1: special, never allowed
    b"",  # 2: the empty token, never allowed
    b"1",  # 3
    b"12",  # 4
    b"12a",  # 5: its prefix "12" is fine, then DEAD
    b"1a2",  # 6: DEAD in the middle
    b"-",  # 7
    b"4-",  # 8: spans two states (digits, then the dash)
    b"-5",  # 9: the dash and the last digit: reaches the accepting state
    b"a",  # 10
    b"\xc3",  # 11: the first byte of "é"
    b"\xa9",  # 12: its second byte
    b"\xc3\xa9",  # 13: "é"
    b" ",  # 14
    b"9-9",  # 15: a whole match from the start
]
SMALL_BYTES = [None, None, *SMALL[2:]]
STOP = [0]


def small_tokenizer() -> FakeTokenizer:
    return FakeTokenizer(SMALL)


@functools.cache
def real_tokenizer(model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def warm_before_fork():
    """The grader's parent process loads the tokenizer once, not every test's child (~3 s each)."""
    from autograder.models import tiny_model

    real_tokenizer(tiny_model("llama"))


def describe(vocab, i: int) -> str:
    data = vocab[i] if i < len(vocab) else "past the tokenizer"
    return f"{i} ({data!r})"


def why(dfa, state: int, vocab, stop_ids, i: int, allowed: bool) -> str:
    """The pitfall behind a token wrongly allowed (``allowed``) or wrongly refused."""
    data = vocab[i] if i < len(vocab) else None
    accepting = state in dfa.accepting
    if i in stop_ids:
        return (
            "EOS is allowed only in accepting states: the output is not a whole match yet"
            if allowed
            else "EOS must be allowed where the state is accepting (else the request can never stop)"
        )
    if data is None:
        return "a special token (None) is never allowed" if allowed else "?"
    if data == b"":
        return "the empty token is never allowed: it would leave the state as it is, and the output never advances"
    if allowed:
        state_after, prefix = state, 0
        for b in data:
            nxt = dfa.table[state_after][b]
            if nxt == DEAD:
                break
            state_after, prefix = nxt, prefix + 1
        if prefix and prefix < len(data):
            return (
                f"its first {prefix} byte(s) are fine, then byte {data[prefix]!r} is DEAD: a token whose walk reaches "
                "DEAD is refused although a prefix of it was fine, and a later byte never brings it back "
                "(DEAD = -1 indexes the last row of dfa.table in Python)"
            )
        return "its walk reaches DEAD"
    return f"its walk over all its bytes stays alive (the state {'is' if accepting else 'is not'} accepting)"


def expect_allowed(dfa, state: int, vocab, stop_ids, what: str) -> None:
    want = DFABackend(None, len(vocab), stop_ids, vocab=vocab).allowed(_compiled(dfa), state).nonzero().flatten()
    want = want.tolist()
    got = lab.allowed_tokens(dfa, state, vocab, stop_ids)
    got = got.tolist() if isinstance(got, torch.Tensor) else list(got)
    if got == want:
        return
    extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
    lines = [f"allowed_tokens({what}, state {state}) = {got}, expected {want}"]
    for i in extra[:3]:
        lines.append(
            f"  token {describe(vocab, i)} is allowed but must not be: {why(dfa, state, vocab, stop_ids, i, True)}"
        )
    for i in missing[:3]:
        lines.append(f"  token {describe(vocab, i)} is missing: {why(dfa, state, vocab, stop_ids, i, False)}")
    if not extra and not missing:
        lines.append("  the same ids, but not once each in ascending order")
    raise AssertionError("\n".join(lines))


def _compiled(dfa):
    from minisgl.grammar.dfa_backend import _Compiled

    return _Compiled(dfa)


def bits(row: torch.Tensor, vocab_size: int) -> list[int]:
    shifts = torch.arange(32, dtype=torch.int32)
    return ((row[:, None] >> shifts) & 1).flatten()[:vocab_size].nonzero().flatten().tolist()


# ---- tokens as bytes -----------------------------------------------------------------------------------
@points(6)
def test_token_bytes_byte_level(tiny_llama):
    """Each token's bytes through GPT-2's byte alphabet: "Ġthe" is b" the", "Ċ" a newline, "Ã" the lone
    byte 0xC3 (half of a UTF-8 character)."""
    lab.token_bytes(small_tokenizer())  # a stub fails here, before the tokenizer loads
    tok = real_tokenizer(tiny_llama)
    got = lab.token_bytes(tok)
    assert isinstance(got, list) and len(got) == len(tok), (
        f"token_bytes returned {type(got).__name__} of length {len(got)}; expected a list of len(tokenizer) = "
        f"{len(tok)} entries (one per token id)"
    )
    vocab = tok.get_vocab()
    for text, want in [("Ġthe", b" the"), ("Ċ", b"\n"), ("Ã", b"\xc3"), ("!", b"!"), ("ĠĠ", b"  ")]:
        i = vocab[text]
        assert got[i] == want, (
            f"token {i} ({text!r}) -> {got[i]!r}, expected {want!r}: a byte-level vocabulary spells each byte with "
            "one printable character; map every character through BYTE_DECODER (BYTE_DECODER['Ġ'] == 0x20), do not "
            "encode the text as UTF-8"
        )
    assert all(b is None or isinstance(b, bytes) for b in got), "every entry is bytes or None"


@points(5)
def test_token_bytes_special_tokens(tiny_llama):
    """Every added token marked special is None (all 17 of the embedded tokenizer, not only the 3 of
    all_special_ids); an added token that is not special is its text's UTF-8; the rest are bytes."""
    plain = FakeTokenizer([b"a", "<s>", b"b"])
    plain.vocab["café"] = 3
    plain.added_tokens_decoder[3] = SimpleNamespace(content="café", special=False)
    got = lab.token_bytes(plain)  # a stub fails here, before the tokenizer loads
    want = [b"a", None, b"b", "café".encode()]
    if got != want:
        what = f"token_bytes of [b'a', special '<s>', b'b', added 'café' (not special)] = {got}, expected {want}"
        if isinstance(got, list) and len(got) == 4 and got[1] is not None:
            raise AssertionError(
                f"{what}: token 1 ('<s>') is a special added token (added_tokens_decoder[1].special), so None; "
                f"tokenizer.all_special_ids lists only {plain.all_special_ids}, not every special token"
            )
        raise AssertionError(
            f"{what}: an added token that is not special writes its text as UTF-8 (not GPT-2's alphabet, where 'é' "
            "would be the lone byte 0xE9); only special added tokens are None"
        )
    tok = real_tokenizer(tiny_llama)
    got = lab.token_bytes(tok)
    for i, added in sorted(tok.added_tokens_decoder.items()):
        assert got[i] is None, (
            f"token {i} ({added.content!r}) -> {got[i]!r}: it is a special added token "
            f"(tokenizer.added_tokens_decoder[{i}].special), so None; tokenizer.all_special_ids lists only "
            f"{sorted(tok.all_special_ids)}, not every special token"
        )
    assert got[17] == b"!" and sum(b is None for b in got) == len(tok.added_tokens_decoder), (
        f"{sum(b is None for b in got)} tokens are None; only the {len(tok.added_tokens_decoder)} special ones are"
    )


# ---- walking the DFA ---------------------------------------------------------------------------------------
@points(4)
def test_walk_spans_states():
    """A token's bytes may cross several states, and stop inside a UTF-8 character."""
    dfa = compile_regex(r"\d+-\d")
    for state, data in [(0, b"4-"), (0, b"12-3"), (ref_walk(dfa, 0, b"1"), b"-5"), (0, b"1")]:
        got, want = lab.walk(dfa, state, data), ref_walk(dfa, state, data)
        assert got == want, (
            f"walk(dfa of r'\\d+-\\d', {state}, {data!r}) = {got}, expected {want}: step the DFA over all of "
            "the token's bytes, one by one"
        )
    dfa = compile_regex("(é|a)+")
    half = lab.walk(dfa, 0, b"\xc3")
    assert half == ref_walk(dfa, 0, b"\xc3") and half != DEAD, (
        f"walk(dfa of '(é|a)+', 0, b'\\xc3') = {half}: the first byte of 'é' leads to a live state (the DFA reads "
        "UTF-8 bytes: a token may end inside a character)"
    )
    tail = b"\xa9a"
    got = lab.walk(dfa, half, tail)
    assert got == ref_walk(dfa, half, tail) and got in dfa.accepting, (
        f"walk from the middle of 'é' over b'\\xa9a' = {got}, expected the accepting state {ref_walk(dfa, half, tail)}"
    )


@points(6)
def test_walk_through_dead_state():
    """DEAD is final: a token whose walk reaches it is refused, whatever came before or after."""
    dfa = compile_regex(r"\d+")
    got = lab.walk(dfa, 0, b"12a")
    assert got == DEAD, (
        f"walk(dfa of r'\\d+', 0, b'12a') = {got}, expected DEAD ({DEAD}): its first 2 bytes are fine, then 'a' is "
        "DEAD: the token is refused although a prefix of it was fine (return DEAD, not the state before it)"
    )
    got = lab.walk(dfa, 0, b"1a2")
    assert got == DEAD, (
        f"walk(dfa of r'\\d+', 0, b'1a2') = {got}, expected DEAD ({DEAD}): 'a' is DEAD, and a later byte never "
        "brings it back (DEAD = -1 indexes the last row of dfa.table in Python: check every byte's step, not "
        "only the final state)"
    )


# ---- the mask of a state ------------------------------------------------------------------------------
@points(6)
def test_allowed_tokens_fixed():
    """The hand-made vocabulary in every state of r"\\d+-\\d": tokens that span states, die midway, are
    empty, special, or stop."""
    dfa = compile_regex(r"\d+-\d")
    states = [0, ref_walk(dfa, 0, b"1"), ref_walk(dfa, 0, b"1-"), ref_walk(dfa, 0, b"1-2")]
    for state in states:
        expect_allowed(dfa, state, SMALL_BYTES, STOP, "SMALL vocabulary, r'\\d+-\\d'")
    dfa = compile_regex("(é|a)+")
    for state in range(dfa.num_states):
        expect_allowed(dfa, state, SMALL_BYTES, STOP, "SMALL vocabulary, '(é|a)+'")


@points(5)
def test_eos_only_in_accepting_states():
    """A stop id is allowed exactly where the state accepts (two stop ids, one of them with bytes)."""
    dfa = compile_regex(r"\d+")
    vocab, stops = [b"1", b"x", b"2", b"12"], [1, 2]  # stop ids 1 and 2: a stop id is never a text token
    for state, want in [(0, [0, 3]), (1, [0, 1, 2, 3])]:
        got = lab.allowed_tokens(dfa, state, vocab, stops)
        got = got.tolist() if isinstance(got, torch.Tensor) else list(got)
        if got != want:
            wrong = sorted(set(got) ^ set(want))
            if not wrong:
                raise AssertionError(
                    f"allowed_tokens(r'\\d+', state {state}, {vocab}, stop_ids {stops}) = {got}, expected {want}: "
                    "the same ids, but the result lists each allowed id once, in ascending order (stop ids too)"
                )
            raise AssertionError(
                f"allowed_tokens(r'\\d+', state {state} ({'' if state in dfa.accepting else 'not '}accepting), "
                f"{vocab}, stop_ids {stops}) = {got}, expected {want}; "
                + why(dfa, state, vocab, stops, wrong[0], wrong[0] in got)
                + " (a stop id is never a text token, whatever its bytes)"
            )


@points(4)
def test_empty_token_never_allowed():
    """The empty token would leave the state as it is: never allowed, in any state."""
    dfa = compile_regex("a*")
    got = lab.allowed_tokens(dfa, 0, [b"a", b"", b"aa"], [])
    got = got.tolist() if isinstance(got, torch.Tensor) else list(got)
    assert got == [0, 2], (
        f"allowed_tokens('a*', 0, [b'a', b'', b'aa'], []) = {got}, expected [0, 2]: the empty token is never "
        "allowed: it would leave the state as it is, and the output never advances"
    )


# ---- the packed row ------------------------------------------------------------------------------------
def expect_row(allowed: list[int], vocab_size: int) -> None:
    flags = torch.zeros(vocab_size, dtype=torch.bool)
    flags[allowed] = True
    want = pack_bitmask(flags)
    try:
        got = lab.pack_row(list(allowed), vocab_size)
    except NotImplementedError:  # a stub: its own message says what to write (it is a RuntimeError too)
        raise
    except (RuntimeError, OverflowError) as e:
        raise AssertionError(
            f"pack_row({allowed}, {vocab_size}) raised {type(e).__name__}: {e}\nint32 is two's complement: a word "
            "with bit 31 set is negative (a word >= 1 << 31 stands for word - (1 << 32)), and one of exactly 1 << 31 "
            "is -2**31"
        ) from None
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int32 and got.shape == want.shape, (
        f"pack_row({allowed}, {vocab_size}) returned {type(got).__name__} "
        f"{getattr(got, 'dtype', '')} {tuple(getattr(got, 'shape', ()))}; expected int32 of shape {tuple(want.shape)} "
        "(bitmask_words(vocab_size) words)"
    )
    if torch.equal(got, want):
        return
    rev = sorted(32 * (t // 32) + 31 - t % 32 for t in bits(got, bitmask_words(vocab_size) * 32))
    hint = ""
    if rev == sorted(allowed):
        hint = (
            " (the bit order within a word is reversed: token t is bit t % 32 counted from the lowest, 1 << (t % 32))"
        )
    elif all(g == w or w == -(2**31) for g, w in zip(got.tolist(), want.tolist())):
        hint = " (a word of exactly 1 << 31 must wrap to -2**31 too: the test is word >= 1 << 31, not >)"
    raise AssertionError(
        f"pack_row({allowed}, {vocab_size}) sets the bits of tokens {bits(got, bitmask_words(vocab_size) * 32)}{hint}: "
        f"got {got.tolist()}, expected {want.tolist()}; token t is bit t % 32 of word t // 32, the lowest bit first"
    )


@points(6)
def test_pack_row_bit_order():
    """Tokens on both sides of each word's boundary, bit 31 among them (two's complement), a vocabulary
    that ends inside its last word."""
    expect_row([0, 1, 5, 30, 31, 32, 33, 63, 64, 69], 70)
    expect_row([2, 31, 40], 41)
    expect_row([], 33)


@points(4)
def test_pack_row_boundaries():
    """A word of exactly 1 << 31 (only bit 31), a vocabulary of exactly one word, and ids just outside
    [0, vocab_size)."""
    expect_row([31], 32)
    expect_row([31, 63], 64)
    expect_row([0, 31], 32)
    for bad in (32, -1):
        with pytest.raises(ValueError):
            lab.pack_row([0, bad], 32)
            pytest.fail(f"pack_row([0, {bad}], 32) must raise ValueError: token {bad} is outside [0, 32)")


# ---- the backend and its matcher --------------------------------------------------------------------------
@points(3)
def test_backend_input_checks():
    """vocab_size == len(tokenizer) is fine, one less is not; a stop id outside [0, vocab_size) is refused
    on its own; kinds other than regex and bad regexes raise GrammarError."""
    tok = small_tokenizer()
    n = len(tok)
    try:
        backend = lab.make_backend(tok, n, [0])
    except ValueError as e:
        raise AssertionError(
            f"LabGrammarBackend(tokenizer of {n} tokens, vocab_size={n}, [0]) raised ValueError ({e}): "
            "vocab_size == len(tokenizer) is allowed (only a smaller vocab_size is refused)"
        ) from None
    lab.make_backend(tok, n + 5, [n + 4])  # a stop id in the padded part is inside [0, vocab_size)
    with pytest.raises(ValueError):
        lab.make_backend(tok, n - 1, [0])
        pytest.fail(f"vocab_size={n - 1} < len(tokenizer) = {n} must raise ValueError")
    for stops in ([n], [0, -1]):
        with pytest.raises(ValueError):
            lab.make_backend(tok, n, stops)
            pytest.fail(
                f"stop_ids={stops} with vocab_size={n} must raise ValueError: a stop id outside [0, vocab_size) "
                "(checked on its own, the vocab_size being fine)"
            )
    for kind, text in [("json_schema", "{}"), ("ebnf", 'root ::= "a"'), ("regex", "[a-"), ("regex", "(ab")]:
        with pytest.raises(GrammarError):
            backend.compile(kind, text)
            pytest.fail(f"compile({kind!r}, {text!r}) must raise GrammarError")


def _pair(tok, vocab_size: int, stops: list[int], regex: str):
    mine = lab.make_backend(tok, vocab_size, stops)
    ref = DFABackend(tok, vocab_size, stops)
    mine_c, ref_c = mine.compile("regex", regex), ref.compile("regex", regex)
    return mine, mine.matcher(mine_c), ref.matcher(ref_c)


def _row(matcher, vocab_size: int, fill: int = 0) -> torch.Tensor:
    bitmask = torch.full((3, bitmask_words(vocab_size)), fill, dtype=torch.int32)
    matcher.fill_bitmask(bitmask, 1)
    return bitmask[1]


def expect_same_row(mine, ref, vocab_size: int, after: str, fill: int = -1) -> None:
    got, want = _row(mine, vocab_size, fill), _row(ref, vocab_size, fill)
    if torch.equal(got, want):
        return
    g, w = bits(got, bitmask_words(vocab_size) * 32), bits(want, bitmask_words(vocab_size) * 32)
    past = [t for t in g if t >= len(ref.backend.vocab)]
    hint = (
        f"; tokens {past[:5]} are past the tokenizer's {len(ref.backend.vocab)} tokens (the padded LM head): "
        "fill_bitmask must overwrite the whole row, bitmask_words(vocab_size) words (the engine's row starts all ones)"
        if past
        else ""
    )
    raise AssertionError(f"after {after}: the row allows tokens {g[:12]}, expected {w[:12]}{hint}")


@points(6)
def test_matcher_spans_states():
    """accept_token advances by all of a token's bytes: "4-" crosses two states, "\\xc3" stops inside "é"."""
    tok = small_tokenizer()
    n = len(tok)
    for regex, tokens in [(r"\d+-\d", [8, 3]), (r"\d+-\d", [4, 9]), ("(é|a)+", [11, 12, 10, 13])]:
        _, mine, ref = _pair(tok, n, STOP, regex)
        done = []
        for t in tokens:
            ok = mine.accept_token(t)
            assert ref.accept_token(t) and ok is True, (
                f"{regex!r}: accept_token({t}) after {done} returned {ok}, expected True"
            )
            done.append(t)
            got, want = bits(_row(mine, n), n), bits(_row(ref, n), n)
            assert got == want, (
                f"{regex!r}: after accepting tokens {[SMALL[i] for i in done]}, the row allows {got}, expected {want}: "
                "accept_token must advance the state by all of the token's bytes (a token spans states)"
            )


@points(5)
def test_matcher_refuses_and_changes_nothing():
    """A token the row does not allow (dead midway, empty, special, past the tokenizer, EOS too early)
    returns False and changes nothing."""
    tok = small_tokenizer()
    n = len(tok)
    _, mine, ref = _pair(tok, n + 8, STOP, r"\d+-\d")
    ok = mine.accept_token(3)
    assert ref.accept_token(3) and ok is True, (
        f"accept_token(3) (b'1') at the start of r'\\d+-\\d' returned {ok}, expected True: a digit is allowed there"
    )
    before = bits(_row(ref, n + 8), n + 8)
    for bad in (5, 6, 2, 1, 10, n + 3, 0):
        ok = mine.accept_token(bad)
        assert ok is False, (
            f"accept_token({bad}) = {ok} after b'1' in r'\\d+-\\d': token {describe(SMALL_BYTES, bad)} is not allowed"
        )
        got = bits(_row(mine, n + 8), n + 8)
        assert got == before, (
            f"a refused accept_token({bad}) changed the row from {before} to {got}: a refused token changes nothing "
            "(check the walk before you move the state)"
        )
    ok = mine.accept_token(7)
    assert ok is True, (
        f"after refusing {(5, 6, 2, 1, 10, n + 3, 0)}, accept_token(7) (b'-') returned {ok}, expected True: the "
        "matcher must still be where b'1' left it (a refused token changes nothing, so the dash is allowed next)"
    )
    assert not mine.is_terminated(), (
        "is_terminated() is True after refused tokens and a dash: a refused stop token (EOS before the match is "
        "whole) changes nothing, and only an accepted one terminates the matcher"
    )


@points(5)
def test_matcher_terminates():
    """EOS is accepted in an accepting state and terminates the matcher; after that every token is refused."""
    tok = small_tokenizer()
    n = len(tok)
    _, mine, _ = _pair(tok, n, STOP, r"\d+-\d")
    for t in (15,):
        assert mine.accept_token(t)
    assert not mine.is_terminated(), "is_terminated() is True before EOS"
    assert mine.accept_token(0) is True, "EOS after a whole match ('9-9') must be accepted"
    assert mine.is_terminated() is True, (
        "after accepting EOS, is_terminated() must be True (the engine then stops the request)"
    )
    assert mine.accept_token(3) is False and mine.accept_token(0) is False, (
        "a terminated matcher refuses every token (is_terminated() is True from then on)"
    )


@points(5)
def test_fill_bitmask_padded_vocab():
    """With an LM head wider than the tokenizer (vocab_size = len + 40), the padded ids are never allowed:
    the row is written whole over the engine's all-ones."""
    tok = small_tokenizer()
    n = len(tok)
    for regex in (r"\d+-\d", "(é|a)+"):
        _, mine, ref = _pair(tok, n + 40, STOP, regex)
        expect_same_row(mine, ref, n + 40, f"compiling {regex!r} with vocab_size {n + 40} (padded)")
        expect_same_row(mine, ref, n + 40, "the same state again", fill=0)


@points(3)
def test_masks_cached():
    """row(compiled, state) calls allowed_tokens at most once per compiled regex and state."""
    tok = small_tokenizer()
    n = len(tok)
    backend = lab.make_backend(tok, n, STOP)
    compiled = backend.compile("regex", r"\d+-\d")
    with lab.counting_allowed_tokens() as calls:
        for _ in range(3):
            m = backend.matcher(compiled)
            for t in (3, 4, 7, 3, 0):
                _row(m, n)
                m.accept_token(t)
    assert calls, "row() never called allowed_tokens (through the module's name allowed_tokens)"
    twice = sorted({c for c in calls if calls.count(c) > 1})
    assert not twice, (
        f"allowed_tokens was called {len(calls)} times for {len(set(calls))} distinct states (states "
        f"{[s for _, s in twice]} more than once): compute a state's row at most once per compiled regex and "
        "cache it in compiled.rows (a scan of the vocabulary costs milliseconds, per step and per request)"
    )


# ---- random regexes on the real vocabulary ----------------------------------------------------------------
PIECES = ["a", "b", "1", "-", " ", "é", "[a-c]", "[0-9]", r"\d", ".", "[^a ]", "(ab|c)", "(1|é)", r"\w", "x"]
QUANTS = ["", "", "", "?", "*", "+", "{2}", "{1,3}"]


def random_regex(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) + rng.choice(QUANTS) for _ in range(rng.randint(1, 4)))


EXTRA = [b"", None, b"1a2", b"ab-", b"\xc3", b"\xa9a", b"a\xc3", b"12a"]


@points(7)
def test_random_regexes_match_reference(tiny_llama):
    """Random regexes on the embedded tokenizer's vocabulary (plus empty, special, dying and half-UTF-8
    tokens): allowed_tokens in every state, packed rows, and matchers on random walks equal the reference."""
    for state in (0, 1):  # the explicit cases first: what the random ones may not hit
        expect_allowed(compile_regex(r"\d+"), state, SMALL_BYTES, STOP, "SMALL vocabulary, r'\\d+'")
    expect_allowed(compile_regex(r"\d+"), 1, [b"1", b"x", b"2", b"12"], [1, 2], "stop ids 1 and 2 among text")
    mixed = FakeTokenizer([b"a", "<s>", b"b"])  # an added token that is not special: the real vocabulary has none
    mixed.vocab["ünï"] = 3
    mixed.added_tokens_decoder[3] = SimpleNamespace(content="ünï", special=False)
    got, want = lab.token_bytes(mixed), vocab_bytes(mixed)
    assert got == want, (
        f"token_bytes of a vocabulary with the added token 'ünï' (not special) = {got}, expected {want}: an added "
        "token that is not special writes its text as UTF-8; only special added tokens are None"
    )
    expect_row([31, 37], 64)
    small = small_tokenizer()
    _, mine, ref = _pair(small, len(SMALL) + 40, STOP, r"\d+-\d")
    expect_same_row(mine, ref, len(SMALL) + 40, "compiling r'\\d+-\\d' (vocab_size = len(tokenizer) + 40)")
    assert mine.accept_token(8) and ref.accept_token(8)
    expect_same_row(mine, ref, len(SMALL) + 40, "accepting b'4-' (a token that spans states)")
    tok = real_tokenizer(tiny_llama)
    _random_regexes(tok, lab.token_bytes(tok))


def _random_regexes(tok, vocab):
    want_vocab = DFABackend(tok, len(tok), [2]).vocab
    assert vocab == want_vocab, "token_bytes differs from the reference: see test_token_bytes_*"
    stops = [2, 0]
    full = vocab + EXTRA
    backends: dict[int, tuple] = {}  # vocab_size -> (yours, the reference): built once each

    def pair(size: int, regex: str):
        if size not in backends:
            backends[size] = (lab.make_backend(tok, size, stops), DFABackend(tok, size, stops))
        mine, ref = backends[size]
        return mine.matcher(mine.compile("regex", regex)), ref.matcher(ref.compile("regex", regex))

    @settings(max_examples=8, phases=[Phase.explicit, Phase.generate])
    @given(seed=st.integers(0, 2**32 - 1))
    def check(seed):
        rng = random.Random(seed)
        regex = random_regex(rng)
        dfa = compile_regex(regex)
        for state in rng.sample(range(dfa.num_states), min(3, dfa.num_states)):
            expect_allowed(dfa, state, full, stops, f"the real vocabulary + {EXTRA}, {regex!r}")
        size = len(tok) + rng.choice([0, 1, 31, 40])
        allowed = sorted(rng.sample(range(size), rng.randint(0, 64)))
        expect_row(allowed, size)
        mine, ref = pair(size, regex)
        for step in range(6):
            got, want = _row(mine, size, -1), _row(ref, size, -1)
            assert torch.equal(got, want), (
                f"{regex!r}, vocab_size {size}: after {step} random tokens the row allows "
                f"{bits(got, size)[:10]}..., expected {bits(want, size)[:10]}..."
            )
            choices = bits(want, size)
            if not choices or ref.is_terminated():
                break
            t = rng.choice(choices)
            assert mine.accept_token(t) is True and ref.accept_token(t), f"{regex!r}: accept_token({t}) refused"
            assert mine.is_terminated() == ref.is_terminated(), f"{regex!r}: is_terminated() after token {t}"

    check()


# ---- the engine with your backend ---------------------------------------------------------------------
REGEXES = [r"\d{3}-\d{4}", r"(yes|no)", r"[A-Z][a-z]{2,8} [A-Z][a-z]{2,8}", r"#[0-9a-f]{6}", r"(é|ü){2}\.", r"x\d?"]


@points(10, timeout=240)
@engine
def test_engine_follows_regexes(tiny_llama):
    """The engine (a tiny model with the real tokenizer) with components={"grammar": "lab14"}: every output
    full-matches its regex, ends with "stop", and equals the reference backend's greedy tokens."""
    from minisgl import LLM, SamplingParams

    cls = lab.backend_class()
    cls(small_tokenizer(), len(SMALL), STOP).compile("regex", "a")  # a stub fails here, before the engine starts
    prompts = [[5 + 7 * i, 40 + i, 300 + 11 * i] for i in range(len(REGEXES))]
    params = [SamplingParams(max_tokens=40, regex=rx) for rx in REGEXES]

    def run(name: str):
        llm = LLM(str(tiny_llama), device="cpu", dtype="float32", components={"grammar": name})
        try:
            return llm.generate(prompts, params, use_tqdm=False)
        finally:
            llm.shutdown()

    with lab.registered_backend(cls) as name, engine_failure("your grammar backend"):
        got = run(name)
    want = run("dfa")
    for rx, g, w in zip(REGEXES, got, want):
        assert g.finish_reason == "stop" and re.fullmatch(rx, g.text), (
            f"with your backend, the output under {rx!r} is {g.text!r} (finish_reason {g.finish_reason!r}); "
            f"expected a full match ending with 'stop' (the reference: {w.text!r})"
        )
        assert g.token_ids == w.token_ids, (
            f"under {rx!r} your backend's engine generated tokens {g.token_ids}, the reference {w.token_ids} "
            f"({g.text!r} vs {w.text!r}): a mask that allows other tokens than the reference's"
        )
