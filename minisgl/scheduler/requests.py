"""The one place where a request is checked and its defaults resolved, for the offline ``LLM`` and
the server alike: one rule and one error text for each way a request can be wrong."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from minisgl.core import Req, RequestError, SamplingParams
from minisgl.engine.engine import Engine
from minisgl.scheduler.cache import CacheManager


def make_request(
    uid: int,
    input_ids: list[int],
    sampling: SamplingParams,
    engine: Engine,
    cache: CacheManager,
    draw_seed: Callable[[], int],
) -> Req:
    """A ``Req`` whose ``max_tokens`` is resolved (left out: the rest of the context, or of the whole
    KV pool if smaller) and whose seed is set (``draw_seed()`` for an unseeded request, called only
    for a valid one). Raises ``RequestError`` naming the field and what to change."""
    sampling.validate()
    n, vocab = len(input_ids), engine.model_config.vocab_size
    if n == 0:
        raise RequestError("the prompt is empty: give at least one token", "prompt")
    bad = next((t for t in input_ids if not isinstance(t, int) or not 0 <= t < vocab), None)
    if bad is not None:
        raise RequestError(f"prompt token ids must be in [0, {vocab}); got {bad!r}", "prompt")
    bad = next((t for t in sampling.stop_token_ids if not isinstance(t, int) or not 0 <= t < vocab), None)
    if bad is not None:
        raise RequestError(f"stop_token_ids must be in [0, {vocab}); got {bad!r}", "stop_token_ids")
    max_len, pool = engine.max_seq_len, engine.num_pages * cache.page_size
    if n >= max_len:
        raise RequestError(
            f"the prompt has {n} tokens but this model's context is {max_len} tokens (prompt + output); "
            "shorten the prompt",
            "prompt",
            code="context_length_exceeded",
        )
    max_tokens = sampling.max_tokens
    if max_tokens is None:  # left out: the rest of the context (or of the whole pool, if smaller)
        max_tokens = max(1, min(max_len, pool) - n)
    elif n + max_tokens > max_len:  # asked for: refused, not cut short (as OpenAI does)
        raise RequestError(
            f"the prompt has {n} tokens and max_tokens is {max_tokens}, {n + max_tokens} in all, but this "
            f"model's context is {max_len} tokens (prompt + output); lower max_tokens or shorten the prompt",
            "max_tokens",
            code="context_length_exceeded",
        )
    seed = sampling.seed if sampling.seed is not None else draw_seed()
    req = Req(uid, list(input_ids), replace(sampling, max_tokens=max_tokens), seed)
    need = cache.pages_still_needed(req)
    if need > engine.num_pages:
        raise RequestError(
            f"the request needs {need * cache.page_size} KV slots (prompt {n} + max_tokens) but the whole KV "
            f"pool holds {pool}; lower max_tokens, shorten the prompt or give the pool more memory "
            "(--num-pages / --memory-ratio)",
            "max_tokens",
        )
    return req
