"""Incremental detokenization, and the detokenizer worker that applies it to the scheduler's output.

Decoding one token at a time does not work: a character may span several byte-level tokens, and
SentencePiece-style tokenizers decide a token's leading space from the token before it. So the
decoder re-decodes a short window that starts a little before the new tokens::

    ids:   ... | prefix ........ read | new tokens |
                 `-- decoded twice: without and with the new tokens; the difference is the
                     new text (held back while it ends in an incomplete character, U+FFFD)
"""

from __future__ import annotations

import logging
from typing import Any

from minisgl.message import BatchReplyMsg, BatchTokenMsg, ReplyMsg, decode, encode
from minisgl.server.process import Addresses, setup_child

logger = logging.getLogger(__name__)


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


def run_detokenizer(model: str | None, dummy_weight: bool, addrs: Addresses, log_level: str) -> None:
    """Process entry point: token batches in, text replies out; other messages pass through."""
    setup_child("detokenizer", log_level)
    import zmq

    from minisgl.engine.engine import resolve_model
    from minisgl.tokenizer import load_tokenizer

    path, _ = resolve_model(model, dummy_weight)
    tokenizer = load_tokenizer(path)
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    inbox.bind(addrs.detokenizer)
    out = ctx.socket(zmq.PUSH)
    out.connect(addrs.frontend)
    decoders: dict[int, IncrementalDecoder] = {}
    logger.info("detokenizer ready")
    while True:
        msg = decode(inbox.recv())
        if not isinstance(msg, BatchTokenMsg):
            out.send(encode(msg))
            continue
        # a request's tokens in one batch are merged into one reply
        replies: dict[int, ReplyMsg] = {}
        for t in msg.tokens:
            reply = replies.get(t.uid)
            if reply is None:
                reply = replies[t.uid] = ReplyMsg(t.uid, "", [], None, t.prompt_tokens, t.cached_tokens)
            if t.finish_reason == "abort":
                decoders.pop(t.uid, None)
                reply.finish_reason = "abort"
                continue
            dec = decoders.get(t.uid)
            if dec is None:
                dec = decoders[t.uid] = IncrementalDecoder(tokenizer)
            reply.token_ids.append(t.token_id)
            reply.text += dec.push([t.token_id])
            if t.finish_reason is not None:
                reply.text += dec.flush()
                reply.finish_reason = t.finish_reason
                del decoders[t.uid]
        out.send(encode(BatchReplyMsg(list(replies.values()))))
