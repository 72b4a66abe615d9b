"""The tokenizer process: text (or a chat) in, token ids out, on their way to the scheduler.

Input it cannot turn into a prompt (no chat template, a tokenizer error) is refused here with an
``ErrorMsg`` straight to the API server. ``/v1/tokenize`` and ``/v1/detokenize`` (``TextReqMsg``) are
answered here too (``TextMsg``, straight to the API server), with the tokenizer this process holds
anyway. Everything else it does not handle (aborts, stats and flush requests, pings) is forwarded to
the scheduler unchanged, in order. Its ``ReadyMsg`` carries the tokenizer's EOS ids to the scheduler
(which then need not load the tokenizer itself: that costs seconds at start-up). A malformed frame
is dropped (``minisgl.server.ipc``).
"""

from __future__ import annotations

import logging

from minisgl.message import (
    AbortMsg,
    Addresses,
    ErrorMsg,
    FlushCacheReqMsg,
    GenerateMsg,
    PingMsg,
    ReadyMsg,
    StatsReqMsg,
    TextMsg,
    TextReqMsg,
    TokenizeMsg,
    encode,
)
from minisgl.models.resolve import resolve_model
from minisgl.process import setup_child
from minisgl.server.ipc import MsgReader, bind_inbox
from minisgl.tokenizer import eos_token_ids, load_tokenizer, tokenize
from minisgl.toolcall import chat_traits, render_chat

logger = logging.getLogger(__name__)

ACCEPTS = (TokenizeMsg, AbortMsg, StatsReqMsg, FlushCacheReqMsg, TextReqMsg, PingMsg)  # from the API server


def start_text_worker(name: str, model: str | None, dummy_weight: bool, inbox_addr: str, log_level: str):
    """What the tokenizer and the detokenizer process do first: set up the child, load the model's
    tokenizer, bind their inbox. Returns ``(tokenizer, inbox, push)``, where
    ``push(addr)`` connects a PUSH socket to another process."""
    setup_child(name, log_level)
    import zmq

    path, _ = resolve_model(model, dummy_weight)
    tokenizer = load_tokenizer(path)
    ctx = zmq.Context()
    inbox = bind_inbox(ctx, inbox_addr)

    def push(addr: str):
        sock = ctx.socket(zmq.PUSH)
        sock.connect(addr)
        return sock

    return tokenizer, inbox, push


def run_tokenizer(
    model: str | None, dummy_weight: bool, addrs: Addresses, log_level: str, chat_template: str | None = None
) -> None:
    """Process entry point; ``chat_template`` (``--chat-template``) replaces the model's."""
    tokenizer, inbox, push = start_text_worker("tokenizer", model, dummy_weight, addrs.tokenizer, log_level)
    if chat_template is not None and tokenizer is not None:
        tokenizer.chat_template = chat_template
    reader = MsgReader("tokenizer", ACCEPTS)
    to_scheduler, to_frontend = push(addrs.scheduler), push(addrs.frontend)
    # to the scheduler, which takes the tokenizer's EOS ids from it and passes it on: the message
    # reaches the API server through every stage, and before any request (same pipes, in order)
    # (and what the API server must know of the chat template: tool-call format, <think>)
    to_scheduler.send(
        encode(ReadyMsg("tokenizer", {"eos_ids": sorted(eos_token_ids(tokenizer)), **chat_traits(tokenizer)}))
    )
    logger.info("tokenizer ready")
    while True:
        msg = reader.read(inbox.recv())
        if msg is None:
            continue
        if isinstance(msg, TextReqMsg):
            to_frontend.send(encode(convert_text(tokenizer, msg)))
            continue
        if not isinstance(msg, TokenizeMsg):
            to_scheduler.send(encode(msg))
            continue
        try:
            chat = render_chat(tokenizer, msg.messages, msg.tools) if msg.messages is not None else (None, None)
            ids = tokenize(tokenizer, msg.text, msg.input_ids, *chat)
        except Exception as e:  # a template or tokenizer error is the input's fault, not ours
            param = "messages" if msg.messages is not None else "prompt"
            to_frontend.send(encode(ErrorMsg(msg.uid, str(e) or type(e).__name__, 400, param=param)))
            continue
        to_scheduler.send(encode(GenerateMsg(msg.uid, ids, msg.sampling)))


def convert_text(tokenizer, msg: TextReqMsg) -> TextMsg:
    """``/v1/tokenize`` (``msg.texts``) or ``/v1/detokenize`` (``msg.token_ids``) with the model's
    tokenizer; what it refuses (no tokenizer, an id it cannot decode) comes back as ``error``."""
    if tokenizer is None:
        return TextMsg(msg.uid, error="this model has no tokenizer")
    try:
        if msg.texts is not None:
            ids = [list(tokenizer.encode(t, add_special_tokens=msg.add_special_tokens)) for t in msg.texts]
            return TextMsg(msg.uid, token_ids=ids)
        texts = [tokenizer.decode(ids, skip_special_tokens=msg.skip_special_tokens) for ids in msg.token_ids or []]
        return TextMsg(msg.uid, texts=texts)
    except Exception as e:  # the input's fault (the API server checked the ids against the vocabulary)
        return TextMsg(msg.uid, error=f"the tokenizer refused the input: {type(e).__name__}: {e}"[:1000])
