"""Lab 02: the sampler, from logits to tokens.

You implement ``LabSampler``, a ``Sampler`` (the interface, imported below: its docstring states the
seam's contract, and ``SamplingInfo`` holds the per-row parameters of one batch), and the four functions
it is made of. Write them here: the engine's own sampler and filters are off limits (a lab that
subclasses, aliases or calls them is graded 0). One call samples a whole batch, each row with its
own temperature, top-k, top-p, seed and step. Shapes: ``logits`` is ``[B, V]``; every per-row tensor
is ``[B]``.

Contract (what the autograder checks):

* ``scale_logits(logits, temperatures)``: the logits in float32 divided by each row's
  temperature; a row with temperature 0 (greedy) is divided by 1 instead (left as it is).
* ``top_k_filter(logits, top_k)``: each row keeps the tokens whose logit is ``>=`` its ``k``-th
  largest logit and sets the others to ``-inf`` (so tokens tied with the ``k``-th are all kept);
  ``top_k >= V`` keeps everything. Values that stay are returned unchanged.
* ``top_p_filter(logits, top_p)``: each row keeps the smallest set of its most likely tokens whose
  probabilities (``softmax`` of the row) sum to at least ``p``, and sets the others to ``-inf``. In
  words: sort by probability, and keep a token when the mass of the tokens *before* it is ``< p``,
  so the token that crosses ``p`` is kept and the most likely token always is. A row with ``p = 1``
  keeps every token: test it, since a float32 cumulative sum can reach 1.0 before the last tokens.
  The input may hold ``-inf`` already (top-k ran first).
* ``draw(logits, u)``: the inverse-CDF draw. With ``cdf = cumsum(softmax(logits))`` in float32,
  row ``r``'s token is the first ``i`` with ``cdf[i] >= u[r] * cdf[-1]`` (scale ``u`` by the total:
  a float32 CDF may end a little below 1). A token of logit ``-inf`` has probability 0 and can
  never be drawn. Returns int64.
* ``LabSampler.sample(logits, info)``: greedy rows (``info.temperatures == 0``) return the argmax
  of their logits. The other rows: scale by the temperature, then top-k, then top-p (on what top-k
  kept, renormalised: ``softmax`` of the filtered row), then ``draw`` with
  ``u = uniform(info.seeds, info.steps)``, the engine's counter-based uniform (given). ``logits``
  come in the model's dtype (bfloat16 on a GPU): compute in float32. Returns ``[B]`` int64.

Why one rule, and not "any correct sampler": the uniform of row ``r`` is a pure function of
``(seed, step)``, so with the same rule your tokens are the engine's token for token, a seeded
request gives the same tokens in any batch, and the grader can check every single draw. The grader
computes each row's CDF in float64 and accepts a token whose interval ``[cdf[i-1], cdf[i]]`` holds
``u * total`` up to 1e-5 (float32 rounding done in another order is fine); on rows of equally likely
tokens, whose probabilities and sums are exact, it wants the rules themselves, ``>=`` and ``<`` as
written above. Its statistical tests
(total variation distance between your tokens over thousands of seeds and the exact distribution)
pass for any sampler of the right distribution, so they tell a wrong distribution from a wrong draw.

Pitfalls the grader recognises (its messages name them):

* temperature: greedy rows divided by 0 (``inf`` and ``NaN``); the temperature multiplied instead
  of divided, or applied to the probabilities after the softmax (renormalising undoes it);
* top-k: ``k + 1`` tokens kept (an off-by-one in the rank); ties with the ``k``-th logit dropped
  (``torch.topk``'s indices keep exactly ``k``); one ``k`` (the first row's, or the largest) for the
  whole batch instead of each row's own;
* top-p: the crossing token dropped (keeping ``cumsum < p`` gives an empty set for a small ``p``), or
  a token kept whose mass before it is exactly ``p`` (``<=`` for ``<``);
  tokens dropped at ``p = 1`` (the float32 mass before them rounds to 1.0); top-p computed before
  the temperature, or on the whole distribution instead of what top-k kept;
* masking by arithmetic (``logits * keep``): ``0 * -inf`` is ``NaN``;
* draw: ``exp()`` without ``softmax``'s subtraction of the row's maximum (it overflows float32 past
  88); ``u`` not scaled by the CDF's total; ``cdf[i] > u * total`` for ``>=`` (``searchsorted`` with
  ``right=True``);
* greedy rows sampled; the step index ignored (every step draws the same ``u``); one random
  generator for the batch, or the row index as the seed (a row's token then depends on its
  neighbours: not batch-invariant, and tensor-parallel ranks would need to agree on the batch).

Grading: ``python -m autograder lab02`` runs fixed cases and random batches against the engine's own
filters and draw rule, statistical tests, and then the engine (``minisgl.LLM``) with
``components={"sampler": "lab02"}``: seeded sampled requests must give the reference engine's tokens,
alone and inside a batch.
"""

from __future__ import annotations

import torch

from minisgl.engine.sample import Sampler, SamplingInfo, uniform

__all__ = ["LabSampler", "draw", "scale_logits", "top_k_filter", "top_p_filter", "uniform"]


def scale_logits(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """``logits.float() / T`` per row (``[B, V]`` float32); rows with ``T == 0`` are divided by 1."""
    raise NotImplementedError("Lab 02: divide each row of logits.float() by its temperature, by 1 where the temperature is 0")


def top_k_filter(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """``-inf`` where a logit is below its row's ``top_k``-th largest; ties with it are kept."""
    raise NotImplementedError("Lab 02: the k-th largest of each row (sort descending, gather k - 1); set logits below it to -inf")


def top_p_filter(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``-inf`` outside each row's nucleus: a token stays when the probability of the tokens more
    likely than it sums to ``< p`` (the token crossing ``p`` stays); ``p = 1`` keeps every token."""
    raise NotImplementedError("Lab 02: sort descending, softmax, mass before each token = cumsum - p; drop where it is >= top_p")


def draw(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Row ``r``'s token: the first ``i`` with ``cdf[i] >= u[r] * cdf[-1]``, ``cdf`` the cumulative
    sum of ``softmax(logits[r])`` in float32. ``u``: ``[B]`` in (0, 1). Returns ``[B]`` int64."""
    raise NotImplementedError("Lab 02: cdf = softmax(logits.float()).cumsum(-1); searchsorted(cdf, u[:, None] * cdf[:, -1:])")


class LabSampler(Sampler):
    """Greedy rows take the argmax; the others scale, top-k, top-p and draw with ``uniform``."""

    def sample(self, logits: torch.Tensor, info: SamplingInfo) -> torch.Tensor:
        raise NotImplementedError("Lab 02: argmax for temperature-0 rows; else scale_logits, top_k_filter, top_p_filter, draw")
