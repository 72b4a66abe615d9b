"""``min_tokens`` and the repetition penalties (vLLM's ``SamplingParams`` fields) as a scheduler feature
(``minisgl/feature.py``): a request's logits change before sampling, in its own row only and from its own
tokens, so its draws still depend on nothing else in its batch; a batch without such a request has no plan
and is untouched.

* ``min_tokens``: until the output holds that many tokens, its stop_token_ids and (unless ignore_eos) the
  EOS ids get ``-inf``.
* ``repetition_penalty`` r (CTRL's, as HF and vLLM apply it): the logit of a token the prompt or the output
  holds is divided by r where positive, multiplied by r where not.
* ``frequency_penalty`` f and ``presence_penalty`` p (OpenAI's): ``logit -= f * count + p * (count > 0)``,
  counting the token in the output.

The output so far is read from the token pool on the device: a token still in flight (the overlap loop plans
a step before the last one reaches the host) is already there, written by the pass before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minisgl.core import Batch, Req
from minisgl.feature import Feature, SampleHooks


@dataclass
class Plan:
    rows: list[int] = field(default_factory=list)  # batch rows that sample a penalized request's kept token
    table_idx: list[int] = field(default_factory=list)
    prompt_len: list[int] = field(default_factory=list)
    device_len: list[int] = field(default_factory=list)  # output tokens: positions [prompt_len, device_len)
    pen: list[tuple[float, float, float]] = field(default_factory=list)  # (repetition, frequency, presence)
    banned: list[tuple[int, int]] = field(default_factory=list)  # (index in rows, token id) under min_tokens


class Hooks(SampleHooks):
    def __init__(self, plan: Plan, token_pool: torch.Tensor):
        self.plan, self.pool = plan, token_pool

    def on_logits(self, logits: torch.Tensor) -> None:
        p, dev = self.plan, logits.device
        t = lambda x, dt=torch.int64: torch.tensor(x, dtype=dt).to(dev, non_blocking=True)  # noqa: E731
        rows = t(p.rows)
        x = logits[rows].float()
        if any(q != (1.0, 0.0, 0.0) for q in p.pen):
            pos = torch.arange(max(p.device_len), device=dev)
            toks = self.pool[t(p.table_idx)][:, : len(pos)].long().clamp_(0, x.shape[1] - 1)
            seen = (pos[None, :] < t(p.device_len)[:, None]).float()
            out = seen * (pos[None, :] >= t(p.prompt_len)[:, None])
            count = torch.zeros_like(x).scatter_add_(1, toks, out)
            in_seq = torch.zeros_like(x).scatter_add_(1, toks, seen) > 0
            rep, freq, pres = t(p.pen, torch.float32).unbind(1)
            x = torch.where(in_seq, torch.where(x > 0, x / rep[:, None], x * rep[:, None]), x)
            x = x - freq[:, None] * count - pres[:, None] * (count > 0)
        if p.banned:
            i, tok = zip(*p.banned)
            x[t(list(i)), t(list(tok))] = float("-inf")
        logits[rows] = x.to(logits.dtype)


class PenaltiesFeature(Feature):
    name = "penalties"

    def __init__(self, eos_ids: set[int]):
        self.eos_ids = eos_ids  # the scheduler's set (the tokenizer's EOS ids join it after start)
        self._live: set[Req] = set()  # unfinished penalized requests: no other batch pays for a plan

    def track(self, req: Req) -> None:
        if req.sampling.penalized:
            self._live.add(req)

    def release(self, req: Req) -> None:
        self._live.discard(req)

    def plan(self, batch: Batch) -> Plan | None:
        plan = Plan()
        for i, (req, end) in enumerate(zip(batch.reqs, batch.ends) if self._live else ()):
            sp = req.sampling
            if req not in self._live or end != req.device_len:  # a mid-prompt chunk samples nothing kept
                continue
            if req.device_len - req.prompt_len < sp.min_tokens:
                ban = set(sp.stop_token_ids) | (set() if sp.ignore_eos else self.eos_ids)
                plan.banned += [(len(plan.rows), tok) for tok in sorted(ban)]
            plan.rows.append(i)
            plan.table_idx.append(req.table_idx)
            plan.prompt_len.append(req.prompt_len)
            plan.device_len.append(req.device_len)
            plan.pen.append((float(sp.repetition_penalty), float(sp.frequency_penalty), float(sp.presence_penalty)))
        return plan if plan.rows else None

    def hooks(self, batch: Batch, plan: Plan, token_pool: torch.Tensor) -> SampleHooks:
        return Hooks(plan, token_pool)


def create(config, engine, scheduler) -> PenaltiesFeature:
    return PenaltiesFeature(scheduler.eos_ids)
