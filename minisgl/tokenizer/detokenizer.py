"""Incremental detokenization (the server's detokenizer worker applies it to the scheduler's output).

Decoding one token at a time does not work: a character may span several byte-level tokens, and
SentencePiece-style tokenizers decide a token's leading space from the token before it. So the
decoder re-decodes a short window that starts a little before the new tokens::

    ids:   ... | prefix ........ read | new tokens |
                 `-- decoded twice: without and with the new tokens; the difference is the
                     new text (held back while it ends in an incomplete character, U+FFFD)
"""

from __future__ import annotations

from typing import Any


class IncrementalDecoder:
    """Text pieces of a growing token sequence; the pieces join to the decode of all tokens."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # window start: context for the first new token's spacing
        self.read = 0  # tokens whose text has been returned

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; return the text they complete (maybe "" while a character is incomplete)."""
        self.ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """The text still held back (an incomplete character at the very end)."""
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
