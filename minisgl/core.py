"""The data model: sampling parameters, a request, a batch, a token a step yields, and the error a bad
request raises.

The life of a request, in lengths (positions are token indices in the request's sequence)::

    prompt tokens                          sampled tokens
    |<------------- prompt_len ------------->|<-- outputs -->|
    |<--- cached_len: KV in the pool --->|                   |
    |<------------------------- device_len ----------------->|  tokens in the token pool
                                         [cached_len, device_len) is what the next
                                         forward pass extends (all of it or a chunk)

Invariant: ``cached_len < device_len <= max_device_len``. A prefill (or a chunk of one) extends
``[cached_len, cached_len + chunk)``; when a pass reaches ``device_len`` the sampled token is kept
and ``device_len`` grows by one. A decode pass extends exactly one token. The scheduler moves these
counters when it *schedules* a batch (so the next batch can be planned before this one finishes,
which overlap scheduling needs); outputs are appended when the sampled token reaches the host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch


class RequestError(ValueError):
    """A request that cannot run, and why: the one error every entry point (``LLM``, the server)
    reports. ``param`` names the offending field; ``code`` is OpenAI's error code, if it has one."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


GREEDY_BELOW = 1e-5  # a temperature below this samples greedily (SamplingParams)
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs


# vLLM's SamplingParams fields minisgl does not implement -> what to use instead (refused unless None)
NOT_IMPLEMENTED = {
    "best_of": "use n",
    "use_beam_search": "sample with n",
    "min_p": "use top_p or top_k",
    "logit_bias": "constrain with regex or ebnf",
    "allowed_token_ids": "constrain with regex or ebnf",
    "bad_words": "constrain with regex or ebnf",
    "guided_decoding": "use json_schema, regex or ebnf",
    "logits_processors": "register a sampler (minisgl/engine/sample.py)",
    "truncate_prompt_tokens": "shorten the prompt",
}


@dataclass
class SamplingParams:
    """How to pick tokens. ``temperature == 0`` means greedy, and so does any temperature below
    ``GREEDY_BELOW`` (1e-5, vLLM's and SGLang's bound): dividing logits by it would overflow float32
    (1e-45 is a float32 denormal), and its distribution is one-hot anyway. ``top_k <= 0`` and
    ``top_p == 1`` disable those filters; the most likely token always passes top-p (a ``top_p`` that
    rounds to 0 in float32, such as 1e-46, keeps it alone). ``seed`` makes a sampled request
    repeatable whatever it is batched with.
    ``max_tokens=None`` (left out): up to the end of the context (or of the KV pool, whichever is
    smaller); a prompt plus a given ``max_tokens`` beyond the context is refused, as OpenAI does."""

    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    max_tokens: int | None = 256
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    # what to report besides the tokens (minisgl/logprobs/): log-probabilities of the model's
    # distribution after the grammar mask, before temperature / top-k / top-p (vLLM's default)
    logprobs: bool | int = False  # each output token's logprob (an int: vLLM's, see below)
    top_logprobs: int = 0  # and the this many most likely tokens at each step (0..MAX_TOP_LOGPROBS)
    prompt_logprobs_from: int = -1  # score prompt tokens [from, prompt_len) too; -1: none (token 0 never has one)
    # constrained decoding (minisgl/grammar/): at most one of these
    json_schema: str | None = None  # a JSON schema, as JSON text ("{}": any JSON value)
    regex: str | None = None
    ebnf: str | None = None  # a grammar in xgrammar's EBNF, with a ``root`` rule
    # with --speculative-algorithm: False opts this request out (it decodes one token per step). Requests
    # that sample plainly (``plain_sampling``) never draft either (minisgl/speculative/feature.py)
    speculative: bool = True
    # vLLM's: LLM.generate makes n requests per prompt, cuts the text at stop strings and turns an int logprobs
    # (top tokens per step) or prompt_logprobs into the fields above; the rest is minisgl/penalties.py's
    n: int = 1
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    prompt_logprobs: int | None = None
    min_tokens: int = 0  # EOS and stop_token_ids cannot be sampled before this many output tokens
    presence_penalty: float = 0.0  # subtracted from the logit of every token the output holds
    frequency_penalty: float = 0.0  # subtracted once per occurrence in the output
    repetition_penalty: float = 1.0  # divides (positive) or multiplies logits of prompt and output tokens

    def __new__(cls, *args: Any, **kwargs: Any) -> SamplingParams:
        for name in sorted(k for k, v in kwargs.items() if k in NOT_IMPLEMENTED and v is not None):
            raise RequestError(f"{name} is not supported: {NOT_IMPLEMENTED[name]}", name)
        return super().__new__(cls)

    def validate(self) -> None:
        """Raise ``RequestError`` naming the field and what to change."""
        m = self.max_tokens
        if m is not None and (not isinstance(m, int) or isinstance(m, bool) or m <= 0):
            raise RequestError(f"max_tokens must be a positive integer, got {m!r}", "max_tokens")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise RequestError(f"temperature must be >= 0 (0 means greedy), got {self.temperature!r}", "temperature")
        if not (0.0 < self.top_p <= 1.0):
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p!r}", "top_p")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool):
            raise RequestError(f"top_k must be an integer (<= 0 disables it), got {self.top_k!r}", "top_k")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise RequestError(f"seed must be a non-negative integer, got {self.seed!r}", "seed")
        if not (isinstance(self.top_logprobs, int) and 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS):
            bound = f"[0, {MAX_TOP_LOGPROBS}]"
            raise RequestError(f"top_logprobs must be in {bound}, got {self.top_logprobs!r}", "top_logprobs")
        for name in ("logprobs", "prompt_logprobs"):  # logprobs: a bool (ours) or vLLM's count of top tokens
            v = getattr(self, name)
            if not (v is None or isinstance(v, bool) or (isinstance(v, int) and 0 <= v <= MAX_TOP_LOGPROBS)):
                raise RequestError(f"{name} must be a count in [0, {MAX_TOP_LOGPROBS}], got {v!r}", name)
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise RequestError(f"n must be a positive integer, got {self.n!r}", "n")
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if not (isinstance(stops, list) and all(isinstance(x, str) and x for x in stops)):
            raise RequestError(f"stop must be a non-empty string or a list of them, got {self.stop!r}", "stop")
        if not (isinstance(self.min_tokens, int) and 0 <= self.min_tokens <= (m or self.min_tokens)):
            raise RequestError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens!r}", "min_tokens")
        for name in ("presence_penalty", "frequency_penalty"):
            if not (isinstance(v := getattr(self, name), (int, float)) and -2 <= v <= 2):
                raise RequestError(f"{name} must be in [-2, 2] (0: off), got {v!r}", name)
        if not (isinstance(r := self.repetition_penalty, (int, float)) and 0 < r < math.inf):
            raise RequestError(f"repetition_penalty must be > 0 (1: off), got {r!r}", "repetition_penalty")
        if not isinstance(self.prompt_logprobs_from, int) or self.prompt_logprobs_from < -1:
            raise RequestError("prompt_logprobs_from must be -1 (none) or a position >= 0", "prompt_logprobs_from")
        if not isinstance(self.speculative, bool):
            raise RequestError(f"speculative must be true or false, got {self.speculative!r}", "speculative")
        if sum(g is not None for g in (self.json_schema, self.regex, self.ebnf)) > 1:
            raise RequestError("give at most one of json_schema, regex and ebnf", "json_schema")

    @property
    def grammar(self) -> tuple[str, str] | None:
        """``(kind, text)`` of the constraint (kind: ``json_schema``, ``regex`` or ``ebnf``), or None."""
        for kind in ("json_schema", "regex", "ebnf"):
            if (text := getattr(self, kind)) is not None:
                return kind, text
        return None

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs or self.top_logprobs > 0

    @property
    def penalized(self) -> bool:  # its logits change before sampling (minisgl/penalties.py)
        pen = self.presence_penalty, self.frequency_penalty, self.repetition_penalty
        return self.min_tokens > 0 or pen != (0, 0, 1)

    @property
    def plain_sampling(self) -> bool:
        """Every sampled token is computed on (a grammar's mask, its logprob, a penalty): the request
        samples one token a step, as a decode step does (it never drafts)."""
        return self.grammar is not None or self.wants_logprobs or self.penalized

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW or self.top_k == 1


FinishReason = Literal["stop", "length", "abort"]


@dataclass(eq=False)
class Req:
    """One request inside the scheduler. ``eq=False``: requests compare (and hash) by identity.

    Its counters change only through the methods below, in this order: ``admit`` (a row and a
    cached prefix), then per batch ``extend_to`` (and ``grow_alloc`` for new KV pages), per sampled
    token ``append_token``, and ``finish`` once. ``retract`` (memory ran out) sends it back to the
    waiting queue: it keeps its outputs, and its next admission prefills ``fill_ids`` (prompt and
    outputs) before it decodes on. ``sampling.max_tokens`` is resolved (never None)."""

    uid: int
    input_ids: list[int]
    sampling: SamplingParams
    seed: int  # the sampling seed actually used (SamplingParams.seed or one drawn at submission)
    table_idx: int = -1  # row in the request table (page table + token pool)
    cached_len: int = 0
    device_len: int = 0
    max_device_len: int = 0
    output_ids: list[int] = field(default_factory=list)
    cache_handle: Any = None  # prefix-cache handle of the locked matched prefix
    alloc_len: int = 0  # positions [0, alloc_len) have KV slots in the page table
    hit_len: int = 0  # prompt tokens served from the prefix cache at (first) admission
    locked_len: int = 0  # positions [0, locked_len) are the cache's, locked by cache_handle
    finish_reason: FinishReason | None = None
    epoch: int = 0  # times retracted: a batch planned before a retraction drops this request's token
    # prompt logprobs: (logprob, top) of prompt tokens [first scored, next_scored), filled by prefill passes
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    next_scored: int = 0  # the next prompt token whose logprob is owed (prompt_len: none)

    def __post_init__(self) -> None:
        self.device_len = len(self.input_ids)
        self.max_device_len = len(self.input_ids) + self.sampling.max_tokens
        start = self.sampling.prompt_logprobs_from
        self.next_scored = len(self.input_ids) if start < 0 else min(max(start, 1), len(self.input_ids))

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids)

    @property
    def num_scheduled_outputs(self) -> int:
        """Tokens sampled or being sampled on the device (>= len(output_ids))."""
        return self.device_len - self.prompt_len

    @property
    def can_decode(self) -> bool:
        """True while one more decode step may still produce a wanted token."""
        return self.finish_reason is None and self.device_len < self.max_device_len

    @property
    def is_admitted(self) -> bool:
        return self.table_idx >= 0

    def all_token_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def match_limit(self) -> int:
        """How many leading tokens of ``fill_ids`` a prefix-cache hit may cover: all but the last (its
        logits are needed), and none whose logits a prompt logprob still needs (position p scores p + 1)."""
        n = len(self.fill_ids) - 1
        return min(n, self.next_scored - 1) if self.next_scored < self.prompt_len else n

    @property
    def fill_ids(self) -> list[int]:
        """What an admission must put in the KV cache before decoding: the prompt, and the outputs
        of a retracted request (``len(fill_ids) == device_len`` while it waits)."""
        return self.input_ids + self.output_ids if self.output_ids else self.input_ids

    # ---- state changes -----------------------------------------------------------------------
    def admit(self, row: int, hit_len: int, handle: Any) -> None:
        """Takes request-table ``row``; its first ``hit_len`` tokens come from the prefix cache,
        locked by ``handle`` (their KV is written: prefill starts after them)."""
        self.table_idx, self.cache_handle = row, handle
        self.locked_len = self.cached_len = self.alloc_len = hit_len
        if self.epoch == 0:  # a re-admission's hit is mostly its own retracted KV: not a prompt hit
            self.hit_len = hit_len

    def extend_to(self, end: int) -> bool:
        """A batch computes positions ``[cached_len, end)``. Returns whether its sample is kept:
        only a pass that reaches ``device_len`` (not a mid-prompt chunk), which then grows by one."""
        assert self.cached_len < end <= self.device_len, (self.cached_len, end, self.device_len)
        self.cached_len = end
        if end < self.device_len:
            return False
        self.device_len += 1
        return True

    def grow_alloc(self, alloc_len: int) -> None:
        """Positions ``[0, alloc_len)`` now have KV slots."""
        self.alloc_len = max(self.alloc_len, alloc_len)

    def relock(self, locked_len: int, handle: Any) -> None:
        """The prefix cache now owns (and this request locks) positions ``[0, locked_len)``."""
        self.locked_len, self.cache_handle = locked_len, handle

    def append_token(self, token_id: int, eos_ids: set[int]) -> FinishReason | None:
        """A sampled token reached the host; returns the finish reason if it is the last one."""
        self.output_ids.append(token_id)
        s = self.sampling
        if token_id in s.stop_token_ids or (not s.ignore_eos and token_id in eos_ids):
            return "stop"
        if self.prompt_len + len(self.output_ids) >= self.max_device_len:
            return "length"
        return None

    def retract(self) -> None:
        """Memory ran out: it gave back its row and KV (and drops a token still in flight). It
        waits again, to prefill its prompt and outputs so far and decode on from there."""
        self.table_idx, self.cache_handle = -1, None
        self.cached_len = self.alloc_len = self.locked_len = 0
        self.device_len = self.prompt_len + len(self.output_ids)
        self.epoch += 1

    def finish(self, reason: FinishReason) -> None:
        """Done: it holds no row any more (its memory was released or cached)."""
        self.finish_reason, self.table_idx = reason, -1


@dataclass
class TokenEvent:
    """One sampled token of a request; ``finish_reason`` is set on its last one."""

    uid: int
    token_id: int
    finish_reason: str | None = None
    # with SamplingParams.logprobs / top_logprobs: this token's logprob and the most likely tokens'
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    # with SamplingParams.prompt_logprobs_from (on the first token): (logprob, top) per scored prompt token
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None


@dataclass(eq=False)
class Batch:
    """One forward pass. ``reqs[i]`` extends positions ``[starts[i], ends[i])``.

    ``phase`` is ``"prefill"`` when any request extends more than its last token (or is a first
    chunk), else ``"decode"``. Tensors below are filled by the scheduler before the forward pass;
    ``attn_metadata`` by the attention backend, once per batch."""

    reqs: list[Req]
    phase: Literal["prefill", "decode"]
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    # rows that sample a kept token (their pass reaches device_len); others are mid-prompt chunks
    sample_mask: list[bool] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)  # each request's epoch when the batch was planned
    input_ids: torch.Tensor | None = None  # [num_tokens] on device
    positions: torch.Tensor | None = None  # [num_tokens]
    out_loc: torch.Tensor | None = None  # [num_tokens] KV slot of each new token
    table_idx: torch.Tensor | None = None  # [padded_size] request-table rows
    logit_idx: torch.Tensor | None = None  # [padded_size] index of each request's last token
    attn_metadata: Any = None
    padded_size: int = 0  # >= len(reqs) when a CUDA graph pads the batch
    riders: int = 0  # the last ``riders`` rows of a prefill batch are decoding requests' next tokens
    features: dict[str, Any] = field(default_factory=dict)  # per-batch state of each feature (minisgl/feature.py)
    label: str | None = None  # a feature's own kind of pass (speculative decoding's "verify"), else None

    @property
    def size(self) -> int:
        return len(self.reqs)

    @property
    def is_prefill(self) -> bool:
        return self.phase == "prefill"

    @property
    def is_decode(self) -> bool:
        return self.phase == "decode"

    @property
    def num_tokens(self) -> int:
        return sum(e - s for s, e in zip(self.starts, self.ends))
