"""Messages between the server's processes, and their wire format.

Every message is a dataclass named ``*Msg``; :func:`encode` / :func:`decode` turn one into msgpack
bytes and back (nested dataclasses included, tagged with their class name). One ZMQ PUSH/PULL
pipe per hop, so messages on a hop arrive in the order they were sent::

    API server --TokenizeMsg, AbortMsg, StatsReqMsg--> tokenizer
    tokenizer  --ReadyMsg, GenerateMsg, AbortMsg, StatsReqMsg--> scheduler (rank 0)
    tokenizer  --ErrorMsg----------------------------> API server   (bad input caught early)
    scheduler  --BatchTokenMsg, ErrorMsg, StatsMsg, ReadyMsg--> detokenizer
    detokenizer --BatchReplyMsg (+ the others, forwarded as they are)--> API server

Because ``AbortMsg`` follows the request's own message down the same pipes, an abort can never
overtake the request it cancels.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import msgpack

from minisgl.core import SamplingParams


@dataclass(frozen=True)
class Addresses:
    """The ZMQ endpoints, one PULL socket per process (bound by the process that reads it).

    ``ipc://`` (Unix domain) sockets: no TCP ports to leak or collide. On Linux they live in the
    abstract namespace (``ipc://@name``), which leaves no file behind even when a process is
    killed; elsewhere in a private temporary folder that the launcher removes."""

    tokenizer: str
    scheduler: str
    detokenizer: str
    frontend: str

    @classmethod
    def under(cls, prefix: str) -> Addresses:
        return cls(*(f"ipc://{prefix}/{name}" for name in ("tokenizer", "scheduler", "detokenizer", "frontend")))


_TAG = "__msg__"
_TYPES: dict[str, type] = {"SamplingParams": SamplingParams}


def _register(cls: type) -> type:
    _TYPES[cls.__name__] = cls
    return cls


# ---- API server -> tokenizer -----------------------------------------------------------------
@_register
@dataclass
class TokenizeMsg:
    """One sequence to generate. Exactly one of ``text`` / ``input_ids`` / ``messages`` is set.
    ``sampling.max_tokens`` may be None (the rest of the context): the scheduler resolves it."""

    uid: int
    sampling: SamplingParams
    text: str | None = None
    input_ids: list[int] | None = None
    messages: list[dict[str, str]] | None = None  # chat: the template is applied by the tokenizer


@_register
@dataclass
class AbortMsg:
    uid: int


@_register
@dataclass
class StatsReqMsg:
    uid: int  # the reply (StatsMsg) carries it back


# ---- tokenizer -> scheduler ------------------------------------------------------------------
@_register
@dataclass
class GenerateMsg:
    uid: int
    input_ids: list[int]
    sampling: SamplingParams


# ---- scheduler -> detokenizer ----------------------------------------------------------------
@_register
@dataclass
class TokenMsg:
    """One sampled token. ``token_id == -1`` with ``finish_reason == "abort"``: the request was
    aborted and produces nothing more."""

    uid: int
    token_id: int
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache


@_register
@dataclass
class BatchTokenMsg:
    tokens: list[TokenMsg]


# ---- detokenizer -> API server ---------------------------------------------------------------
@_register
@dataclass
class ReplyMsg:
    """What a request produced since its last reply: new tokens and the text they complete."""

    uid: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0


@_register
@dataclass
class BatchReplyMsg:
    replies: list[ReplyMsg]


# ---- any stage -> API server -----------------------------------------------------------------
@_register
@dataclass
class ErrorMsg:
    """A request was refused (bad input) before producing anything; ``status`` is the HTTP code."""

    uid: int
    message: str
    status: int = 400
    code: str | None = None
    param: str | None = None


@_register
@dataclass
class StatsMsg:
    uid: int
    stats: dict[str, Any] = field(default_factory=dict)


@_register
@dataclass
class ReadyMsg:
    """A worker is up. The scheduler's carries what the API server must know about the model; the
    tokenizer's carries its EOS ids to the scheduler, which forwards it."""

    who: str
    info: dict[str, Any] = field(default_factory=dict)


def _default(obj: Any) -> Any:
    if is_dataclass(obj) and type(obj).__name__ in _TYPES:
        d = {f.name: getattr(obj, f.name) for f in fields(obj)}
        d[_TAG] = type(obj).__name__
        return d
    raise TypeError(f"cannot encode {type(obj).__name__} in a message")


def _object_hook(d: dict) -> Any:
    name = d.pop(_TAG, None)
    return d if name is None else _TYPES[name](**d)


def encode(msg: Any) -> bytes:
    return msgpack.packb(msg, default=_default)


def decode(data: bytes) -> Any:
    return msgpack.unpackb(data, object_hook=_object_hook, strict_map_key=False)


__all__ = [
    "AbortMsg",
    "Addresses",
    "BatchReplyMsg",
    "BatchTokenMsg",
    "ErrorMsg",
    "GenerateMsg",
    "ReadyMsg",
    "ReplyMsg",
    "StatsMsg",
    "StatsReqMsg",
    "TokenMsg",
    "TokenizeMsg",
    "decode",
    "encode",
]
