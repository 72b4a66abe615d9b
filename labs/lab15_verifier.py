"""Lab 15: speculative decoding's verify step: accept or reject a batch's drafts, the token after them,
and what to roll back.

A drafter guessed ``k`` tokens for a request; one target pass gave logits at ``k + 1`` positions. You
write the verifier that turns them into the tokens the request outputs, exactly as the plain engine
would have (greedy) or following the target's distribution (sampled), and the rollback of the request's
counters. It plugs into the engine through the seam of ``minisgl/speculative/base.py`` (read its
``Verifier`` docstring first): the grader registers ``LabVerifier`` in ``VERIFIERS`` as ``"lab15"`` and
runs the engine with ``speculative_algorithm="NGRAM"`` and ``components={"verifier": "lab15"}``. The
engine's own verifier and its helpers (``minisgl/speculative/verify.py``) are off limits (a lab that
derives from, calls or aliases them scores 0); the sampler's ``filter_logits`` and ``uniform`` and the
``sampler`` you are given are yours to use::

    drafts        d0   d1   d2   -1        (row r: 3 drafts, padded to K = 4)
    logits row    0    1    2    3    4     row j predicts output token steps[r] + j
    greedy        d0 == argmax0?  d1 == argmax1?  ...   accepted = the leading run of yes
    verdict       [d0, d1, t2, ., .]        accepted 2: two drafts, then t2 from row 2's logits

Contract (the grader compares each result with the engine's ``DefaultVerifier``; shapes: ``B`` rows,
``K`` draft slots, ``V`` tokens; ``k1 = K + 1``):

* ``per_position``: for ``k1`` positions per row, the ``SamplingInfo`` of ``B * k1`` rows, row
  ``r * k1 + j`` being position ``j`` of row ``r``: row ``r``'s temperature, top-k, top-p and seed, and
  the step of that position (row ``r``'s step plus ``j``: each position draws its own number);
  ``all_greedy``, ``need_top_k``, ``need_top_p`` as in ``info``. Example: two rows of steps ``[4, 9]``,
  ``k1 = 3`` -> steps ``[4, 5, 6, 9, 10, 11]``, the other fields each row's three times.
* ``leading_accepted(accept)``: ``[B, K]`` bool -> ``[B]`` int64, how many *leading* entries of each
  row are True (a True after a False does not count).
* ``draw_without(probs, x, u)``: ``probs`` ``[N, V]`` (float32 probabilities), ``x`` ``[N]`` int64,
  ``u`` ``[N]`` float64 in (0, 1) -> ``[N]`` int64: a draw from ``probs`` with token ``x`` removed and
  renormalised. The rule (so the grader can check each draw): over the cumulative sum of ``probs``
  with ``probs[x]`` set to 0, the token is the first ``i`` whose cumulative sum reaches ``u`` times
  the residual's total (``>=``), with ``u`` cast to float32 (the probabilities' dtype) before it is
  scaled; at most ``V - 1``. A row where ``x`` holds all the mass has a residual of zeros: the rule
  gives token 0 (never a NaN from dividing by a total of 0). Example: probs ``[0.25, 0.5, 0.25, 0]``,
  ``x = 1``, ``u = 0.5`` -> 0 (the residual's total is 0.5, and 0.25 reaches 0.5 x 0.5); ``u = 0.5 +
  1e-9`` -> 0 as well (0.5 in float32).
* ``LabVerifier.verify(logits, drafts, info, sampler)`` -> ``Verdict(tokens [B, k1], accepted [B])``:

  - ``plain``: what ``sampler.sample`` draws at every one of the ``B * k1`` positions with its own
    parameters (``per_position``): the plain engine's token there (the argmax of a greedy row);
  - a draft of ``-1`` (padding) is never accepted;
  - greedy rows (``info.temperatures[r] == 0``, each row its own): draft ``j`` passes iff it equals
    ``plain[r, j]``;
  - sampled rows: ``p`` is the softmax of the filtered logits (``filter_logits`` of the logits in
    float32) at each position, in float32; draft ``x`` at position ``j`` passes iff the accept
    uniform of that position (the salted stream: ``uniform`` of ``seed ^ ACCEPT_SALT`` and the
    position's step) is below ``p(x)``, compared in float64 (``p(x)`` promoted: where ``p(x)`` is the
    float32 rounding of the uniform, the draft passes);
  - ``accepted[r]`` = ``leading_accepted`` of the passes; ``tokens[r, j] = drafts[r, j]`` for
    ``j < accepted[r]``;
  - the token after the accepted drafts: at a rejected draft ``x`` of a sampled row, the residual draw
    (``draw_without``) with the plain draw's own uniform of that position (the unsalted stream); at a
    rejected draft of a greedy row, and where the row has no draft left (the bonus: every draft
    accepted, or padding), ``plain``;
  - no host synchronisation: no ``.item()``, ``.tolist()``, ``bool(tensor)``, ``nonzero`` (the
    verifier runs inside the engine's launch, like the sampler). ``info.all_greedy`` is a Python bool
    you may branch on.
* ``LabVerifier.rollback(n, drafted, accepted)`` -> ``Rollback(cached_len, device_len)`` as the seam
  states: ``(n + accepted, n + accepted + 1)``; ``ValueError`` unless ``n >= 1`` and
  ``0 <= accepted <= drafted`` (each checked on its own; ``accepted == drafted`` is every draft
  accepted, a valid step).

Why the sampled rule is exact: the output is ``x`` with probability ``p(x)``, and ``y != x`` with
probability ``(1 - p(x)) * p(y) / (1 - p(x)) = p(y)``; the accept test and the draw use two different
uniforms (else a rejection, ``u >= p(x)``, would bias the draw).

Pitfalls the grader recognises (its messages name them):

* the accepted prefix: off by one (the rejected draft output instead of the target's token); drafts
  that pass after a rejection counted (``accept.sum()`` instead of the leading run); padding ``-1``
  accepted (clamped to token 0, it passes where the target likes token 0);
* the token after the drafts: the bonus forgotten or taken from another position; in a padded row, a
  residual drawn where no draft is left (that position is the plain draw);
* per-position parameters: every position given the row's own step (every position then draws the
  same number); rows laid out position-major (``repeat`` for ``repeat_interleave``);
* sampled rows: the accept test on the plain stream instead of the salted one (accept and draw
  correlated), or in float32 (a draft whose ``p(x)`` is the float32 rounding of its uniform rejected);
  the residual drawn from ``p`` without removing ``x``, ``u`` not scaled by the residual's total (it
  is ``1 - p(x)``, not 1), or scaled in float64; greedy rows judged by ``all_greedy`` of the batch
  instead of their own temperature;
* the rollback: not done (the counters stay at ``n + drafted``), the correction counted as cached,
  or the bonus counted twice in ``device_len``.

Grading: ``python -m autograder lab15`` checks each function on fixed boundary cases and random ones
against the engine's verifier, the sampled rule draw by draw on small vocabularies whose uniforms are
known, the output distribution by a chi-square test, and then the engine on a tiny model with
n-gram drafting and your verifier: its greedy tokens must be the plain engine's, and its sampled
tokens the reference verifier's under the same seeds.
"""

from __future__ import annotations

import torch

from minisgl.engine.sample import Sampler, SamplingInfo, filter_logits, uniform
from minisgl.speculative.base import Rollback, Verdict, Verifier

__all__ = ["ACCEPT_SALT", "LabVerifier", "draw_without", "filter_logits", "leading_accepted", "per_position", "uniform"]

# the accept test's seed is seed ^ ACCEPT_SALT (seeds are < 2^63: it stays non-negative and never equals a
# draw's seed); the engine uses the same salt, so your accept decisions are the engine's
ACCEPT_SALT = 1 << 62


def per_position(info: SamplingInfo, k1: int) -> SamplingInfo:
    """``B * k1`` rows: row ``r * k1 + j`` has row ``r``'s parameters and step ``info.steps[r] + j``."""
    raise NotImplementedError("Lab 15: the sampling parameters of every position of every row, row-major (a hint: python -m autograder lab15 --hint)")


def leading_accepted(accept: torch.Tensor) -> torch.Tensor:
    """``[B, K]`` bool -> ``[B]`` int64: the length of each row's leading run of True."""
    raise NotImplementedError("Lab 15: the length of each row's leading run of True (a hint: python -m autograder lab15 --hint)")


def draw_without(probs: torch.Tensor, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The first ``i`` with ``cdf[i] >= u * cdf[-1]``, ``cdf`` the cumulative sum of ``probs`` with
    column ``x`` zeroed (per row); clamped to ``V - 1``; int64."""
    raise NotImplementedError("Lab 15: one draw per row from probs without token x, by the docstring's rule (a hint: python -m autograder lab15 --hint)")


class LabVerifier(Verifier):
    """The rule of ``Verifier`` (``minisgl/speculative/base.py``) for a batch; see the module docstring."""

    def verify(self, logits: torch.Tensor, drafts: torch.Tensor, info: SamplingInfo, sampler: Sampler) -> Verdict:
        raise NotImplementedError("Lab 15: the verdict: how many drafts each row accepts, and the tokens it outputs (a hint: python -m autograder lab15 --hint)")

    def rollback(self, n: int, drafted: int, accepted: int) -> Rollback:
        raise NotImplementedError("Lab 15: the request's counters after the step, and the checks of n and accepted (a hint: python -m autograder lab15 --hint)")
