"""Logprobs as a scheduler feature (``minisgl/feature.py``): which rows of a batch score their sampled token
and which prompt positions score the next prompt token (``plan``, before the counters advance), the
forward pass's hooks that score them (``score.py``), and the results handed to each token's event.

A batch without a request that asks for logprobs gets no plan: it pays nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minisgl.core import Batch, Req, TokenEvent
from minisgl.feature import Feature, SampleHooks
from minisgl.logprobs.score import Scored, log_probs, score, score_prompt


@dataclass
class Plan:
    """One batch's logprobs, from ``plan`` to ``process``: what to score, then the results."""

    scored: dict[int, int] = field(default_factory=dict)  # batch row -> its index among the scored rows
    prompt: list[tuple[Req, int]] = field(default_factory=list)  # (request, prompt tokens scored), in order
    rows: torch.Tensor | None = None  # [R] the scored rows, on the device
    top_k: int = 0
    prompt_idx: torch.Tensor | None = None  # [P] batch token offsets whose logits score a prompt token
    prompt_targets: torch.Tensor | None = None  # [P]
    sampled: Scored | None = None  # results
    prompt_scores: Scored | None = None
    host: list | None = None  # the sampled results as host lists, made on first use


class Hooks(SampleHooks):
    def __init__(self, plan: Plan):
        self.plan, self.needs_hidden, self.logprobs = plan, plan.prompt_idx is not None, None

    def on_hidden(self, hidden: torch.Tensor, lm_head) -> None:
        p = self.plan
        p.prompt_scores = score_prompt(lm_head, hidden, p.prompt_idx, p.prompt_targets, p.top_k)

    def on_logits(self, logits: torch.Tensor) -> None:
        if self.plan.rows is not None:  # after any mask, before the sampler may touch them
            self.logprobs = log_probs(logits[self.plan.rows])

    def on_tokens(self, tokens: torch.Tensor) -> None:
        if self.logprobs is not None:
            self.plan.sampled = score(self.logprobs, tokens[self.plan.rows], self.plan.top_k)


class LogprobsFeature(Feature):
    name = "logprobs"

    def __init__(self, device: torch.device):
        self.device = device
        self._live: set[Req] = set()  # unfinished requests that ask for logprobs

    def track(self, req: Req) -> None:
        if req.sampling.wants_logprobs or req.sampling.prompt_logprobs_from >= 0:
            self._live.add(req)

    def release(self, req: Req) -> None:
        self._live.discard(req)

    def plan(self, batch: Batch) -> Plan | None:
        if not self._live:
            return None
        plan, prompt_idx, targets, offset = Plan(), [], [], 0
        for i, (req, start, end) in enumerate(zip(batch.reqs, batch.starts, batch.ends)):
            if req in self._live:
                sp = req.sampling
                if end == req.device_len and sp.wants_logprobs:  # this pass samples a kept token
                    plan.scored[i] = len(plan.scored)
                    plan.top_k = max(plan.top_k, sp.top_logprobs)
                # prompt token p + 1 is scored by position p; the last prompt position samples the first output
                lo, hi = max(start, req.next_scored - 1), min(end, req.prompt_len - 1)
                if lo < hi:
                    prompt_idx += range(offset + lo - start, offset + hi - start)
                    targets += req.input_ids[lo + 1 : hi + 1]
                    plan.prompt.append((req, hi - lo))
                    req.next_scored = hi + 1  # as if the pass had run (the next chunk may be planned first)
                    plan.top_k = max(plan.top_k, sp.top_logprobs)
            offset += end - start
        if not (plan.scored or plan.prompt):
            return None
        t = lambda x: torch.tensor(x, dtype=torch.int64).to(self.device, non_blocking=True)  # noqa: E731
        plan.rows = t(list(plan.scored)) if plan.scored else None
        if plan.prompt:
            plan.prompt_idx, plan.prompt_targets = t(prompt_idx), t(targets)
        return plan

    def hooks(self, batch: Batch, plan: Plan, token_pool: torch.Tensor) -> SampleHooks:
        return Hooks(plan)

    def launched(self, batch: Batch, plan: Plan) -> None:
        """The results start their copy to the host (the copy of the batch's tokens, recorded after, covers it)."""
        for name in ("sampled", "prompt_scores"):
            x = getattr(plan, name)
            if x is not None:
                setattr(plan, name, x.to("cpu", non_blocking=x.token.is_cuda))

    def processing(self, batch: Batch, plan: Plan) -> None:
        """File the prompt logprobs this batch computed with their requests."""
        if plan.prompt:
            rows, at = plan.prompt_scores.rows(), 0
            for req, n in plan.prompt:
                req.prompt_logprobs += rows[at : at + n]
                at += n

    def on_token(self, batch: Batch, plan: Plan | None, row: int, req: Req, ev: TokenEvent) -> None:
        if req not in self._live:
            return
        if plan is not None and row in plan.scored:
            if plan.host is None:
                plan.host = plan.sampled.rows()
            ev.logprob, top = plan.host[plan.scored[row]]
            ev.top_logprobs = top[: req.sampling.top_logprobs]
        if len(req.output_ids) == 1 and req.sampling.prompt_logprobs_from >= 0:
            ev.prompt_logprobs = [(lp, top[: req.sampling.top_logprobs]) for lp, top in req.prompt_logprobs]


def create(config, engine, scheduler) -> LogprobsFeature:
    return LogprobsFeature(engine.device)
