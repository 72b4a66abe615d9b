"""The tokenizer worker: text (or a chat) in, token ids out, on their way to the scheduler.

Input it cannot turn into a valid prompt (no chat template, ids outside the vocabulary) is
refused here with an ``ErrorMsg`` straight to the API server; everything else it does not
handle (aborts, stats requests) is forwarded to the scheduler unchanged, in order. Its
``ReadyMsg`` carries the tokenizer's EOS ids to the scheduler (which then need not load the
tokenizer itself: that costs seconds at start-up).
"""

from __future__ import annotations

import logging

from minisgl.message import ErrorMsg, GenerateMsg, ReadyMsg, TokenizeMsg, decode, encode
from minisgl.server.process import Addresses, setup_child

logger = logging.getLogger(__name__)


def tokenize(tokenizer, msg: TokenizeMsg, vocab_size: int) -> list[int]:
    """The prompt's token ids; ``ValueError`` says what is wrong with the input."""
    if msg.messages is not None:
        from minisgl.tokenizer import apply_chat_template

        return apply_chat_template(tokenizer, msg.messages)
    if msg.text is not None:
        if tokenizer is None:
            raise ValueError("this model has no tokenizer: send the prompt as token ids")
        return tokenizer.encode(msg.text, add_special_tokens=True)
    ids = msg.input_ids or []
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token ids must be in [0, {vocab_size}); got {bad[0]}")
    return ids


def run_tokenizer(model: str | None, dummy_weight: bool, addrs: Addresses, log_level: str) -> None:
    """Process entry point."""
    setup_child("tokenizer", log_level)
    import zmq

    from minisgl.engine.engine import resolve_model
    from minisgl.tokenizer import eos_token_ids, load_tokenizer

    path, cfg = resolve_model(model, dummy_weight)
    tokenizer = load_tokenizer(path)
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    inbox.bind(addrs.tokenizer)
    to_scheduler = ctx.socket(zmq.PUSH)
    to_scheduler.connect(addrs.scheduler)
    to_frontend = ctx.socket(zmq.PUSH)
    to_frontend.connect(addrs.frontend)
    # to the scheduler, which takes the tokenizer's EOS ids from it and passes it on: the message
    # reaches the API server through every stage, and before any request (same pipes, in order)
    to_scheduler.send(encode(ReadyMsg("tokenizer", {"eos_ids": sorted(eos_token_ids(tokenizer))})))
    logger.info("tokenizer ready")
    while True:
        msg = decode(inbox.recv())
        if not isinstance(msg, TokenizeMsg):
            to_scheduler.send(encode(msg))
            continue
        try:
            ids = tokenize(tokenizer, msg, cfg.vocab_size)
        except Exception as e:  # a template or tokenizer error is the input's fault, not ours
            param = "messages" if msg.messages is not None else "prompt"
            to_frontend.send(encode(ErrorMsg(msg.uid, str(e) or type(e).__name__, 400, param=param)))
            continue
        to_scheduler.send(encode(GenerateMsg(msg.uid, ids, msg.sampling, msg.auto_max_tokens)))
