"""Log-probabilities: of each sampled token and of the most likely tokens at its step, and of prompt
tokens (``echo`` in OpenAI's completions, SGLang's ``logprob_start_len``).

Which distribution: ``log_softmax`` of the model's logits in float32, *after* any mask (a constrained
request's logprobs are over the tokens it could produce) and *before* temperature,
top-k and top-p: the model's own distribution, what OpenAI reports and vLLM returns by default
(its ``raw_logprobs``). A token the mask removed has logprob ``-inf``; the API reports it as -9999.

Prompt token ``p + 1`` is scored by the logits of position ``p``: a prefill pass that computes
positions ``[start, end)`` scores tokens ``start + 1 .. end`` (the last of which, at the end of the
prompt, is the sampled token, reported as an output logprob). Only the requests that ask pay for it:
their positions go through the LM head ``PROMPT_CHUNK`` rows at a time (a ``[rows, vocab]`` float32
matrix each), which a prefill otherwise skips (it needs each request's last position only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

PROMPT_CHUNK = 512  # prompt positions scored per LM-head call (memory: PROMPT_CHUNK x vocab x 4 bytes)
FLOOR = -9999.0  # what -inf (a masked token) is reported as: JSON has no infinity


@dataclass
class Scored:
    """Logprobs of ``n`` tokens, with the ``k`` most likely tokens at each step (``k`` may be 0)."""

    token: torch.Tensor  # [n] float32
    top_ids: torch.Tensor  # [n, k] int64
    top_vals: torch.Tensor  # [n, k] float32

    def to(self, device: str, non_blocking: bool = False) -> Scored:
        t = lambda x: x.to(device, non_blocking=non_blocking)
        return Scored(t(self.token), t(self.top_ids), t(self.top_vals))

    def rows(self) -> list[tuple[float, list[tuple[int, float]]]]:
        """Host lists: one ``(logprob, [(token id, logprob), ...])`` per token, -inf as ``FLOOR``; the
        top lists leave out tokens a constraint masked (fewer may be allowed than asked for)."""
        tok = self.token.clamp(min=FLOOR).tolist()
        ids, vals = self.top_ids.tolist(), self.top_vals.tolist()
        return [(t, [(a, b) for a, b in zip(i, v) if b > FLOOR]) for t, i, v in zip(tok, ids, vals)]


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    return logits.float().log_softmax(dim=-1)


def score(logprobs: torch.Tensor, targets: torch.Tensor, k: int) -> Scored:
    """``logprobs[i, targets[i]]`` and each row's top ``k``."""
    token = logprobs.gather(1, targets.view(-1, 1)).view(-1)
    if k > 0:
        top_vals, top_ids = logprobs.topk(k, dim=-1)
    else:
        top_vals = logprobs.new_empty(len(targets), 0)
        top_ids = torch.empty(len(targets), 0, dtype=torch.int64, device=logprobs.device)
    return Scored(token, top_ids, top_vals)


def score_prompt(
    lm_head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    idx: torch.Tensor,
    targets: torch.Tensor,
    k: int,
) -> Scored:
    """Score ``targets[i]`` with the logits of the batch's token ``idx[i]`` (``hidden``: the final
    hidden states of every token of the batch), ``PROMPT_CHUNK`` positions at a time."""
    parts = [
        score(log_probs(lm_head(hidden[idx[i : i + PROMPT_CHUNK]])), targets[i : i + PROMPT_CHUNK], k)
        for i in range(0, len(idx), PROMPT_CHUNK)
    ]
    cat = lambda name: torch.cat([getattr(p, name) for p in parts])
    return Scored(cat("token"), cat("top_ids"), cat("top_vals"))
