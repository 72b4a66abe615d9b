"""Lab 02: the sampler, from logits to tokens.

You implement ``LabSampler``, a ``Sampler`` (the interface, imported below: its docstring states the
seam's contract, and ``SamplingInfo`` holds the per-row parameters of one batch), and the four functions
it is made of. Write them here: the engine's own sampler and filters are off limits (a lab that
subclasses, aliases or calls them is graded 0). One call samples a whole batch, each row with its
own temperature, top-k, top-p, seed and step. Shapes: ``logits`` is ``[B, V]``; every per-row tensor
is ``[B]``.

Contract (what the autograder checks):

* ``scale_logits(logits, temperatures)``: float32 logits whose softmax is each row's distribution at
  its own temperature ``T`` (the logits divided by ``T``; ``logits`` may be bfloat16). A row with
  ``T = 0`` is a greedy row: it comes back as it was (in float32), never divided by 0. Example:
  ``scale_logits([[2, 4], [2, 4]], [2, 0])`` -> ``[[1, 2], [2, 4]]``.
* ``top_k_filter(logits, top_k)``: each row keeps the logits that are at least as large as its own
  ``k``-th largest (so every token tied with the ``k``-th stays) and sets the others to ``-inf``;
  ``top_k >= V`` keeps the whole row. The values that stay are returned unchanged. Example:
  ``top_k_filter([[4, 2, 2, 2, 1], [4, 2, 2, 2, 1]], [2, 5])`` -> ``[[4, 2, 2, 2, -inf], [4, 2, 2, 2, 1]]``.
* ``top_p_filter(logits, top_p)``: each row keeps its *nucleus* and sets the other logits to ``-inf``.
  Rank the row's tokens by probability (``softmax`` of the row, which may hold ``-inf`` already: top-k
  ran first); a token belongs to the nucleus when the tokens ranked before it hold less than ``p`` of
  the probability, so the token that reaches ``p`` stays and the most likely token always does. A row
  with ``p = 1`` keeps every token, even where float32 sums of its probabilities reach 1.0 before its
  last tokens. Among tokens of equal probability, which ones stay is yours to choose; how many is not.
  Examples: ``top_p_filter([[2, 1, 0]], [0.7])`` -> ``[[2, 1, -inf]]`` (probabilities 0.665, 0.245,
  0.090: the second token reaches 0.7); four equal logits (each 1/4) with ``p`` = 0.25, 0.3, 0.5 and 1
  keep 1, 2, 2 and 4 tokens (at 0.5 the third token has exactly 0.5 before it: it goes).
* ``draw(logits, u)``: one token per row, int64 ``[B]``, by inverse transform sampling with row ``r``'s
  uniform ``u[r]`` in (0, 1): lay the row's probabilities (``softmax`` in float32) end to end, in
  token order, and return the token whose stretch holds ``u[r]`` times their total; on a boundary
  between two stretches, the earlier token. The total is the float32 sum of the probabilities, which
  may end a little below 1: the scaled ``u`` always lands on a token. A ``-inf`` logit has probability
  0: never drawn, even on a boundary. Logits above 88 (where ``exp`` overflows float32) are fine.
  Examples, ``logits = [[0, 0, 0, 0]]`` (stretches ending at 0.25, 0.5, 0.75, 1): ``u = 0.25`` -> 0,
  ``u = 0.5`` -> 1, ``u = 0.6`` -> 2; ``logits = [[0, -inf, 0, 0]]``, ``u = 0.5`` -> 2.
* ``LabSampler.sample(logits, info)``: greedy rows (``info.temperatures == 0``) return the argmax of
  their logits. Every other row draws, by ``draw``'s rule with the uniform ``uniform(info.seeds,
  info.steps)`` (the engine's counter-based uniform, imported below), from its distribution after
  the three filters in this order: its temperature, then its top-k, then its top-p on what top-k kept
  (the softmax of the filtered row, renormalised). The flags of ``info`` say whether any row of the
  batch asks for top-k, or for top-p (a row that does not has ``k = V``, or ``p = 1``).
  ``logits`` come in the model's dtype (bfloat16 on a GPU): compute in float32. Returns ``[B]`` int64.

Why one rule, and not "any correct sampler": the uniform of row ``r`` is a pure function of
``(seed, step)``, so with the same rule your tokens are the engine's token for token, a seeded
request gives the same tokens in any batch, and the grader can check every single draw. The grader
computes each row's stretches in float64 and accepts a token whose stretch holds ``u * total`` up to
1e-5 (float32 rounding done in another order is fine); on rows of equally likely tokens, whose
probabilities and sums are exact, it wants the boundaries themselves as stated above (top-p's "less
than ``p``", the draw's "the earlier token"). Its statistical tests (total variation distance between
your tokens over thousands of seeds and the exact distribution) pass for any sampler of the right
distribution, so they tell a wrong distribution from a wrong draw.

Pitfalls the grader recognises (its messages name them):

* temperature: greedy rows turned to ``inf`` and ``NaN`` (divided by 0); the temperature multiplied
  instead of divided, or applied after the softmax (renormalising undoes it); bfloat16 arithmetic;
* top-k: ``k + 1`` tokens kept; ties with the ``k``-th logit dropped (exactly ``k`` tokens kept); one
  ``k`` (the first row's, or the largest) for the whole batch instead of each row's own;
* top-p: the token that reaches ``p`` dropped (an empty nucleus for a small ``p``), or a token kept
  whose predecessors hold exactly ``p``; tokens dropped at ``p = 1``; top-p computed before the
  temperature, or on the whole distribution instead of what top-k kept;
* a filter that turns kept logits into ``NaN`` (``0 * -inf`` is ``NaN``);
* draw: an overflow on logits above 88; ``u`` not scaled by the total (a ``u`` above it finds no
  token); the later token taken on a boundary;
* greedy rows sampled; the step ignored (every step draws the same ``u``); one random generator for
  the batch, or the row index as the seed (a row's token then depends on its neighbours: not
  batch-invariant, and tensor-parallel ranks would need to agree on the batch).

Grading: ``python -m autograder lab02`` (``--hint`` prints a hint per function) runs fixed cases and
random batches against the engine's own filters and draw rule, statistical tests, and then the engine
(``minisgl.LLM``) with ``components={"sampler": "lab02"}``: seeded sampled requests must give the
reference engine's tokens, alone and inside a batch.
"""

from __future__ import annotations

import torch

from minisgl.engine.sample import Sampler, SamplingInfo, uniform

__all__ = ["LabSampler", "draw", "scale_logits", "top_k_filter", "top_p_filter", "uniform"]


def scale_logits(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """Each row at its temperature, ``[B, V]`` float32; greedy rows (``T == 0``) as they are."""
    raise NotImplementedError("Lab 02: each row's logits at its temperature, greedy rows untouched (a hint: python -m autograder lab02 --hint)")


def top_k_filter(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Each row's top-``k`` logits (ties with the ``k``-th included), ``-inf`` elsewhere."""
    raise NotImplementedError("Lab 02: each row's own k-th largest logit, and -inf below it (a hint: python -m autograder lab02 --hint)")


def top_p_filter(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Each row's nucleus at its ``top_p``, ``-inf`` elsewhere; ``p = 1`` keeps the whole row."""
    raise NotImplementedError("Lab 02: each row's nucleus: the tokens whose more likely predecessors hold less than p (a hint: python -m autograder lab02 --hint)")


def draw(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row by inverse transform sampling with ``u`` (``[B]``, in (0, 1)); ``[B]`` int64."""
    raise NotImplementedError("Lab 02: the inverse-CDF draw of each row (a hint: python -m autograder lab02 --hint)")


class LabSampler(Sampler):
    """The engine's ``"lab02"`` sampler: greedy rows their argmax, the others a seeded draw."""

    def sample(self, logits: torch.Tensor, info: SamplingInfo) -> torch.Tensor:
        raise NotImplementedError("Lab 02: one token per row: the argmax for greedy rows, a filtered seeded draw otherwise (a hint: python -m autograder lab02 --hint)")
