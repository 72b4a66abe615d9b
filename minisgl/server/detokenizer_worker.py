"""The detokenizer process: the scheduler's token batches in, text replies out to the API server
(``minisgl.tokenizer.detokenizer.IncrementalDecoder`` per request); other messages pass through."""

from __future__ import annotations

import logging

from minisgl.message import Addresses, BatchReplyMsg, BatchTokenMsg, ReplyMsg, decode, encode
from minisgl.server.tokenizer_worker import start_text_worker
from minisgl.tokenizer.detokenizer import IncrementalDecoder

logger = logging.getLogger(__name__)


def run_detokenizer(model: str | None, dummy_weight: bool, addrs: Addresses, log_level: str) -> None:
    """Process entry point."""
    tokenizer, inbox, push = start_text_worker("detokenizer", model, dummy_weight, addrs.detokenizer, log_level)
    out = push(addrs.frontend)
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
