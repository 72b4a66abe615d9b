"""Incremental detokenization and stop strings: a sequence's tokens become the text a client sees,
piece by piece, as they arrive (lab 11's seam).

Two halves, in two processes of the server::

    scheduler --token ids--> detokenizer process --text pieces--> API server --SSE / JSON--> client
                             Detokenizer (one per request)         StopStrings (one per sequence)

Decoding one token at a time does not work: a character may span several byte-level tokens, and
SentencePiece-style tokenizers decide a token's leading space from the token before it. So the
engine's decoder re-decodes a short window that starts a little before the new tokens::

    ids:   ... | prefix ........ read | new tokens |
                 `-- decoded twice: without and with the new tokens; the difference is the
                     new text (held back while it ends in an incomplete character, U+FFFD)

Both halves are chosen together by name (``TextStreams`` in ``DETOKENIZERS``;
``components={"detokenizer": ...}``, ``python -m minisgl --detokenizer NAME``, where NAME may be a
``"module:attr"`` path that every server process imports itself).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from minisgl.registry import Registry


class Detokenizer(ABC):
    """One sequence's token ids in, its text out, as the tokens arrive.

    Contract (what the detokenizer process relies on):

    * ``push(ids)`` returns only *new* text, and every piece is final: the pieces returned by
      ``push`` and then ``flush`` join to ``tokenizer.decode(all ids, skip_special_tokens=...)``.
    * A piece never ends inside a character: while the decode ends in U+FFFD (the bytes of a
      character still to come) that text is held back, and ``push`` may return ``""``. ``flush``
      returns whatever is still held back, as decoded (the sequence ended mid-character).
    * A U+FFFD that later bytes do not complete (an invalid byte sequence) is text like any other
      once something follows it.
    * ``tokenizer`` may be None (a model without a tokenizer): every piece is ``""``.
    * ``push`` that raises (a token id the tokenizer cannot decode) leaves the object unusable: the
      caller drops it.
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens

    @abstractmethod
    def push(self, token_ids: list[int]) -> str:
        """Add tokens; return the text they complete (maybe "" while a character is incomplete)."""

    @abstractmethod
    def flush(self) -> str:
        """The sequence has ended: the text still held back."""


class StopStrings(ABC):
    """One sequence's text in (the pieces a ``Detokenizer`` made), the text a client may see out,
    cut at the first stop string.

    Contract (what the API server relies on, streaming or not):

    * ``feed(text)`` returns the text that is safe to send now. It never returns text that may be
      the start of a stop string (e.g. ``"</"`` with the stop ``"</s>"``): that is held back until a
      later piece shows whether it is one. A stop string may span pieces.
    * Once the text so far contains a stop string, ``stopped`` is True, and the text is cut where
      the earliest-starting match begins (the stop string itself is never sent; nothing after it
      either). Later ``feed`` calls return ``""``.
    * ``flush()``: the sequence ended without a stop string; returns the held-back text (``""`` once
      stopped).
    * All returned pieces join to the whole text cut before its earliest stop string (or the whole
      text); no piece is returned twice. With no stop strings, ``feed`` returns its input.
    """

    def __init__(self, stops: list[str]):
        self.stops = list(stops)
        self.stopped = False

    @abstractmethod
    def feed(self, text: str) -> str:
        """Add text; return what may be sent now."""

    @abstractmethod
    def flush(self) -> str:
        """The sequence ended (no stop string): the text held back."""


@dataclass(frozen=True)
class TextStreams:
    """The two halves of turning tokens into a client's text (lab 11's seam): the detokenizer
    process builds ``detokenizer(tokenizer)`` per request, the API server ``stop_strings(stops)``
    per sequence."""

    detokenizer: type[Detokenizer]
    stop_strings: type[StopStrings]


class IncrementalDecoder(Detokenizer):
    """Text pieces of a growing token sequence; the pieces join to the decode of all tokens."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True):
        super().__init__(tokenizer, skip_special_tokens)
        self.ids: list[int] = []
        self.prefix = 0  # window start: context for the first new token's spacing
        self.read = 0  # tokens whose text has been returned

    def push(self, token_ids: list[int]) -> str:
        self.ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self.tokenizer is None or self.read == len(self.ids):
            return ""
        dec = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=self.skip)
        before = dec(self.ids[self.prefix : self.read])
        after = dec(self.ids[self.prefix :])
        if len(after) <= len(before) and not final:
            return ""  # e.g. a skipped special token, or bytes of a character still to come
        if after.endswith("\ufffd") and not final:
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]


class StopStringCutter(StopStrings):
    """Holds back the unsent tail that begins some stop string; cuts at the earliest match."""

    def __init__(self, stops: list[str]):
        super().__init__(stops)
        self.pending = ""  # received, not sent: it holds no stop string, and may begin one

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self.pending + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self.pending = True, ""
            return buf[: min(hits)]
        keep = 0  # the longest tail of buf that is a proper prefix of a stop string
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        self.pending = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return "" if self.stopped else out


DEFAULT_TEXT_STREAMS = TextStreams(IncrementalDecoder, StopStringCutter)
DETOKENIZERS: Registry[TextStreams] = Registry("detokenizer", {"default": DEFAULT_TEXT_STREAMS})


def text_streams(name: str = "default") -> TextStreams:
    """The implementation called ``name``, checked: a ``TextStreams`` of two classes of the right kind."""
    impl = DETOKENIZERS.get(name)
    ok = isinstance(impl, TextStreams) and all(
        isinstance(cls, type) and issubclass(cls, base)
        for cls, base in ((impl.detokenizer, Detokenizer), (impl.stop_strings, StopStrings))
    )
    if not ok:
        raise ValueError(
            f"detokenizer {name!r} is {impl!r}: expected a TextStreams(Detokenizer subclass, StopStrings subclass)"
        )
    return impl
