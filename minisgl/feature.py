"""Features: what a request may ask for besides its next tokens, attached to the scheduler and the
engine through two small protocols, so neither names a feature.

A ``Feature`` (a grammar's mask, logprobs, speculative decoding: each in its own folder) is told of each
request's life and of each batch's, at fixed points of the scheduler's step; every hook has a default
that does nothing, so a feature writes only those it needs. The scheduler builds the features of
``FEATURES`` whose factory returns one for its config, and calls them in that order (a mask before the
logprobs that must see it)::

    make_request  validate(req)          may refuse it (RequestError) or start work for it (a compile)
    add / step    ready(req)             a request joins the queue once every feature is ready for it,
                  error(req, wait)       or is refused (the work failed)
                  track(req)             it is in the scheduler
    finish/abort  release(req)           it is gone (so is its per-request state)
    retract       retract(req)           it waits again, its KV in the cache
    schedule      before_decode(reqs)    may hold requests back from a decode step, or grow them (drafts)
                  decode_batch(reqs)     may run its own batch instead of a decode batch (a verify pass)
    prepare       plan(batch) -> state   per-batch state, kept in ``batch.features[name]``
    launch        hooks(batch, state)    what the forward pass computes besides tokens (``SampleHooks``)
                  forward(...)           may run the pass itself (a verify pass)
                  launched(batch, state) its results start their way to the host
    process       processing(batch, state)
                  tokens(...)            the row's new tokens (one sampled, or a verify pass's)
                  on_token(...)          adds to the token's event; may end the request
    /stats        report() -> dict

``SampleHooks`` is what ``Engine.forward_batch`` calls around sampling: with the final hidden states
(of every position, when asked: prompt logprobs), with the logits before sampling (a mask changes them
in place), and with the sampled tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minisgl.core import Batch, Req, RequestError, TokenEvent
from minisgl.registry import Registry


class SampleHooks:
    needs_hidden = False  # on_hidden wants every position's final hidden state, not only each request's last

    def on_hidden(self, hidden: torch.Tensor, lm_head) -> None: ...

    def on_logits(self, logits: torch.Tensor) -> None:
        """``[batch, vocab]`` before sampling; may change them in place."""

    def on_tokens(self, tokens: torch.Tensor) -> None: ...


class HookList(SampleHooks):
    """Several features' hooks, called in order."""

    def __init__(self, hooks: list[SampleHooks]):
        self.hooks = hooks
        self.needs_hidden = any(h.needs_hidden for h in hooks)

    def on_hidden(self, hidden: torch.Tensor, lm_head) -> None:
        for h in self.hooks:
            h.on_hidden(hidden, lm_head)

    def on_logits(self, logits: torch.Tensor) -> None:
        for h in self.hooks:
            h.on_logits(logits)

    def on_tokens(self, tokens: torch.Tensor) -> None:
        for h in self.hooks:
            h.on_tokens(tokens)


class Feature:
    name = "feature"

    def validate(self, req: Req) -> None:
        """Raise ``RequestError`` if ``req`` can never run; start any work it needs."""

    def ready(self, req: Req) -> bool:
        return True

    def error(self, req: Req, wait: bool = True) -> RequestError | None:
        """Why ``req`` cannot run after all (its work failed), else None; ``wait`` for the work first."""
        return None

    def track(self, req: Req) -> None: ...

    def release(self, req: Req) -> None: ...

    def retract(self, req: Req) -> None: ...

    def before_decode(self, decodable: list[Req]) -> None:
        """Before a decode step is planned (and room made for it): may drop requests from ``decodable``
        (in place) for this step, or grow their ``device_len`` (drafts to verify)."""

    def decode_batch(self, decodable: list[Req]) -> Batch | None:
        """A batch to run instead of the decode batch of ``decodable`` (after room was made), or None."""
        return None

    def plan(self, batch: Batch) -> Any:
        """Per-batch state (None: nothing to do); called before the requests' counters advance."""
        return None

    def hooks(self, batch: Batch, state: Any, token_pool: torch.Tensor) -> SampleHooks | None:
        return None

    def forward(self, batch: Batch, state: Any, info: Any, hooks: SampleHooks | None) -> torch.Tensor | None:
        """Run the batch's pass itself; return what ``tokens`` then reads per row (None: the engine's)."""
        return None

    def launched(self, batch: Batch, state: Any) -> None: ...

    def processing(self, batch: Batch, state: Any) -> None: ...

    def tokens(self, batch: Batch, state: Any, row: int, req: Req, sampled: Any) -> list[int] | None:
        """The new tokens of batch row ``row`` from its host result (None: the token sampled)."""
        return None

    def on_token(self, batch: Batch, state: Any, row: int, req: Req, event: TokenEvent) -> None: ...

    def report(self) -> dict:
        """What ``GET /stats`` shows of this feature, under its name."""
        return {}


# name -> "module:create", create(config, engine, scheduler) -> Feature | None (None: not asked for), in order
FEATURES: Registry[Any] = Registry(
    "feature",
    {
        "grammar": "minisgl.grammar.manager:create",
        "logprobs": "minisgl.logprobs.feature:create",
        "penalties": "minisgl.penalties:create",  # after logprobs: those are the model's distribution, as vLLM's
        "speculative": "minisgl.speculative.feature:create",
    },
)


def build_features(config, engine, scheduler) -> list[Feature]:
    made = (FEATURES.get(name)(config, engine, scheduler) for name in FEATURES.ordered())
    return [f for f in made if f is not None]


class Offered:
    """Requests made (and validated) but not yet queued: they wait until every feature is ready for them
    (a grammar's compile runs on a thread; the scheduler steps meanwhile)."""

    def __init__(self, features: list[Feature], queue: Callable[[Req], Any]):
        self.features, self.queue, self.reqs = features, queue, []

    def __len__(self) -> int:
        return len(self.reqs)

    def add(self, req: Req) -> None:
        """Offer ``req`` (made by ``Scheduler.make_request``, which started its features' work)."""
        self.reqs.append(req)

    def admit(self, wait: bool = False, together: bool = False) -> list[tuple[Req, RequestError]]:
        """Queue the requests every feature is ready for (``wait``: all, once their work is done); return
        those refused (their work failed), whom the features let go. ``together``: if any is refused, queue
        none of them (``LLM.generate`` refuses a whole call)."""
        ready, refused, left = [], [], []
        for req in self.reqs:
            if not wait and not all(f.ready(req) for f in self.features):
                left.append(req)
            elif (err := next((e for f in self.features if (e := f.error(req, wait)) is not None), None)) is None:
                ready.append(req)
            else:
                refused.append((req, err))
        self.reqs = left
        if refused and together:
            ready, refused = [], refused + [(r, None) for r in ready]
        for req, _ in refused:
            release(self.features, req)
        for req in ready:
            self.queue(req)
        return [(r, e) for r, e in refused if e is not None]

    def remove(self, uid: int) -> bool:
        """Drop the request ``uid`` (aborted before it was queued: its work stops); False if not here."""
        req = next((r for r in self.reqs if r.uid == uid), None)
        if req is not None:
            self.reqs.remove(req)
            release(self.features, req)
        return req is not None


def release(features: list[Feature], req: Req) -> None:
    for f in features:
        f.release(req)
