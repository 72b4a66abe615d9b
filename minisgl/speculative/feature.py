"""Speculative decoding as a scheduler feature (``--speculative-algorithm``; ``minisgl/feature.py``): which
requests draft, the verify batch that replaces a decode batch, and the rollback of what the target
rejected.

A step, for a request ``r`` whose tokens ``[0, n)`` are all on the host (``device_len == n``)::

    plan     drafts d0..d(k-1) = drafter.propose(r, k);  device_len = n + k   (drafts count as tokens)
    batch    extend [n - 1, n + k): the drafts go into the token pool, KV pages for them are allocated,
             prepare() advances the counters as for any pass: cached_len = n + k, device_len = n + k + 1
    launch   the k + 1 positions run as decode rows (``decode_rows``), logits at all of them; verifier ->
             a accepted drafts + 1 token; that token goes into the token pool at n + a (accepted drafts are
             already there)
    process  rollback (Verifier.rollback): cached_len = n + a, device_len = n + a + 1; append the a + 1
             tokens one by one, stopping exactly where a plain decode would (EOS, stop ids, max_tokens, an abort)

What the rollback leaves: KV slots of positions ``[n + a, n + k)`` hold the rejected drafts' keys and
stay with the request (its next positions reuse them: ``alloc_len`` never shrinks, so the reservation
``pages_still_needed`` is what it would be without speculation); nothing reads a position at or past
``device_len`` before a pass writes it. The radix cache never sees them: a request's KV goes to the
cache through ``release_request``, which inserts ``all_token_ids()[:cached_len]`` (accepted tokens
only). ``k <= max_device_len - n - 1`` keeps every KV write inside the request's reservation.

Which requests draft: a speculative request (``SamplingParams.speculative``, the default) without a
grammar or logprobs (their masks and scores are per sampled token: not done for drafted positions),
unless it is backing off after verify steps that accepted nothing (``backoff.py``: it decodes
plainly for a while). The decision is the request's own, whatever else is in the batch, so its tokens
do not depend on its neighbours: a verify batch may hold rows that drafted nothing, which are plain
decode rows (one position; a grammar's mask and logprobs are computed on it as in a decode batch, and
the verifier's draw there is the plain sampler's: the other features' hooks run on those rows). Its drafts
need its tokens on the host: under the overlap loop a speculative request whose last pass is still in
flight waits one step (it then runs as under the plain loop). A verify batch runs as a decode batch with
one row per position (``decode_rows``): a CUDA graph on a GPU where one of that many rows was captured,
the C++ decode layer on a CPU where its rows fit (``small_linear.max_rows``). A decode step in which no
request found a draft is a plain decode batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minisgl.attention.context import forward_context
from minisgl.core import Batch, Req
from minisgl.feature import Feature, SampleHooks
from minisgl.kernels.jit import use
from minisgl.speculative.backoff import Backoff
from minisgl.speculative.base import DRAFTERS, VERIFIERS


@dataclass
class SpecStats:
    verify_rows: int = 0  # request-steps that ran a verify with at least one draft
    draft_tokens: int = 0  # drafts those proposed
    accepted_tokens: int = 0  # of which the target accepted

    @property
    def accept_rate(self) -> float:
        """Accepted drafts over proposed ones (SGLang's ``spec_accept_rate``)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def accept_length(self) -> float:
        """Tokens output per verify row, the correction or bonus included (SGLang's ``spec_accept_length``)."""
        return (self.accepted_tokens + self.verify_rows) / self.verify_rows if self.verify_rows else 0.0


def spec_stats(spec: SpecManager | None) -> dict:
    """``GET /stats``' ``speculative`` part (zeros, and algorithm None, without speculation)."""
    s = spec.stats if spec is not None else SpecStats()
    return dict(
        algorithm=spec.algorithm if spec is not None else None,
        num_draft_tokens=spec.k if spec is not None else 0,
        verify_rows=s.verify_rows,
        draft_tokens=s.draft_tokens,
        accepted_tokens=s.accepted_tokens,
        accept_rate=s.accept_rate,
        accept_length=s.accept_length,
    )


@dataclass
class SpecPlan:
    """A verify batch's state (``batch.features["speculative"]``): row ``i`` drafted ``drafts[i]`` (maybe none)."""

    drafts: list[list[int]] = field(default_factory=list)


def decode_rows(batch: Batch) -> Batch:
    """A verify batch (an extend of a few positions per request) as a decode batch with one row per
    position: the row at position ``p`` attends to its request's keys ``[0, p]``. The same pass, since a
    pass stores every position's K/V before any row attends; but it is a decode step to the engine, so it
    runs the decode kernels, a CUDA graph on a GPU and the C++ decode layer on a CPU, and each position's
    arithmetic is a plain decode step's (its tokens equal plain decoding in bfloat16 too)."""
    lens = [e - s for s, e in zip(batch.starts, batch.ends)]
    pos = [p for s, e in zip(batch.starts, batch.ends) for p in range(s, e)]
    reqs = [r for r, n in zip(batch.reqs, lens) for _ in range(n)]
    rows = Batch(reqs, "decode", pos, [p + 1 for p in pos], padded_size=len(pos))
    rows.input_ids, rows.positions, rows.out_loc = batch.input_ids, batch.positions, batch.out_loc
    rows.features, rows.label = batch.features, batch.label  # still a verify pass (what an observer sees)
    dev = batch.input_ids.device
    rows.table_idx = batch.table_idx[: batch.size].repeat_interleave(torch.tensor(lens, device=dev))
    rows.logit_idx = torch.arange(len(pos), device=dev)
    return rows


class SpecManager(Feature):
    name = "speculative"

    def __init__(self, algorithm: str, num_draft_tokens: int, verifier: str, engine, held: set[Req], config):
        name = algorithm if ":" in algorithm else algorithm.lower()  # NGRAM is SGLang's spelling; a path keeps its case
        self.algorithm, self.drafter = algorithm, DRAFTERS.get(name).build(config, engine)
        self.verifier = VERIFIERS.get(verifier)()
        self.k, self.engine, self.table = num_draft_tokens, engine, engine.table
        self.stats = SpecStats()
        self.backoff = Backoff(config.speculative_backoff)
        self._drafts: dict[Req, list[int]] = {}  # this step's drafts (already counted in device_len)
        # requests whose verify pass is not processed: their counters are provisional, so no batch plans
        # them (the scheduler's ``DecodeManager.held``; it forgets a request when it stops running)
        self._held = held

    def release(self, req: Req) -> None:
        """``req`` finished, was aborted or retracted: no per-request state outlives it."""
        self.backoff.release(req)
        self.drafter.release(req)

    retract = release

    def before_decode(self, decodable: list[Req]) -> None:
        """Draft for ``decodable``, dropping from it (in place) the speculative requests whose tokens are
        not all on the host yet; the drafts count in their ``device_len`` (a retraction, before the batch
        is made, undoes them)."""
        self._drafts = {}
        keep = []
        for req in decodable:
            if not req.sampling.speculative or req.sampling.plain_sampling or not self.backoff.should_draft(req):
                keep.append(req)  # decodes plainly this step (its tokens need not be on the host)
            elif req.prompt_len + len(req.output_ids) == req.device_len:  # else: waits a step for them
                keep.append(req)
                k = min(self.k, req.max_device_len - req.device_len - 1)
                if k > 0 and (drafts := self.drafter.propose(req, k)[:k]):
                    self._drafts[req] = drafts
                    req.device_len += len(drafts)
        decodable[:] = keep

    def decode_batch(self, reqs: list[Req]) -> Batch | None:
        """The verify batch of what ``before_decode`` left (after retractions), or None if nobody drafted."""
        drafts = [self._drafts.get(r, []) for r in reqs]
        self._drafts = {}
        if not any(drafts):
            return None
        for req, d in zip(reqs, drafts):
            if d:  # the drafts enter the token pool: the pass reads its inputs from there
                self._held.add(req)
                n = req.device_len - len(d)
                self.table.token_pool[req.table_idx, n : n + len(d)] = torch.tensor(d, dtype=torch.int32)
        starts = [r.device_len - 1 - len(d) for r, d in zip(reqs, drafts)]
        batch = Batch(reqs, "prefill", starts, [r.device_len for r in reqs], label="verify")
        batch.features[self.name] = SpecPlan(drafts)
        return batch

    @torch.inference_mode()
    def forward(self, batch: Batch, plan: SpecPlan, info, hooks: SampleHooks | None) -> torch.Tensor:
        """The verify pass: logits at every position, the verdict, the kept token into the token pool.
        Returns ``[B, K + 2]`` int64 on the device: accepted count, then the row's tokens. ``hooks`` (the
        other features': masks, logprobs) run on each request's first position, a plain row's only one."""
        e, dev = self.engine, batch.input_ids.device
        drafts = plan.drafts
        k1 = max(len(d) for d in drafts) + 1
        rows = decode_rows(batch)
        with forward_context(rows, e.attn_backend), use(e.cpu_kernels):
            if e.graph_runner is not None and e.graph_runner.can_run(rows):
                logits = e.graph_runner.replay(rows)  # [tokens, V]: the decode graph of that many rows
            else:
                e.attn_backend.prepare_metadata(rows)
                logits = e.model(rows.input_ids, rows.positions, rows.logit_idx)
        lens = torch.tensor([len(d) + 1 for d in drafts])
        first = torch.cumsum(lens, 0) - lens
        if hooks is not None:
            heads = logits[first.to(dev)]  # [B, V]
            hooks.on_logits(heads)
            logits[first.to(dev)] = heads
        idx = first[:, None] + torch.minimum(torch.arange(k1)[None, :], lens[:, None] - 1)  # padded: row's last
        padded = torch.tensor([d + [-1] * (k1 - 1 - len(d)) for d in drafts], dtype=torch.int64)
        starts = torch.tensor(batch.starts, dtype=torch.int64)
        # output token number at the first position: the pass starts at the last real token (n - 1)
        info.steps = (starts + 1 - torch.tensor([r.prompt_len for r in batch.reqs])).to(dev, non_blocking=True)
        to = lambda t: t.to(dev, non_blocking=True)  # noqa: E731
        verdict = self.verifier.verify(logits[to(idx)], to(padded), info, e.sampler)
        rows = batch.table_idx[: batch.size]
        kept = verdict.tokens.gather(1, verdict.accepted[:, None]).squeeze(1)
        self.table.token_pool[rows, to(starts) + 1 + verdict.accepted] = kept.to(torch.int32)
        if hooks is not None:
            hooks.on_tokens(verdict.tokens[:, 0])
        return torch.cat([verdict.accepted[:, None], verdict.tokens], dim=1)

    def tokens(self, batch: Batch, plan: SpecPlan, i: int, req: Req, row: list[int]) -> list[int]:
        """``row`` (a ``forward`` row on the host) of request ``req`` at batch row ``i``: roll its counters
        back to what the target accepted; returns its new tokens, in order."""
        a, n = row[0], batch.starts[i] + 1
        if drafted := len(plan.drafts[i]):  # (a row without drafts was a plain decode: nothing to undo)
            req.cached_len, req.device_len = self.verifier.rollback(n, drafted, a)
            self._held.discard(req)
            self.backoff.observe(req, a)  # (process skips finished and retracted requests: nothing leaks)
            self.stats.verify_rows += 1
            self.stats.draft_tokens += drafted
            self.stats.accepted_tokens += a
        return row[1 : a + 2]

    def report(self) -> dict:
        return spec_stats(self)


def create(config, engine, scheduler) -> SpecManager | None:
    """The feature ``config`` asks for (``speculative_algorithm``), or None without speculation."""
    if not config.speculative_algorithm:
        return None
    return SpecManager(
        config.speculative_algorithm,
        config.speculative_num_draft_tokens,
        config.components.verifier,
        engine,
        scheduler.decode.held,
        config,
    )
