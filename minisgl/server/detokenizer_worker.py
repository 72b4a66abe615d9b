"""The detokenizer process: the scheduler's token batches in, text replies out to the API server
(a ``minisgl.tokenizer.detokenizer.Detokenizer`` per request, of the ``--detokenizer`` chosen:
``IncrementalDecoder`` by default); other messages pass through.
A malformed frame is dropped, and so is a token that cannot be decoded (``minisgl.server.ipc``)."""

from __future__ import annotations

import logging

from minisgl.message import (
    Addresses,
    BatchReplyMsg,
    BatchTokenMsg,
    BusyMsg,
    ErrorMsg,
    PingMsg,
    ReadyMsg,
    ReplyMsg,
    StatsMsg,
    TokenLogprobs,
    TokenMsg,
    encode,
)
from minisgl.server.ipc import MsgReader
from minisgl.server.tokenizer_worker import start_text_worker
from minisgl.tokenizer import token_bytes
from minisgl.tokenizer.detokenizer import Detokenizer, IncrementalDecoder, text_streams

logger = logging.getLogger(__name__)

ACCEPTS = (BatchTokenMsg, ErrorMsg, StatsMsg, ReadyMsg, PingMsg, BusyMsg)  # from the scheduler


def run_detokenizer(
    model: str | None, dummy_weight: bool, addrs: Addresses, log_level: str, detokenizer: str = "default"
) -> None:
    """Process entry point; ``detokenizer`` names the ``DETOKENIZERS`` entry to run."""
    tokenizer, inbox, push = start_text_worker("detokenizer", model, dummy_weight, addrs.detokenizer, log_level)
    cls = text_streams(detokenizer).detokenizer
    out = push(addrs.frontend)
    reader = MsgReader("detokenizer", ACCEPTS)
    decoders: dict[int, Detokenizer] = {}
    logger.info("detokenizer ready (%s.%s)", cls.__module__, cls.__qualname__)
    while True:
        msg = reader.read(inbox.recv())
        if msg is None:
            continue
        if not isinstance(msg, BatchTokenMsg):
            out.send(encode(msg))
            continue
        # a request's tokens in one batch are merged into one reply
        replies: dict[int, ReplyMsg] = {}
        for t in msg.tokens:
            try:
                add_token(replies, decoders, tokenizer, t, cls)
            except Exception as e:  # a token id the tokenizer cannot decode: drop it, keep the rest
                decoders.pop(t.uid, None)  # it holds the bad id, which would fail every later push
                reader.drop(f"token {t.token_id} of request {t.uid}: {type(e).__name__}: {e}")
        out.send(encode(BatchReplyMsg(list(replies.values()))))


def add_token(
    replies: dict[int, ReplyMsg],
    decoders: dict[int, Detokenizer],
    tokenizer,
    t: TokenMsg,
    cls: type[Detokenizer] = IncrementalDecoder,
) -> None:
    """Append one token (and the text it completes) to its request's reply in this batch."""
    reply = replies.get(t.uid)
    if reply is None:
        reply = replies[t.uid] = ReplyMsg(t.uid, "", [], None, t.prompt_tokens, t.cached_tokens)
    if t.finish_reason == "abort":
        decoders.pop(t.uid, None)
        reply.finish_reason = "abort"
        return
    dec = decoders.get(t.uid)
    if dec is None:
        dec = decoders[t.uid] = cls(tokenizer)
    text = dec.push([t.token_id])  # first: a token that cannot be decoded leaves the reply as it was
    reply.token_ids.append(t.token_id)
    reply.text += text
    for lp, field in ((t.logprobs, "logprobs"), (t.prompt_logprobs, "prompt_logprobs")):
        if lp is not None:  # the tokens they name, as bytes: the API server has no tokenizer
            if getattr(reply, field) is None:
                setattr(reply, field, TokenLogprobs())
            getattr(reply, field).extend(lp)
            ids = {i for i in lp.token_ids} | {i for top in lp.top_ids for i in top}
            reply.pieces = (reply.pieces or {}) | dict(zip(ids, token_bytes(tokenizer, list(ids))))
    if t.finish_reason is not None:
        reply.text += dec.flush()
        reply.finish_reason = t.finish_reason
        del decoders[t.uid]
