"""What a request may ask for besides its tokens, on the scheduler's side: logprobs
(``minisgl/engine/logprobs.py``) and a grammar (``minisgl/grammar/``). ``RequestExtras`` plans them
per batch (``plan``, in ``prepare``: which rows and prompt positions to score, which rows to mask),
starts the mask in ``launch`` and hands the results out in ``process`` (``on_token``).

Unconstrained requests that ask for nothing pay nothing: a batch without such requests gets no
``SampleExtras`` at all, and ``Engine.forward_batch`` runs as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minisgl.core import Batch, Req
from minisgl.engine.logprobs import SampleExtras
from minisgl.grammar.manager import GrammarManager
from minisgl.scheduler.events import TokenEvent


@dataclass
class BatchPlan:
    """Host bookkeeping of one batch's extras (``Batch.extras``), from ``plan`` to ``process``."""

    extras: SampleExtras
    scored: dict[int, int] = field(default_factory=dict)  # batch row -> its index among the scored rows
    prompt: list[tuple[Req, int]] = field(default_factory=list)  # (request, prompt tokens scored), in order
    mask_rows: list[int] = field(default_factory=list)  # kept rows of constrained requests
    mask_steps: list[int] = field(default_factory=list)  # the output token number each samples
    sampled: list | None = None  # host lists of the sampled rows' results, made on first use


class RequestExtras:
    def __init__(self, grammar: GrammarManager, device: torch.device):
        self.grammar, self.device = grammar, device
        self._live: set[Req] = set()  # the unfinished requests that ask for logprobs or a grammar

    def track(self, req: Req) -> None:
        """A request was added; remember it if it asks for anything (the others cost nothing per step)."""
        sp = req.sampling
        if sp.wants_logprobs or sp.prompt_logprobs_from >= 0 or sp.grammar is not None:
            self._live.add(req)
            self.grammar.track(req)

    def release(self, req: Req) -> None:
        if req in self._live:
            self._live.discard(req)
            self.grammar.release(req)

    def plan(self, batch: Batch) -> BatchPlan | None:
        """Call in ``prepare`` before the requests' counters advance. None: nothing to do."""
        if not self._live:
            return None
        scored, prompt_idx, targets, prompt, mask_rows, steps = {}, [], [], [], [], []
        offset, top_k = 0, 0
        for i, (req, start, end) in enumerate(zip(batch.reqs, batch.starts, batch.ends)):
            if req not in self._live:
                offset += end - start
                continue
            sp = req.sampling
            keep = end == req.device_len  # this pass samples a kept token (not a mid-prompt chunk)
            if keep and sp.wants_logprobs:
                scored[i] = len(scored)
                top_k = max(top_k, sp.top_logprobs)
            if keep and sp.grammar is not None:
                mask_rows.append(i)
                steps.append(req.num_scheduled_outputs)
            # prompt token p + 1 is scored by position p; the last prompt position samples the first output
            lo, hi = max(start, req.next_scored - 1), min(end, req.prompt_len - 1)
            if lo < hi:
                prompt_idx += range(offset + lo - start, offset + hi - start)
                targets += req.input_ids[lo + 1 : hi + 1]
                prompt.append((req, hi - lo))
                req.next_scored = hi + 1  # as if the pass had run (the next chunk may be planned first)
                top_k = max(top_k, sp.top_logprobs)
            offset += end - start
        if not (scored or prompt or mask_rows):
            return None
        t = lambda x: torch.tensor(x, dtype=torch.int64).to(self.device, non_blocking=True)
        extras = SampleExtras(top_k=top_k)
        if scored:
            extras.rows = t(list(scored))
        if prompt:
            extras.prompt_idx, extras.prompt_targets = t(prompt_idx), t(targets)
        return BatchPlan(extras, scored, prompt, mask_rows, steps)

    def start_mask(self, batch: Batch, token_pool: torch.Tensor) -> None:
        """Call in ``launch`` before the forward pass (it may fetch tokens still on the device)."""
        plan: BatchPlan | None = batch.extras
        if plan is not None and plan.mask_rows:
            reqs = [batch.reqs[i] for i in plan.mask_rows]
            plan.extras.mask = self.grammar.masker(reqs, plan.mask_rows, plan.mask_steps, token_pool)

    @staticmethod
    def to_host(batch: Batch) -> None:
        """Call in ``launch`` after the forward pass: start copying the results to the host (the
        copy of the batch's tokens, recorded after, covers them)."""
        plan: BatchPlan | None = batch.extras
        if plan is not None:
            x = plan.extras
            cuda = x.sampled is not None and x.sampled.token.is_cuda or x.prompt is not None and x.prompt.token.is_cuda
            if x.sampled is not None:
                x.sampled = x.sampled.to("cpu", non_blocking=cuda)
            if x.prompt is not None:
                x.prompt = x.prompt.to("cpu", non_blocking=cuda)

    def on_token(self, batch: Batch, row: int, req: Req, token: int, reason: str | None) -> TokenEvent:
        """A kept token of row ``row`` reached the host (``req.output_ids`` has it): its event, with
        what the request asked for; ``reason`` becomes "stop" where its grammar ended."""
        plan: BatchPlan | None = batch.extras
        if plan is None or req not in self._live:
            return TokenEvent(req.uid, token, reason)
        if reason is None and req.sampling.grammar is not None and self.grammar.on_token(req, len(req.output_ids) - 1):
            reason = "stop"
        ev = TokenEvent(req.uid, token, reason)
        if row in plan.scored:
            ev.logprob, ev.top_logprobs = self._sampled(plan)[plan.scored[row]]
            ev.top_logprobs = ev.top_logprobs[: req.sampling.top_logprobs]
        if len(req.output_ids) == 1 and req.sampling.prompt_logprobs_from >= 0:
            ev.prompt_logprobs = [(lp, top[: req.sampling.top_logprobs]) for lp, top in req.prompt_logprobs]
        return ev

    def collect_prompt(self, batch: Batch) -> None:
        """Call first in ``process``: file the prompt logprobs this batch computed with their requests."""
        plan: BatchPlan | None = batch.extras
        if plan is None or not plan.prompt:
            return
        rows, at = plan.extras.prompt.rows(), 0
        for req, n in plan.prompt:
            req.prompt_logprobs += rows[at : at + n]
            at += n

    @staticmethod
    def _sampled(plan: BatchPlan) -> list:
        if plan.sampled is None:
            plan.sampled = plan.extras.sampled.rows()
        return plan.sampled
