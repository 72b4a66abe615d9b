"""Messages between the server's processes, and their wire format.

Every message is a dataclass named ``*Msg``; :func:`encode` / :func:`decode` turn one into msgpack
bytes and back (nested dataclasses included, tagged with their class name). One ZMQ PUSH/PULL
pipe per hop, so messages on a hop arrive in the order they were sent::

    API server --TokenizeMsg, AbortMsg, StatsReqMsg, FlushCacheReqMsg, TextReqMsg, PingMsg--> tokenizer
    tokenizer  --ReadyMsg, GenerateMsg, AbortMsg, StatsReqMsg, FlushCacheReqMsg, PingMsg--> scheduler (rank 0)
    tokenizer  --ErrorMsg, TextMsg-------------------> API server   (bad input caught early; /v1/tokenize)
    scheduler  --BatchTokenMsg, ErrorMsg, StatsMsg, ReadyMsg, PingMsg, BusyMsg--> detokenizer
    detokenizer --BatchReplyMsg (+ the others, forwarded as they are)--> API server

Because ``AbortMsg`` follows the request's own message down the same pipes, an abort can never
overtake the request it cancels; for the same reason a ``PingMsg`` that comes back has passed
every stage's loop.

:func:`decode` trusts nothing: whatever the bytes, it returns a message whose every field has its
declared type, or raises :class:`BadMessage`.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Union, get_args, get_origin, get_type_hints

import msgpack

from minisgl.core import SamplingParams


@dataclass(frozen=True)
class Addresses:
    """The ZMQ endpoints, one PULL socket per process (bound by the process that reads it).

    ``ipc://`` (Unix domain) sockets in one folder that only the server's user may enter
    (``minisgl.server.ipc``): no TCP port and no abstract-namespace name that any local user
    could connect to."""

    tokenizer: str
    scheduler: str
    detokenizer: str
    frontend: str

    @classmethod
    def under(cls, prefix: str) -> Addresses:
        return cls(*(f"ipc://{prefix}/{name}" for name in ("tokenizer", "scheduler", "detokenizer", "frontend")))


@dataclass
class TokenLogprobs:
    """Logprobs of some tokens of a request (``minisgl/logprobs/``), inside a ``TokenMsg`` or
    ``ReplyMsg``. Prompt logprobs: ``token_ids`` is the whole prompt and the lists are aligned with
    its last ``len(logprobs)`` tokens (the first token is never scored)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)  # the most likely tokens at each step
    top_vals: list[list[float]] = field(default_factory=list)

    def extend(self, other: TokenLogprobs) -> None:
        self.token_ids += other.token_ids
        self.logprobs += other.logprobs
        self.top_ids += other.top_ids
        self.top_vals += other.top_vals


_TAG = "__msg__"
_TYPES: dict[str, type] = {"SamplingParams": SamplingParams, "TokenLogprobs": TokenLogprobs}  # may appear on the wire
_MESSAGES: list[type] = []  # what may be a whole frame


def _register(cls: type) -> type:
    _TYPES[cls.__name__] = cls
    _MESSAGES.append(cls)
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
    messages: list[dict[str, Any]] | None = None  # chat: the template is applied by the tokenizer
    tools: list[dict[str, Any]] | None = None  # a chat's tools, for its template (minisgl/toolcall/render.py)


@_register
@dataclass
class AbortMsg:
    uid: int


@_register
@dataclass
class StatsReqMsg:
    uid: int  # the reply (StatsMsg) carries it back


@_register
@dataclass
class FlushCacheReqMsg:
    """Empty the prefix cache (``POST /flush_cache``). The scheduler answers with a ``StatsMsg`` of the
    same uid (``{"flushed": bool, "message": str, "freed_tokens": int}``): the reply travels the stats
    path, through the detokenizer, so no stage needs a new kind of message to pass on."""

    uid: int


@_register
@dataclass
class TextReqMsg:
    """``/v1/tokenize`` (``texts`` set) or ``/v1/detokenize`` (``token_ids`` set): exactly one of them.
    The tokenizer worker, which holds the tokenizer, answers with a ``TextMsg`` straight to the API
    server; nothing reaches the scheduler."""

    uid: int
    texts: list[str] | None = None
    token_ids: list[list[int]] | None = None
    add_special_tokens: bool = True  # encoding: the BOS (etc.) the model's tokenizer adds
    skip_special_tokens: bool = True  # decoding: leave special tokens out of the text


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
    logprobs: TokenLogprobs | None = None  # this token's (SamplingParams.logprobs / top_logprobs)
    prompt_logprobs: TokenLogprobs | None = None  # on the first token (SamplingParams.prompt_logprobs_from)


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
    logprobs: TokenLogprobs | None = None  # of token_ids, when asked for
    prompt_logprobs: TokenLogprobs | None = None  # on the first reply, when asked for
    pieces: dict[int, list[int]] | None = None  # the bytes of each token id the logprobs name


@_register
@dataclass
class BatchReplyMsg:
    replies: list[ReplyMsg]


# ---- any stage -> API server -----------------------------------------------------------------
@_register
@dataclass
class ErrorMsg:
    """A request was refused (bad input) before producing anything; ``status`` is the HTTP code,
    always an error code (400..599)."""

    uid: int
    message: str
    status: int = 400
    code: str | None = None
    param: str | None = None

    def __post_init__(self) -> None:
        if not (type(self.status) is int and 400 <= self.status < 600):
            raise ValueError(f"ErrorMsg.status must be an HTTP error code, got {self.status!r}")


@_register
@dataclass
class StatsMsg:
    """The scheduler's answer to a ``StatsReqMsg`` or a ``FlushCacheReqMsg``."""

    uid: int
    stats: dict[str, Any] = field(default_factory=dict)


@_register
@dataclass
class TextMsg:
    """The tokenizer worker's answer to a ``TextReqMsg``: one entry per input (``token_ids`` for
    texts, ``texts`` for token ids), or ``error`` (the input's fault: a 400) and nothing else."""

    uid: int
    token_ids: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    error: str | None = None


@_register
@dataclass
class ReadyMsg:
    """A worker is up. The scheduler's carries what the API server must know about the model; the
    tokenizer's carries its EOS ids to the scheduler, which forwards it."""

    who: str
    info: dict[str, Any] = field(default_factory=dict)


# ---- liveness (minisgl.server.frontend: /health) ---------------------------------------------
@_register
@dataclass
class PingMsg:
    """The API server's heartbeat. It travels tokenizer -> scheduler -> detokenizer -> API server
    like a request, so its return proves that every stage's loop still runs."""

    seq: int


@_register
@dataclass
class BusyMsg:
    """From a thread of the scheduler (rank 0) while its loop is inside one long step (a long
    prefill, a first-time kernel compile): the process is alive, pings are merely delayed."""

    step_s: float  # how long the current step has run


def _default(obj: Any) -> Any:
    if is_dataclass(obj) and type(obj).__name__ in _TYPES:
        d = {f.name: getattr(obj, f.name) for f in fields(obj)}
        d[_TAG] = type(obj).__name__
        return d
    raise TypeError(f"cannot encode {type(obj).__name__} in a message")


def _object_hook(d: dict) -> Any:
    name = d.pop(_TAG, None)
    return d if name is None else _TYPES[name](**d)


class BadMessage(ValueError):
    """A frame that is not a well-formed message of a kind its receiver accepts."""


_HINTS = {cls: get_type_hints(cls) for cls in _TYPES.values()}  # field name -> declared type
_INT64 = 1 << 63  # ints must fit an int64 (token ids, seeds and top_k become tensors)


def _conforms(v: Any, hint: Any) -> bool:
    """``v`` has the type ``hint`` (as written in a message's fields), all the way down."""
    if hint is Any:
        return True
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_conforms(v, h) for h in get_args(hint))
    if origin is list:
        (item,) = get_args(hint)
        if type(v) is not list:
            return False
        if item is int:  # token ids: the long lists, checked without a call per element
            return all(type(x) is int for x in v) and (not v or (-_INT64 <= min(v) and max(v) < _INT64))
        return all(_conforms(x, item) for x in v)
    if origin is dict:
        key, item = get_args(hint)
        return type(v) is dict and all(_conforms(k, key) and _conforms(x, item) for k, x in v.items())
    if hint is int:
        return type(v) is int and -_INT64 <= v < _INT64
    if hint is float:
        return type(v) in (int, float)  # msgpack keeps 0 an int; bool is neither
    if hint in (str, bool, type(None)):
        return type(v) is hint
    if hint in _HINTS:
        return type(v) is hint and all(_conforms(getattr(v, n), h) for n, h in _HINTS[hint].items())
    return False


def encode(msg: Any) -> bytes:
    return msgpack.packb(msg, default=_default)


def decode(data: bytes, accept: tuple[type, ...] = ()) -> Any:
    """The message in ``data``, one of ``accept`` (default: any ``*Msg``). Raises ``BadMessage``,
    and nothing else, for anything but such a message with every field of its declared type:
    bytes that are not msgpack, an unknown tag, missing or extra fields, a field of another type."""
    try:
        msg = msgpack.unpackb(data, object_hook=_object_hook, strict_map_key=False)
    except Exception as e:  # msgpack's own errors, and the constructors' (fields missing or extra)
        raise BadMessage(f"undecodable ({type(e).__name__}: {str(e)[:200]})") from None
    if type(msg) not in (accept or _MESSAGES):
        raise BadMessage(f"unexpected {type(msg).__name__}")
    if not _conforms(msg, type(msg)):
        raise BadMessage(f"{type(msg).__name__} with a field of the wrong type")
    return msg


__all__ = [
    "AbortMsg",
    "Addresses",
    "BadMessage",
    "BatchReplyMsg",
    "BatchTokenMsg",
    "BusyMsg",
    "ErrorMsg",
    "FlushCacheReqMsg",
    "GenerateMsg",
    "PingMsg",
    "ReadyMsg",
    "ReplyMsg",
    "StatsMsg",
    "StatsReqMsg",
    "TextMsg",
    "TextReqMsg",
    "TokenLogprobs",
    "TokenMsg",
    "TokenizeMsg",
    "decode",
    "encode",
]
