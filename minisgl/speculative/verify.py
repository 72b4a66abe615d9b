"""The engine's verifier: the rule of ``Verifier`` (base.py) for point-mass drafts, batched.

Randomness, per output token number ``n`` of a request with seed ``s``:

- the accept test of a draft at ``n`` uses ``uniform(s ^ ACCEPT_SALT, n)``;
- the token drawn at ``n`` (a correction after a rejection) uses ``uniform(s, n)``, the plain
  sampler's number for ``n``; the bonus token *is* the plain sampler's draw at ``n``.

Why the rule gives the target distribution ``p`` at a position with draft ``x``: the output is ``x``
with probability ``p(x)``, and ``y != x`` with probability ``(1 - p(x)) * p(y) / (1 - p(x)) = p(y)``.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minisgl.engine.sample import Sampler, SamplingInfo, filter_logits, uniform
from minisgl.speculative.base import Rollback, Verdict, Verifier

ACCEPT_SALT = 1 << 62  # seeds are < 2^63: xor keeps them non-negative and distinct from the draws' seeds


def per_position(info: SamplingInfo, k1: int) -> SamplingInfo:
    """``info`` for ``[B * k1]`` rows: row ``r``'s parameters repeated, steps ``steps[r] + j``."""
    rep = lambda t: t.repeat_interleave(k1)
    steps = (info.steps[:, None] + torch.arange(k1, device=info.steps.device)[None, :]).flatten()
    return replace(
        info, temperatures=rep(info.temperatures), top_k=rep(info.top_k), top_p=rep(info.top_p),
        seeds=rep(info.seeds), steps=steps,
    )  # fmt: skip


def leading(accept: torch.Tensor) -> torch.Tensor:
    """``[B, K]`` bool -> ``[B]`` int64: how many leading entries of each row are True."""
    return accept.to(torch.int64).cumprod(dim=1).sum(dim=1)


class DefaultVerifier(Verifier):
    def verify(self, logits: torch.Tensor, drafts: torch.Tensor, info: SamplingInfo, sampler: Sampler) -> Verdict:
        b, k1, vocab = logits.shape
        flat = per_position(info, k1)
        # the plain engine's draw at every position: the bonus where no draft is left, the argmax of greedy rows
        plain = sampler.sample(logits.reshape(b * k1, vocab), flat).view(b, k1)
        has = drafts >= 0
        x = drafts.clamp(min=0)
        if info.all_greedy:
            accepted = leading(has & (drafts == plain[:, :-1]))
            return Verdict(plain, accepted)
        probs = filter_logits(logits.reshape(b * k1, vocab).float(), flat).softmax(dim=-1).view(b, k1, vocab)[:, :-1]
        steps, seeds = flat.steps.view(b, k1)[:, :-1], flat.seeds.view(b, k1)[:, :-1]
        p_x = probs.gather(2, x[..., None]).squeeze(2)
        sampled_ok = uniform(seeds ^ ACCEPT_SALT, steps) < p_x.to(torch.float64)
        greedy = (info.temperatures == 0)[:, None]
        accepted = leading(has & torch.where(greedy, drafts == plain[:, :-1], sampled_ok))
        # after a rejection: p with the draft removed (inverse CDF on the same uniform as the plain draw)
        cdf = probs.scatter(2, x[..., None], 0.0).cumsum(dim=2)
        target = uniform(seeds, steps).to(cdf.dtype)[..., None] * cdf[..., -1:]
        fixed = torch.searchsorted(cdf, target).squeeze(2).clamp_(max=vocab - 1)
        tokens = plain.clone()
        tokens[:, :-1] = torch.where(has & ~greedy, fixed, plain[:, :-1])
        # accepted drafts stand as they are; the rest of the row past accepted + 1 is never read
        pos = torch.arange(k1 - 1, device=drafts.device)[None, :]
        tokens[:, :-1] = torch.where(pos < accepted[:, None], drafts, tokens[:, :-1])
        return Verdict(tokens, accepted)

    def rollback(self, n: int, drafted: int, accepted: int) -> Rollback:
        if n < 1 or drafted < 0 or not 0 <= accepted <= drafted:
            raise ValueError(f"rollback({n=}, {drafted=}, {accepted=}): needs n >= 1 and 0 <= accepted <= drafted")
        return Rollback(n + accepted, n + accepted + 1)
