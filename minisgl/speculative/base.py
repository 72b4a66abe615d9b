"""The speculative-decoding seam: a ``Drafter`` guesses a request's next tokens, a ``Verifier`` decides
which of them the target model's logits accept. Lab 15 implements the verifier.

One speculative step of a request whose last token sits at position ``n - 1``::

    token pool:   ... t[n-1] | d0  d1  ...  d(k-1)          drafts written after the real tokens
    verify pass:      [n-1,   n,  n+1, ...,  n+k-1]         k + 1 positions, one forward pass
    logits row j:     predicts the token at n + j, given t[n-1] and d0..d(j-1)
    verdict:          accepted a in [0, k] drafts, then one more token (a correction or the bonus)

The first ``a`` drafts are output as they are; the token at ``n + a`` comes from row ``a``'s logits
(the draft was rejected there, or every draft passed and row ``k`` gives a free "bonus" token). So a
step outputs ``a + 1`` tokens for one pass, and never fewer than a plain decode step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, NamedTuple

from minisgl.registry import Registry

if TYPE_CHECKING:
    import torch

    from minisgl.core import Req
    from minisgl.engine.config import EngineConfig
    from minisgl.engine.engine import Engine
    from minisgl.engine.sample import Sampler, SamplingInfo


class Drafter(ABC):
    """Proposes draft tokens for a request (registered in ``DRAFTERS``; ``--speculative-algorithm``
    names one, case-insensitively).

    Contract: ``propose(req, k)`` returns at most ``k`` token ids (``k >= 1``), the guessed
    continuation of ``req.all_token_ids()`` (prompt and every output so far: the scheduler only asks
    when all of them are on the host). An empty list means "no guess": the request decodes plainly
    this step. It must be deterministic in the request's tokens (tensor-parallel ranks each ask their
    own drafter and must propose the same tokens) and cheap: it runs on the host for every decoding
    request at every step. A drafter is a point mass: it gives tokens, not a distribution, and the
    verifier's rule relies on that.

    A drafter may keep state per request (a draft model's own KV cache); ``release`` says when to drop
    it. The request's tokens are the truth: between two ``propose`` calls for a request any of the
    drafts proposed may have been rejected (its tokens differ from the drafts from the first rejected
    one on), so such state must be checked against ``req.all_token_ids()``, never assumed from the
    last proposal."""

    @abstractmethod
    def propose(self, req: Req, k: int) -> list[int]: ...

    @classmethod
    def build(cls, config: EngineConfig, engine: Engine) -> Drafter:
        """The drafter for ``engine`` (the scheduler calls this once, with the engine's config). The
        default is ``cls()``; a drafter that needs the engine (a draft model: its path, device, dtype)
        overrides it."""
        return cls()

    def release(self, req: Req) -> None:  # noqa: B027 (an optional hook)
        """``req`` left the running requests: it finished, was aborted, or was retracted (a retracted
        request comes back later with its outputs kept, and ``propose`` must then work for it from
        scratch). Drop whatever is kept for it. Called each time it leaves, never during a ``propose``;
        a call for a request with no state must do nothing. The default keeps no state."""


class Verdict(NamedTuple):
    tokens: torch.Tensor  # [B, K + 1] int64: row r's output is tokens[r, : accepted[r] + 1]
    accepted: torch.Tensor  # [B] int64: drafts accepted, 0 <= accepted[r] <= num_drafts[r]


class Rollback(NamedTuple):
    cached_len: int  # positions whose KV holds accepted tokens: [0, cached_len)
    device_len: int  # tokens in the token pool: the cached ones and the one the next pass feeds


class Verifier(ABC):
    """Accept or reject a batch's drafts against the target model (lab 15's seam; ``VERIFIERS``).

    ``verify(logits, drafts, info, sampler)``:

    - ``logits``: ``[B, K + 1, V]`` in the model's dtype; ``logits[r, j]`` predicts row ``r``'s output
      token number ``info.steps[r] + j`` given the drafts before it (rows with fewer drafts are
      padded: only ``logits[r, : num_drafts + 1]`` mean anything).
    - ``drafts``: ``[B, K]`` int64, row ``r``'s drafts then ``-1`` padding (never accepted).
    - ``info``: the rows' sampling parameters (``minisgl/engine/sample.py``), ``steps`` as above.
    - ``sampler``: the engine's sampler; ``sampler.sample(logits2d, info2d)`` is the plain engine's
      draw, which the token after the last draft (the bonus) must be.

    Returns a ``Verdict``. What must hold:

    - ``tokens[r, j] == drafts[r, j]`` for ``j < accepted[r]``, and ``accepted[r]`` counts the
      *leading* accepted drafts only (after a rejection nothing later is accepted);
    - greedy rows (temperature 0): draft ``j`` is accepted iff it is the argmax of ``logits[r, j]``
      (as the sampler computes it), and ``tokens[r, accepted[r]]`` is that row's argmax: the output is
      exactly what plain greedy decoding gives;
    - sampled rows: each output token follows the target distribution ``p`` (after temperature, top-k,
      top-p: ``filter_logits``) given the tokens before it. For a point-mass draft ``x`` the rule is:
      accept with probability ``p(x)``; else draw from ``p`` with ``x`` removed, renormalised. A row
      with no draft left (the bonus) draws ``sampler.sample`` at ``steps + j``, so a row with no drafts
      gives the plain engine's token. Draws are counter-based on ``(seed, step)`` (``uniform``), never
      on other rows or earlier calls, so a seeded request repeats and tensor-parallel ranks agree;
    - no host synchronisation (it runs inside the launch, like the sampler).

    ``rollback(n, drafted, accepted)``: a request had ``n >= 1`` tokens before the step (the pass fed
    positions ``[n - 1, n + drafted)``) and ``0 <= accepted <= drafted`` of its drafts were accepted
    (``ValueError`` otherwise, each argument checked). Returns the request's counters after the step, a
    ``Rollback``: the KV of positions ``[0, n + accepted)`` holds its accepted tokens (at ``n + accepted``
    the pass saw a rejected draft, or nothing: it is not cached), and its token pool holds one token more,
    the verdict's last, which the next pass feeds. ``drafted == 0`` is a plain decode step's result. The
    scheduler sets ``cached_len`` and ``device_len`` to it (the KV slots of rejected drafts stay with the
    request: its next passes overwrite them)."""

    @abstractmethod
    def verify(self, logits: torch.Tensor, drafts: torch.Tensor, info: SamplingInfo, sampler: Sampler) -> Verdict: ...

    @abstractmethod
    def rollback(self, n: int, drafted: int, accepted: int) -> Rollback: ...


# name -> a Drafter class, built by ``Drafter.build`` ("ngram": prompt lookup, ngram.py; "standalone": a draft
# model, draft_model.py)
DRAFTERS: Registry[type[Drafter]] = Registry(
    "drafter",
    {
        "ngram": "minisgl.speculative.ngram:NgramDrafter",
        "standalone": "minisgl.speculative.draft_model:DraftModelDrafter",
    },
)
# name -> a Verifier class, built with no arguments (``Components.verifier``)
VERIFIERS: Registry[type[Verifier]] = Registry("verifier", {"default": "minisgl.speculative.verify:DefaultVerifier"})
