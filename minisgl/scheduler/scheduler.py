"""The scheduler: continuous batching over the engine.

Each ``step()`` runs one batch through four phases (the loop, plain or overlapped, decides their
order across steps: ``loop.py``):

    schedule  -> prefill batch (admit waiting requests, continue a chunked prompt) or decode batch
    prepare   -> allocate KV pages, write the page table, build input/position/slot tensors
    launch    -> engine.forward_batch: model + sampling; sampled ids go into the token pool
    process   -> (host) append tokens, detect finished requests (the loop then ``free``s their
                 memory, to the prefix cache or the free list, once no launched batch reads it)

Policy: prefill first (new requests start as soon as memory allows; who starts is the admission
policy's call, ``admission.py``), except that after a chunk of a long prompt the running requests
get one decode step before the next chunk (``chunking.py``). When a batch needs more KV pages than
are free or evictable (the admission policy reserved less than requests grew to), the newest
running requests are *retracted*: their KV goes to the prefix cache, and they wait again, first in
line, keeping their outputs (a token of theirs still in flight is dropped and generated again).
What a request asks besides its tokens is a ``Feature``'s business (``minisgl/feature.py``), called at
fixed points of these phases.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import torch

from minisgl.core import Batch, Req, RequestError, SamplingParams
from minisgl.engine.config import EngineConfig
from minisgl.engine.engine import Engine
from minisgl.engine.sample import SamplingInfo
from minisgl.feature import Feature, HookList, Offered, build_features, release
from minisgl.kvcache import ragged_index
from minisgl.scheduler.admission import ADMISSION_POLICIES, Extend
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.chunking import CHUNKING_POLICIES
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.events import BatchObserver, CacheStats, Recorder, TokenEvent
from minisgl.scheduler.loop import LOOPS
from minisgl.scheduler.prefill import PrefillManager
from minisgl.scheduler.requests import make_request


class Scheduler:
    def __init__(self, config: EngineConfig, engine: Engine | None = None):
        self.config = config
        self.engine = engine or Engine(config)
        e, parts = self.engine, config.components
        self.device, self.page_size = e.device, config.page_size
        self.table = e.table
        self.cache = CacheManager(e.num_pages, config.page_size, config.cache_type, self.table, parts.allocator)
        timed = parts.chunking == "default" and config.step_time is not None  # steps bounded in seconds
        self.chunking = CHUNKING_POLICIES.get("adaptive" if timed else parts.chunking)()
        self.admission = ADMISSION_POLICIES.get(parts.admission)()
        budgets = (config.max_prefill_length, config.idle_prefill_length)
        self.prefill = PrefillManager(self.cache, self.table, budgets, self.admission, self.chunking)
        self.decode = DecodeManager()
        self.loop = LOOPS.get(config.loop)(self)
        self.reqs: dict[int, Req] = {}
        self.eos_ids: set[int] = set(e.model_config.eos_token_ids)
        self.features: list[Feature] = build_features(config, e, self)  # what requests ask besides tokens
        # made, not yet queued: waiting for the features' work to be done (see feature.py)
        self.offered = Offered(self.features, self.add)
        self.stats = CacheStats()
        self.recorder = Recorder()
        self.observers: list[BatchObserver] = self.recorder.observers  # called with each processed batch's event
        if self.chunking.measures:  # AdaptiveChunking measures the steps it sizes
            self.chunking.target_s = config.step_time or self.chunking.target_s
            self.observers.append(self.chunking.observe)
        self._after_chunk = False
        self._sampled: tuple[torch.Tensor, torch.Tensor] | None = None
        self._seed_rng = random.Random(config.seed)
        self._retracted: list[int] = []  # uids retracted while planning the next batch
        self._finished: dict[Req, str] = {}  # finished, memory held until the loop frees it -> reason
        self._untaken: list[Req] = []  # of those, not yet handed to the loop (take_finished)
        self.wait_seconds = 0.0  # host time spent waiting for the device's tokens (0 = host-bound)

    # ---- requests in and out -------------------------------------------------------------
    def add_request(self, uid: int, input_ids: list[int], sampling: SamplingParams) -> Req:
        """Queue a request; raises ``RequestError`` (and queues nothing) if it can never run."""
        return self.add(self.make_request(uid, input_ids, sampling))

    def add(self, req: Req) -> Req:
        """Queue a request made (and validated) by ``make_request``."""
        if req.uid in self.reqs:
            raise RequestError(f"request id {req.uid} is already in use")
        self.reqs[req.uid] = req
        for f in self.features:
            f.track(req)
        self.prefill.add(req)
        return req

    def feature(self, name: str) -> Feature | None:
        """The feature called ``name`` (``minisgl/feature.py``), if this scheduler has it."""
        return next((f for f in self.features if f.name == name), None)

    def make_request(self, uid: int, input_ids: list[int], sampling: SamplingParams) -> Req:
        """Check a request and build it, resolving its defaults (``requests.py``: the one place where
        a request is validated). Raises ``RequestError`` saying what to change."""
        if uid in self.reqs:
            raise RequestError(f"request id {uid} is already in use")
        req = make_request(uid, input_ids, sampling, self.engine, self.cache, lambda: self._seed_rng.getrandbits(63))
        for f in self.features:  # may refuse it, or start its work (a compile it needs first)
            f.validate(req)
        return req

    def abort(self, uid: int) -> bool:
        """Stop a request now and free its memory (a batch in flight with it: the loop frees it once
        processed); False if it is unknown or already done."""
        if self.offered.remove(uid):
            return True
        req = self.reqs.get(uid)
        if req is None:
            return False
        if self.prefill.remove(req):
            del self.reqs[uid]
            release(self.features, req)
            req.finish("abort")
            return True
        if self.prefill.chunked is req:
            self.prefill.chunked = None
        self._finish(req, "abort")
        if not self.loop.in_flight:  # no launched batch reads its memory: free it now, not at the next step
            self._untaken.remove(req)
            self.free(req)
        return True

    def add_eos_ids(self, ids) -> None:
        """More token ids that end a request (the tokenizer's, next to the model config's)."""
        self.eos_ids |= {int(i) for i in ids}

    def flush_cache(self) -> None:
        """Forget every cached prefix no running request holds (through the scheduler: TP ranks too)."""
        self.cache.flush()

    @property
    def has_work(self) -> bool:
        return bool(self.reqs) or self.loop.in_flight or bool(self._finished)

    @property
    def num_running(self) -> int:
        return len(self.decode.running) + (self.prefill.chunked is not None)

    @property
    def num_waiting(self) -> int:
        return len(self.prefill.pending) + len(self.offered)

    # ---- one step ------------------------------------------------------------------------
    def step(self) -> list[TokenEvent]:
        """Run one batch; return the tokens that reached the host during this call."""
        events = self.loop.step()
        if self.config.debug_checks and not self.loop.in_flight:
            assert not self._finished, (
                f"requests {[r.uid for r in self._finished]} finished and nothing is in flight, but their memory "
                "was never freed: the loop must free() every request take_finished() returns"
            )
            self.check_memory()
        return events

    def schedule(self) -> Batch | None:
        self.recorder.scheduling()
        self._retracted, decodable = [], self.decode.schedule()
        mixed = self.config.mixed_chunk  # decodes ride in prefill batches: no separate decode step
        if self.prefill.has_work and (mixed or not self.chunking.decode_first(self._after_chunk, len(decodable))):
            chunked, riders = self.prefill.chunked, decodable if mixed else []
            # the chunk's reserved pages may have gone to decodes that outgrew theirs; riders need theirs now
            need = lambda: self._pages_to_feed(chunked) + sum(r.alloc_len < r.device_len for r in riders)
            self._make_room(need, riders)
            running = list(self.decode.running) + ([chunked] if chunked else [])
            extends = self.prefill.schedule(running, len(decodable))
            self.stats.count(extends)
            if extends:
                self._after_chunk = self.prefill.chunked is not None
                batch = self._batch(extends + [Extend(r, r.device_len - 1, r.device_len) for r in riders], "prefill")
                batch.riders = len(riders)
                return batch
        self._after_chunk = False
        for f in self.features:  # may hold requests back from this step, or grow them
            f.before_decode(decodable)
        self._make_room(lambda: sum(self._pages_to_feed(r) for r in decodable), decodable)
        if not decodable:
            return None
        own = next((b for f in self.features if (b := f.decode_batch(decodable)) is not None), None)
        return own or self._batch([Extend(r, r.device_len - 1, r.device_len) for r in decodable], "decode")

    def _pages_to_feed(self, req: Req | None) -> int:
        """Pages a request still needs for the positions it feeds next, up to ``device_len - 1`` (0 for None)."""
        return 0 if req is None else max(0, self.cache.pages_for(req.device_len) - req.alloc_len // self.page_size)

    def _make_room(self, pages: Callable[[], int], batch: list[Req]) -> None:
        """Retract running requests, newest first, until ``pages()`` fit in the free and evictable
        pages; ``batch`` (the planned decode requests) loses those retracted from it. The oldest
        request always stays: alone, any request fits the pool (``make_request`` checks it)."""
        while pages() > self.cache.available_pages:
            pool = batch if batch else list(self.decode.running)
            if len(pool) > (1 if batch else 0):
                victim = pool[-1]
            elif self.prefill.chunked is not None and batch:
                victim, self.prefill.chunked = self.prefill.chunked, None
            else:
                raise MemoryError(f"the KV pool cannot hold {pages()} more pages even for one request")
            self._retract(victim)
            if victim in batch:
                batch.remove(victim)

    def _retract(self, req: Req) -> None:
        self.decode.remove(req)
        for f in self.features:
            f.retract(req)
        self.cache.release_request(req)
        req.retract()
        self.prefill.pending.appendleft(req)
        self.admission.on_retract([req])
        self.stats.retracted += 1
        self._retracted.append(req.uid)

    def _batch(self, extends: list[Extend], phase: str) -> Batch:
        return Batch([x.req for x in extends], phase, [x.start for x in extends], [x.end for x in extends])  # type: ignore[arg-type]

    def prepare(self, batch: Batch) -> SamplingInfo:
        """Allocate KV for the batch's new tokens, build its tensors, and advance the requests'
        counters (as if the pass had already run: the next batch may be planned before it ends)."""
        p, table = self.page_size, self.table
        i64 = lambda x: torch.tensor(x, dtype=torch.int64)
        rows, starts, ends = i64([r.table_idx for r in batch.reqs]), i64(batch.starts), i64(batch.ends)
        # new pages: positions [alloc_len, end rounded up to a page), for all requests at once
        have = i64([r.alloc_len for r in batch.reqs])
        want = torch.maximum((ends + p - 1) // p * p, have)
        n_new = int((want - have).sum())
        if n_new:
            table.map_pages(rows, have, want, self.cache.alloc_pages(n_new // p))
            for req, w in zip(batch.reqs, want.tolist()):
                req.grow_alloc(w)
        table.sync()
        tok_rows, tok_pos = ragged_index(rows, starts, ends)
        lens = ends - starts
        dev = lambda t: t.to(self.device, non_blocking=True)  # from pageable memory: staged, never waits
        batch.out_loc = dev(table.slots_at(tok_rows, tok_pos))
        batch.positions = dev(tok_pos)
        batch.input_ids = table.token_pool[dev(tok_rows), batch.positions]
        batch.logit_idx = dev(torch.cumsum(lens, 0) - 1)
        batch.table_idx = dev(rows)
        info = SamplingInfo.from_batch(batch, self.engine.model_config.vocab_size, self.device)
        for f in self.features:
            if (state := f.plan(batch)) is not None:
                batch.features[f.name] = state
        batch.epochs = [r.epoch for r in batch.reqs]
        self.admission.on_batch()
        batch.sample_mask = []
        for req, end in zip(batch.reqs, batch.ends):
            keep = req.extend_to(end)
            batch.sample_mask.append(keep)
            if keep and self.prefill.chunked is not req:
                self.decode.add(req)
        self.prefill.launching(batch, self.cache.shares_prefixes)
        keep = [i for i, k in enumerate(batch.sample_mask) if k]
        self._sampled = (dev(i64(keep)), dev(ends[keep])) if len(keep) < batch.size else None
        self.recorder.prepared(self, batch)
        return info

    def launch(self, batch: Batch, info: SamplingInfo) -> torch.Tensor:
        """Run the forward pass; write the kept samples into the token pool (on the device), where
        the next decode batch reads its inputs."""
        active = [(f, batch.features[f.name]) for f in self.features if f.name in batch.features]
        hooks = [h for f, s in active if (h := f.hooks(batch, s, self.table.token_pool)) is not None]
        hooks = HookList(hooks) if hooks else None
        tokens = next((t for f, s in active if (t := f.forward(batch, s, info, hooks)) is not None), None)
        if tokens is None:  # the engine's pass (a feature's own pass writes its kept tokens itself)
            # (the two-argument call without hooks: lessons and tests wrap forward_batch)
            tokens = self.engine.forward_batch(batch, info, hooks) if hooks else self.engine.forward_batch(batch, info)
            if self._sampled is None:  # every row keeps its sample (index tensors, not a mask: no sync)
                rows, pos, kept = batch.table_idx, batch.positions[batch.logit_idx] + 1, tokens
            else:
                idx, pos = self._sampled
                rows, kept = batch.table_idx[idx], tokens[idx]
            self.table.token_pool[rows, pos] = kept.to(torch.int32)
        for f, s in active:
            f.launched(batch, s)
        self.recorder.launched()
        return tokens

    def to_host(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        if tokens.device.type != "cuda":
            return tokens, None
        host, ready = tokens.to("cpu", non_blocking=True), torch.cuda.Event()
        ready.record()
        return host, ready

    def wait(self, ready: torch.cuda.Event | None) -> None:
        if ready is not None:
            t = time.perf_counter()
            ready.synchronize()
            self.wait_seconds += time.perf_counter() - t

    def process(self, batch: Batch, tokens: torch.Tensor) -> list[TokenEvent]:
        events: list[TokenEvent] = []
        states = [(f, batch.features.get(f.name)) for f in self.features]
        for f, s in states:
            if s is not None:
                f.processing(batch, s)
        for i, (req, keep, epoch, row) in enumerate(zip(batch.reqs, batch.sample_mask, batch.epochs, tokens.tolist())):
            if not keep or req.finish_reason is not None or req in self._finished or req.epoch != epoch:
                continue
            # a feature's own pass may yield several tokens a row (a verify pass's accepted ones), one by one
            new = next((t for f, s in states if s is not None and (t := f.tokens(batch, s, i, req, row))), [row])
            finished = False
            for tok in new:
                ev = TokenEvent(req.uid, tok, req.append_token(tok, self.eos_ids))
                for f, s in states:
                    f.on_token(batch, s, i, req, ev)  # may add to it, or end the request
                events.append(ev)
                if finished := ev.finish_reason is not None:
                    self._finish(req, ev.finish_reason)
                    break
            if not finished and len(req.output_ids) == 1 and self.cache.shares_prefixes:
                self.cache.share_prompt(req)
        self.prefill.processed(batch)
        self.recorder.processed(events)
        return events

    def _finish(self, req: Req, reason: str) -> None:
        self.decode.remove(req)
        release(self.features, req)
        self.reqs.pop(req.uid, None)
        if not req.is_admitted:
            req.finish(reason)  # type: ignore[arg-type]
        elif req not in self._finished:  # a launched batch may still read its memory: the loop frees it
            self._finished[req] = reason
            self._untaken.append(req)

    def take_finished(self) -> list[Req]:
        taken, self._untaken = self._untaken, []
        return taken

    def free(self, req: Req) -> None:
        reason = self._finished.pop(req, None)
        if reason is None:
            raise RuntimeError(f"free(request {req.uid}): not finished, or freed already")
        self.cache.release_request(req)
        req.finish(reason)  # type: ignore[arg-type]

    # ---- invariants ----------------------------------------------------------------------
    def check_memory(self) -> None:
        """Every slot is free, in the cache, or owned by exactly one admitted request, and no
        request holds more than it reserved."""
        admitted = [r for r in self.reqs.values() if r.is_admitted]
        self.cache.check(admitted + list(self._finished))
        assert len(admitted) + len(self._finished) <= self.config.max_running_requests
