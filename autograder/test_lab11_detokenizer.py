"""Lab 11 (incremental detokenization with stop strings): your ``LabDetokenizer`` on tricky
tokenizations (SmolLM2's byte-level BPE splits a multi-byte character over tokens; a tiny
SentencePiece-style tokenizer decides spaces from the tokens before), your ``LabStopStrings`` on
streams of text pieces, both on random streams against the reference, then a real server running
them, asked through the ``openai`` client. Run: ``python -m autograder lab11``.

Every check explains itself: after which token (or piece) your text went wrong, what you had sent,
what was expected, and the usual cause."""

from __future__ import annotations

import functools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from autograder import pace
from autograder.adapters import lab11 as lab
from autograder.points import engine, points

FFFD = "\ufffd"


# ---- tokenizers -------------------------------------------------------------------------------------------
class PieceTokenizer:
    """A tiny SentencePiece-style tokenizer: ``▁`` is a space, the decode drops the space that would
    start its text (so a token's leading space depends on the tokens before it), ``<0xNN>`` pieces are
    raw bytes (a character may span several), and ids 0-2 are special tokens."""

    SPECIAL = ("<s>", "</s>", "<pad>")
    PIECES = (
        *SPECIAL,
        *"▁Hello ▁world , ! ▁how ▁are ▁you ? ▁caf ▁na ve ▁I ▁said ▁stop ▁it . ▁ ▁END ▁</ s > ab c d".split(),
        "\n",
        *(f"<0x{b:02X}>" for b in "é日🎉".encode()),
    )

    def __init__(self):
        self.id_of = {p: i for i, p in enumerate(self.PIECES)}

    def ids(self, *pieces: str) -> list[int]:
        return [self.id_of[p] for p in pieces]

    def byte_ids(self, text: str) -> list[int]:
        return [self.id_of[f"<0x{b:02X}>"] for b in text.encode()]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        out = b""
        for i in ids:
            piece = self.PIECES[i]
            if piece in self.SPECIAL and skip_special_tokens:
                continue
            out += bytes([int(piece[3:5], 16)]) if piece.startswith("<0x") else piece.replace("▁", " ").encode()
        text = out.decode("utf-8", errors="replace")
        return text[1:] if text.startswith(" ") else text


PIECE = PieceTokenizer()


@functools.cache
def smollm2():
    """The embedded model's tokenizer (SmolLM2's byte-level BPE), from the tiny test model's folder."""
    from transformers import AutoTokenizer

    from autograder.models import tiny_model

    return AutoTokenizer.from_pretrained(str(tiny_model("llama")))


warm_before_fork = smollm2  # loaded once by the grader's parent process, not in every test's child


# ---- the detokenizer: run, compare, explain ---------------------------------------------------------------
def stream(cls, tok, chunks: list[list[int]], skip: bool = True) -> tuple[list[str], str]:
    dec = cls(tok, skip)
    return [dec.push(list(c)) for c in chunks], dec.flush()


def _sent_twice(sent: str, piece: str, full: str) -> bool:
    """Whether ``piece`` begins with text that ends ``sent`` and goes on as the text after it."""
    rest = full[len(sent) :]
    return any(sent.endswith(piece[:j]) and rest.startswith(piece[j : j + 8]) for j in range(1, len(piece) + 1))


def moved_on_no_text(tok, chunks: list[list[int]], skip: bool) -> list[str]:
    """The pieces of the pitfall that moves the window after a push whose decode did not grow (a skipped
    special token: ``len(new) == len(old)``), so the next token is decoded without its context."""
    ids, prefix, read, out = [], 0, 0, []
    for chunk in chunks:
        ids += chunk
        old = tok.decode(ids[prefix:read], skip_special_tokens=skip)
        new = tok.decode(ids[prefix:], skip_special_tokens=skip)
        if read == len(ids) or new.endswith(FFFD) or len(new) < len(old):
            out.append("")
            continue
        prefix, read = read, len(ids)
        out.append(new[len(old) :])
    return out


def check_detokenizer(tok, chunks: list[list[int]], what: str, skip: bool = True) -> None:
    """Push ``chunks`` (lists of ids) one by one; every piece must be final, whole characters, sent at
    once, never twice, and with flush join to the full decode."""
    cls = lab.detokenizer_class()
    pieces, rest = stream(cls, tok, chunks, skip)
    ref_pieces, ref_rest = stream(lab.REFERENCE.detokenizer, tok, chunks, skip)
    ids = [i for c in chunks for i in c]
    full = tok.decode(ids, skip_special_tokens=skip)
    sent, ref_sent = "", ""
    kept_special = (
        "special tokens were skipped although skip_special_tokens=False: decode with skip_special_tokens=self.skip "
        "(a chat's <|im_end|> is then text like any other)"
    )
    for k, (piece, ref) in enumerate(zip(pieces, ref_pieces)):
        where = f"{what}: after push #{k + 1} (ids {chunks[k]}) "
        if not isinstance(piece, str):
            raise AssertionError(f"{where}push returned {piece!r}, expected a str")
        if piece.endswith(FFFD):
            raise AssertionError(
                f"{where}you returned {piece!r}, which ends in U+FFFD: an incomplete character was sent "
                f"(its other bytes are in later tokens; the full text is {full!r}). Hold the text back while "
                "the decode ends in U+FFFD"
            )
        before, sent, ref_sent = sent, sent + piece, ref_sent + ref
        skipped = tok.decode([i for c in chunks[: k + 1] for i in c], skip_special_tokens=True)
        skipped_special = not skip and skipped.startswith(sent) and not skipped.startswith(ref_sent)
        if not full.startswith(sent):
            if skipped_special:
                cause = kept_special
            elif pieces[: k + 1] == moved_on_no_text(tok, chunks, skip)[: k + 1]:
                cause = (
                    "the window moved after a push that added no text (a skipped special token: the new decode "
                    "was no longer than the old one). Return '' then and keep prefix and read where they are: "
                    "the next token's leading space depends on the text before it"
                )
            elif _sent_twice(before, piece, full):
                cause = "text was sent twice: return only what the new tokens add (new[len(old):]) and move the window"
            elif sent.replace(" ", "") == full.replace(" ", "")[: len(sent.replace(" ", ""))]:
                cause = (
                    "spaces were lost: did you decode each token on its own? A SentencePiece decode drops "
                    "the leading space of its first token; decode a window that starts before the new tokens"
                )
            else:
                cause = "did you decode each token on its own, or start the window in the middle of a character?"
            raise AssertionError(
                f"{where}you had sent {sent!r}, but the whole decode is {full!r}, which does not begin with it: {cause}"
            )
        if len(sent) < len(ref_sent):
            cause = (
                kept_special
                if skipped_special
                else "text held back although its characters are complete (return the new text as soon as the "
                "decode does not end in U+FFFD)"
            )
            raise AssertionError(f"{where}you had sent {sent!r}, the reference {ref_sent!r}: {cause}")
    if not isinstance(rest, str):
        raise AssertionError(f"{what}: flush returned {rest!r}, expected a str")
    if sent + rest != full:
        cause = (
            "flush dropped the held-back text (it must return what push kept back, U+FFFD included)"
            if rest == "" and ref_rest
            else "flush must return exactly what push has not returned yet"
        )
        raise AssertionError(
            f"{what}: your pieces and flush join to {sent + rest!r}, the whole decode is {full!r}; flush returned "
            f"{rest!r}, the reference {ref_rest!r}: {cause}"
        )


def one_by_one(ids: list[int]) -> list[list[int]]:
    return [[i] for i in ids]


# ---- LabDetokenizer ---------------------------------------------------------------------------------------
@points(5)
def test_detokenizer_joins_to_the_full_decode():
    """ASCII text pushed a token at a time, and in chunks of several tokens, joins to the full decode."""
    tok = smollm2()
    ids = tok.encode("Hello world, how are you today?\n\nFine, thanks.")
    check_detokenizer(tok, one_by_one(ids), "SmolLM2, one token per push")
    check_detokenizer(tok, [ids[:3], ids[3:4], ids[4:9], ids[9:]], "SmolLM2, chunks of tokens")
    check_detokenizer(PIECE, one_by_one(PIECE.ids("▁Hello", ",", "▁world", "!")), "the piece tokenizer")


@points(6)
def test_detokenizer_keeps_spacing():
    """A SentencePiece-style tokenizer: a token's leading space shows only after other text."""
    toks = PIECE.ids("▁Hello", "▁world", ",", "▁how", "▁are", "▁you", "?", "\n", "▁I", "▁said", "▁stop", ".")
    check_detokenizer(PIECE, one_by_one(toks), "the piece tokenizer, one token per push")
    check_detokenizer(PIECE, [toks[:2], toks[2:5], toks[5:]], "the piece tokenizer, chunks of tokens")


@points(7)
def test_detokenizer_never_sends_a_broken_character():
    """Multi-byte characters split over tokens (é, 日本語, 🎉, が) are sent whole."""
    tok = smollm2()
    for text in ("Héllo wörld — 日本語 🎉 done.", "café 🎉🎉 naïve", " 猫が好き!"):
        check_detokenizer(tok, one_by_one(tok.encode(text)), f"SmolLM2 on {text!r}")
    ids = PIECE.ids("▁caf") + PIECE.byte_ids("é") + PIECE.ids("▁") + PIECE.byte_ids("日🎉") + PIECE.ids("!")
    check_detokenizer(PIECE, one_by_one(ids), "the piece tokenizer with byte tokens")
    # the last byte of 🎉 opens a push that ends inside é: 🎉 waits for é (the decode ends in U+FFFD)
    party, e = PIECE.byte_ids("🎉"), PIECE.byte_ids("é")
    chunks = [party[:3], party[3:] + e[:1], e[1:], PIECE.ids("!")]
    check_detokenizer(PIECE, chunks, "the piece tokenizer, 🎉 completed by a push that ends inside é")


@points(5)
def test_detokenizer_sends_text_as_soon_as_complete():
    """Text is returned by the push that completes it: nothing waits for a later token or for flush."""
    tok = smollm2()
    ids = tok.encode("One 🎉 two é three 日本 four")
    check_detokenizer(tok, one_by_one(ids), "SmolLM2, one token per push")
    # a byte that never becomes a character: its U+FFFD is text like any other once more follows
    bad = PIECE.byte_ids("日")[:1] + PIECE.ids("▁Hello", "▁world")
    check_detokenizer(PIECE, one_by_one(bad), "the piece tokenizer, an invalid byte then words")


@points(5)
def test_detokenizer_never_sends_text_twice():
    """Each piece is only the new text: the pieces never repeat what was sent."""
    tok = smollm2()
    ids = tok.encode("The quick brown fox jumps over the lazy dog.")
    check_detokenizer(tok, one_by_one(ids), "SmolLM2, one token per push")
    check_detokenizer(PIECE, one_by_one(PIECE.ids("▁I", "▁said", "▁Hello", "▁world", "!")), "the piece tokenizer")


@points(4)
def test_detokenizer_flush_returns_the_held_back_text():
    """A sequence that ends in the middle of a character: flush returns the rest (U+FFFD included)."""
    tok = smollm2()
    ids = tok.encode("See you 🎉")
    check_detokenizer(tok, one_by_one(ids[:-1]), "SmolLM2, the last byte of 🎉 never came")
    check_detokenizer(PIECE, one_by_one(PIECE.ids("▁caf") + PIECE.byte_ids("é")[:1]), "the piece tokenizer, half é")


@points(2)
def test_detokenizer_skip_special_tokens_false():
    """With skip_special_tokens=False the special tokens are text like any other (decode with self.skip)."""
    check_detokenizer(PIECE, one_by_one(PIECE.ids("▁Hello", "</s>", "▁world")), "keeping special tokens", skip=False)


@points(3)
def test_detokenizer_skips_special_tokens_and_no_tokenizer():
    """Special tokens are skipped (they add no text: nothing to send); no tokenizer: always ""."""
    ids = PIECE.ids("<s>", "▁Hello", "</s>", "▁world", "</s>")
    check_detokenizer(PIECE, one_by_one(ids), "the piece tokenizer, skipping special tokens")
    tok = smollm2()
    check_detokenizer(tok, one_by_one([1, *tok.encode("Hi there"), 2]), "SmolLM2 with <|im_start|> / <|im_end|>")
    dec = lab.detokenizer_class()(None)
    got = [dec.push([5]), dec.push([6, 7]), dec.flush()]
    assert got == ["", "", ""], f"with tokenizer=None every piece must be '' (a model without a tokenizer), got {got}"


def random_chunks(rng: random.Random, ids: list[int]) -> list[list[int]]:
    chunks, i = [], 0
    while i < len(ids):
        n = rng.choice((1, 1, 1, 2, 3))
        chunks.append(ids[i : i + n])
        i += n
    return chunks


TRICKY = "aé日本🎉 —ü\nが好き!?"


@points(6)
def test_detokenizer_random_streams():
    """Random texts of multi-byte characters, and random token ids, in random chunks, both tokenizers,
    sometimes cut in the middle of a character: every property holds against the reference."""
    tok = smollm2()
    ids = tok.encode(" café 🎉 日本")
    check_detokenizer(tok, one_by_one(ids[:-1]), "SmolLM2, cut inside 本")  # a stub fails here
    check_detokenizer(PIECE, one_by_one(PIECE.ids("▁Hello", "▁world", "▁caf") + PIECE.byte_ids("é")), "pieces")
    _random_detokenizer_streams()


@settings(max_examples=40)
@given(
    text=st.text(alphabet=TRICKY + "ab cd", min_size=1, max_size=24),
    seed=st.integers(0, 2**32 - 1),
    cut=st.booleans(),
)
def _random_detokenizer_streams(text, seed, cut):
    rng = random.Random(seed)
    tok = smollm2()
    ids = tok.encode(text)
    if cut and len(ids) > 1:
        ids = ids[:-1]
    check_detokenizer(tok, random_chunks(rng, ids), f"SmolLM2 on the ids of {text!r}{' minus the last' * cut}")
    noise = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 20))]
    check_detokenizer(tok, random_chunks(rng, noise), f"SmolLM2 on random ids {noise}")
    pieces = [rng.randrange(len(PIECE.PIECES)) for _ in range(rng.randint(1, 16))]
    check_detokenizer(PIECE, random_chunks(rng, pieces), f"the piece tokenizer on ids {pieces}")


# ---- stop strings: run, compare, explain ------------------------------------------------------------------
def feed_all(cls, stops: list[str], pieces: list[str]) -> tuple[list[str], list[bool], str]:
    s = cls(list(stops))
    out, stopped = [], []
    for p in pieces:
        out.append(s.feed(p))
        stopped.append(bool(s.stopped))
    return out, stopped, s.flush()


def check_stops(stops: list[str], pieces: list[str], what: str = "") -> None:
    """Feed ``pieces``; after every feed the text sent and ``stopped`` must be the reference's."""
    got, got_stop, got_rest = feed_all(lab.stop_strings_class(), stops, pieces)
    want, want_stop, want_rest = feed_all(lab.REFERENCE.stop_strings, stops, pieces)
    full = "".join(pieces)
    sent, ref = "", ""
    for k, p in enumerate(pieces):
        if not isinstance(got[k], str):
            raise AssertionError(f"feed returned {got[k]!r}, expected a str")
        was_stopped = bool(k and want_stop[k - 1])
        sent, ref = sent + got[k], ref + want[k]
        where = f"stops {stops}{what}, pieces {pieces}: after feeding {p!r} (piece #{k + 1})"
        if sent == ref and got_stop[k] == want_stop[k]:
            continue
        said = f"{where} you had sent {sent!r} (stopped={got_stop[k]}), expected {ref!r} (stopped={want_stop[k]})"
        hit = [s for s in stops if s in sent]
        if was_stopped:
            cause = "text after a stop string was sent: once stopped, feed returns ''"
        elif want_stop[k] and not got_stop[k] and any(s in p for s in stops):
            cause = (
                "you missed a stop string inside this piece: search buf = pending + text for every stop string "
                "first, and only then hold back a possible start (here the stop string ends where the piece ends, "
                "and its last characters also begin another stop string)"
            )
        elif want_stop[k] and not got_stop[k]:
            cause = "you missed a stop string that spans pieces: search the held-back text and the new piece together"
        elif hit and any(sent.startswith(ref + s) for s in stops):
            cause = "you cut after the stop string, not at it: the stop string itself is never sent"
        elif hit:
            cause = "a stop string was sent: cut where the earliest stop string begins"
        elif want_stop[k] and len(sent) > len(ref):
            cause = "you cut at a later match: the earliest-starting stop string wins (stops may overlap)"
        elif len(sent) > len(ref) and sent.startswith(ref):
            cause = (
                f"you sent {sent[len(ref) :]!r}, which may be the start of a stop string: hold back the longest "
                "tail that begins a stop string until a later piece decides"
            )
        elif len(sent) < len(ref) and ref.startswith(sent):
            cause = "you held back text that cannot begin any stop string: send it now"
        else:
            cause = f"the text so far is {full[: sum(map(len, pieces[: k + 1]))]!r}"
        raise AssertionError(f"{said}: {cause}")
    if got_rest != want_rest:
        cause = (
            "flush dropped the held-back text: a sequence that ends without a stop string gets all of its text"
            if got_rest == "" and want_rest
            else "flush returns the held-back text once, and nothing after a stop string"
        )
        raise AssertionError(
            f"stops {stops}{what}, pieces {pieces}: flush returned {got_rest!r}, expected {want_rest!r}: {cause}"
        )


# ---- LabStopStrings ---------------------------------------------------------------------------------------
@points(6)
def test_stops_hold_back_a_possible_start():
    """Text that may begin a stop string waits until a later piece shows it does not."""
    check_stops(["</s>"], ["Hi <", "b>bold", "</", "p> end"])
    check_stops(["\n\n", "END"], ["one\n", "two E", "N", "TRY", " last"])
    check_stops(["aab"], ["a", "a", "a", "c"])
    check_stops([], ["nothing ", "is ", "held </s>"])
    # several stops: the tail held back is the longest start over all of them ("</s", not the "s" of "s>")
    check_stops(["s>", "</s>"], ["ok </s", ">"])


@points(5)
def test_stops_cut_at_the_stop_string():
    """The text ends where the stop string begins; the stop string is never sent."""
    check_stops(["STOP"], ["go on STOP and more"])
    check_stops(["."], ["One", " sentence. Two."])
    check_stops(["\n"], ["line one\nline two"])
    # the stop ends exactly where the piece ends, and its last character begins another stop: the search
    # comes first, the hold-back only if nothing was found
    check_stops(["ab", "bc"], ["xab", "c"])


@points(5)
def test_stops_spanning_pieces():
    """A stop string that arrives over several pieces is found (and nothing of it is sent)."""
    check_stops(["</s>"], ["Hello", "</", "s", ">", " world"])
    check_stops(["User:"], ["Answer. U", "se", "r", ": next"])
    check_stops(["ab"], ["xa", "by"])


@points(5)
def test_stops_earliest_match_wins():
    """Overlapping stop strings: the cut is at the earliest-starting match in the text."""
    check_stops(["cd", "bcd"], ["abcde"])
    check_stops(["World", "o W"], ["Hell", "o World"])
    check_stops(["xyz", "y"], ["x", "yz"])


@points(4)
def test_stops_flush_returns_the_held_back_text():
    """A sequence that ends without a stop string (max_tokens, EOS) keeps its last, held-back text."""
    check_stops(["</s>"], ["The end </"])
    check_stops(["\n\n", "Question:"], ["Answer: 42\n", "Quest"])


@points(3)
def test_stops_nothing_after_a_stop():
    """Once stopped, feed returns '' and flush returns ''."""
    check_stops(["!"], ["Hi!", " more", " text"])
    check_stops(["</s>"], ["a</", "s>b", "c</", "d"])


@points(7)
def test_stops_random_streams():
    """Random texts over a small alphabet (so stop strings overlap and repeat), random pieces and stop
    strings: every feed's text and flag, and flush, equal the reference's."""
    check_stops(["aab", "ba"], ["a", "ab", "a"])  # a stub fails here
    check_stops(["cd", "bcd"], ["ab", "cde"])
    check_stops(["</s>"], ["x </", "s", ">y", "z"])
    check_stops(["abc"], ["zzab"])
    check_stops(["b<", "ab<"], ["cab", "<"])  # the longest possible start is the second stop's
    _random_stop_streams()


@settings(max_examples=80)
@given(
    text=st.text(alphabet="abc<>/", max_size=30),
    stops=st.lists(st.text(alphabet="abc<>/", min_size=1, max_size=4), max_size=3),
    seed=st.integers(0, 2**32 - 1),
)
def _random_stop_streams(text, stops, seed):
    rng = random.Random(seed)
    pieces, i = [], 0
    while i < len(text):
        n = rng.randint(0, 4)
        pieces.append(text[i : i + n])
        i += n
    check_stops(stops, pieces)


# ---- the server on your classes ---------------------------------------------------------------------------
@points(12, timeout=300)
@engine
def test_engine_server_with_your_text_streams(tiny_llama):
    """``python -m minisgl --detokenizer lab11_detokenizer:TEXT_STREAMS`` on a tiny model answers the
    ``openai`` client with the reference server's text, streamed and not, with and without stop strings."""
    import openai

    lab.text_streams()
    check_detokenizer(smollm2(), one_by_one(smollm2().encode("ok 🎉")), "SmolLM2")  # a stub fails here
    check_stops(["</s>"], ["a</", "s>"])
    with lab.servers(tiny_llama) as (ref, yours):
        clients = [
            openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=pace.scaled(120))
            for s in (ref, yours)
        ]
        model = str(tiny_llama)
        asks = [dict(prompt=p, max_tokens=24, temperature=0) for p in ("Once upon a time", "Héllo 🎉 wörld")]
        asks.append(dict(prompt="The weather", max_tokens=24, temperature=1.0, seed=7))
        for ask in asks:
            plain = clients[0].completions.create(model=model, **ask, extra_body={"ignore_eos": True})
            text = plain.choices[0].text
            mid = len(text) // 2
            for stop in (None, [text[mid : mid + 3]], [text[mid + 1 : mid + 5], text[mid : mid + 2]]):
                if stop is not None and not all(s.strip() for s in stop):
                    continue  # a stop string must not be empty (and blanks make a poor test)
                want = plain if stop is None else None
                kw = dict(model=model, **ask, stop=stop, extra_body={"ignore_eos": True})
                if want is None:
                    want = clients[0].completions.create(**kw)
                got = clients[1].completions.create(**kw)
                what = f"completions {ask} with stop={stop!r}"
                assert (got.choices[0].text, got.choices[0].finish_reason) == (
                    want.choices[0].text,
                    want.choices[0].finish_reason,
                ), (
                    f"{what}: your server answered {got.choices[0].text!r} ({got.choices[0].finish_reason}), the "
                    f"reference {want.choices[0].text!r} ({want.choices[0].finish_reason})"
                )
                pieces = [c.choices[0].text for c in clients[1].completions.create(**kw, stream=True) if c.choices]
                assert "".join(pieces) == want.choices[0].text, (
                    f"{what}, streamed: your server's chunks {pieces} join to {''.join(pieces)!r}, expected "
                    f"{want.choices[0].text!r}"
                )
        chat = dict(model=model, messages=[{"role": "user", "content": "Say 日本 🎉"}], max_tokens=20, temperature=0)
        want = clients[0].chat.completions.create(**chat).choices[0].message.content
        got = clients[1].chat.completions.create(**chat).choices[0].message.content
        assert got == want, f"chat: your server answered {got!r}, the reference {want!r}"
        deltas = [c.choices[0].delta.content or "" for c in clients[1].chat.completions.create(**chat, stream=True)]
        joined = "".join(deltas)
        assert joined == want, f"chat, streamed: your deltas {deltas} join to {joined!r}, expected {want!r}"
