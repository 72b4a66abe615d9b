"""The scheduler: continuous batching over the engine.

Each ``step()`` picks one batch, runs it, and reports the sampled tokens:

    schedule  -> prefill batch (admit waiting requests, continue a chunked prompt) or decode batch
    prepare   -> allocate KV pages, write the page table, build input/position/slot tensors
    forward   -> engine.forward_batch: model + sampling; sampled ids go into the token pool
    process   -> (host) append tokens, detect finished requests, free or cache their memory

Policy: prefill first (new requests start as soon as memory allows), except that after a chunk of a
long prompt the running requests get one decode step before the next chunk, so a long prompt
delays their next token by at most one chunk.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine.config import EngineConfig
from minisgl.engine.engine import Engine
from minisgl.engine.sample import SamplingInfo
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import Extend, PrefillManager
from minisgl.scheduler.table import ReqTable, ragged_index
from minisgl.utils import nvtx_range

logger = logging.getLogger(__name__)


@dataclass
class TokenEvent:
    """One sampled token of a request; ``finish_reason`` is set on its last one."""

    uid: int
    token_id: int
    finish_reason: str | None = None


@dataclass
class CacheStats:
    prompt_tokens: int = 0  # prompt tokens of admitted requests
    hit_tokens: int = 0  # of which served from the prefix cache
    prefill_tokens: int = 0  # tokens computed by prefill batches

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class Scheduler:
    def __init__(self, config: EngineConfig, engine: Engine | None = None):
        self.config = config
        self.engine = engine or Engine(config)
        e = self.engine
        self.device, self.page_size = e.device, config.page_size
        self.table = ReqTable(e.page_table)
        self.cache = CacheManager(e.num_pages, config.page_size, config.cache_type)
        self.prefill = PrefillManager(self.cache, self.table, config.max_prefill_length)
        self.decode = DecodeManager()
        self.reqs: dict[int, Req] = {}
        self.eos_ids: set[int] = set(e.model_config.eos_token_ids)
        self.stats = CacheStats()
        self._after_chunk = False
        self._sampled: tuple[torch.Tensor, torch.Tensor] | None = None
        self.overlap = config.use_overlap  # on for CUDA by default; may be forced on CPU (tests)
        self._in_flight: tuple[Batch, torch.Tensor, torch.cuda.Event | None] | None = None
        self._seed_rng = random.Random(config.seed)
        self.wait_seconds = 0.0  # host time spent waiting for the device's tokens (0 = host-bound)

    # ---- requests in and out -------------------------------------------------------------
    def add_request(self, uid: int, input_ids: list[int], sampling: SamplingParams) -> Req:
        """Queue a request; raises ``ValueError`` (and queues nothing) if it can never run."""
        return self.add(self.make_request(uid, input_ids, sampling))

    def add(self, req: Req) -> Req:
        """Queue a request made (and validated) by ``make_request``."""
        if req.uid in self.reqs:
            raise ValueError(f"request id {req.uid} is already in use")
        self.reqs[req.uid] = req
        self.prefill.add(req)
        return req

    def make_request(self, uid: int, input_ids: list[int], sampling: SamplingParams) -> Req:
        """Check a request and build it; raises ``ValueError`` saying what to change."""
        sampling.validate()
        if uid in self.reqs:
            raise ValueError(f"request id {uid} is already in use")
        n, vocab = len(input_ids), self.engine.model_config.vocab_size
        if n == 0:
            raise ValueError("the prompt is empty: give at least one token")
        if any(not (0 <= t < vocab) for t in input_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        max_len = self.engine.max_seq_len
        if n >= max_len:
            raise ValueError(
                f"the prompt has {n} tokens but the context is {max_len} tokens (prompt + output); shorten the prompt"
            )
        seed = sampling.seed if sampling.seed is not None else self._seed_rng.getrandbits(63)
        req = Req(uid, list(input_ids), sampling, seed)
        req.max_device_len = min(req.max_device_len, max_len)  # outputs stop at the context ("length")
        need = self.cache.pages_still_needed(req)
        if need > self.engine.num_pages:
            raise ValueError(
                f"the request needs {need * self.page_size} KV slots (prompt {n} + max_tokens) but the "
                f"whole KV pool holds {self.engine.num_pages * self.page_size}; lower max_tokens, "
                "shorten the prompt or give the pool more memory (--num-pages / --memory-ratio)"
            )
        return req

    def abort(self, uid: int) -> bool:
        """Stop a request now and free its memory; False if it is unknown or already done."""
        req = self.reqs.get(uid)
        if req is None:
            return False
        if self.prefill.remove(req):
            del self.reqs[uid]
            req.finish_reason = "abort"
            return True
        if self.prefill.chunked is req:
            self.prefill.chunked = None
        self._finish(req, "abort")
        return True

    def flush_cache(self) -> None:
        """Forget every cached prefix no running request holds (benchmarks time each run from an
        empty cache). Goes through the scheduler, not ``self.cache``, so that TP ranks do it too."""
        self.cache.flush()

    @property
    def has_work(self) -> bool:
        return bool(self.reqs) or self._in_flight is not None

    @property
    def num_running(self) -> int:
        return len(self.decode.running) + (self.prefill.chunked is not None)

    @property
    def num_waiting(self) -> int:
        return len(self.prefill.pending)

    # ---- one step ------------------------------------------------------------------------
    def step(self) -> list[TokenEvent]:
        """Run one batch; return the tokens that reached the host during this call.

        With overlap scheduling, batch ``i+1`` is scheduled and launched *before* batch ``i``'s
        tokens are processed, so the host work of one step hides behind the device work of the
        next. It is correct because nothing batch ``i+1`` needs comes from the host: its inputs are
        read from the token pool on the device, and memory freed while it runs is reused only by
        later work on the same stream. A request that finished in batch ``i`` (on EOS) rides along
        in batch ``i+1`` once; its extra token is dropped."""
        with nvtx_range("schedule"):
            batch = self.schedule()
        launched = None
        if batch is not None:
            with nvtx_range("prepare"):
                info = self.prepare(batch)
            with nvtx_range("forward"):
                tokens = self.launch(batch, info)
                launched = (batch, *self._to_host(tokens))
        if not self.overlap:
            self._in_flight, launched = launched, None
        events: list[TokenEvent] = []
        if self._in_flight is not None:
            done, tokens, ready = self._in_flight
            with nvtx_range("process"):
                if ready is not None:
                    t = time.perf_counter()
                    ready.synchronize()
                    self.wait_seconds += time.perf_counter() - t
                events = self.process(done, tokens)
        self._in_flight = launched
        if self.config.debug_checks and self._in_flight is None:
            self.check_memory()
        return events

    def _to_host(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        if tokens.device.type != "cuda":
            return tokens, None
        host = tokens.to("cpu", non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return host, ready

    def schedule(self) -> Batch | None:
        if self.prefill.has_work and not (self._after_chunk and self.decode.schedule()):
            admitted = list(self.decode.running) + ([self.prefill.chunked] if self.prefill.chunked else [])
            reserved = sum(self.cache.pages_still_needed(r) for r in admitted)
            extends = self.prefill.schedule(reserved)
            for x in extends:
                if x.start == x.req.hit_len:  # first chunk of a newly admitted request
                    self.stats.prompt_tokens += x.req.prompt_len
                    self.stats.hit_tokens += x.req.hit_len
            if extends:
                self._after_chunk = self.prefill.chunked is not None
                return self._batch(extends, "prefill")
        self._after_chunk = False
        reqs = self.decode.schedule()
        if not reqs:
            return None
        return self._batch([Extend(r, r.device_len - 1, r.device_len) for r in reqs], "decode")

    def _batch(self, extends: list[Extend], phase: str) -> Batch:
        batch = Batch([x.req for x in extends], phase)  # type: ignore[arg-type]
        batch.starts = [x.start for x in extends]
        batch.ends = [x.end for x in extends]
        return batch

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
            new_rows, new_cols = ragged_index(rows, have, want)
            table.set_slots(new_rows, new_cols, self.cache.alloc_slots(n_new // p))
            for req, w in zip(batch.reqs, want.tolist()):
                req.alloc_len = w
        table.sync()
        tok_rows, tok_pos = ragged_index(rows, starts, ends)
        lens = ends - starts
        dev = lambda t: t.to(self.device, non_blocking=True)  # from pageable memory: staged, never waits
        batch.out_loc = dev(table.page_table_cpu[tok_rows, tok_pos].to(torch.int64))
        batch.positions = dev(tok_pos)
        batch.input_ids = table.token_pool[dev(tok_rows), batch.positions]
        batch.logit_idx = dev(torch.cumsum(lens, 0) - 1)
        batch.table_idx = dev(rows)
        info = SamplingInfo.from_batch(batch, self.engine.model_config.vocab_size, self.device)
        batch.sample_mask = []
        for req, end in zip(batch.reqs, batch.ends):
            keep = end == req.device_len
            batch.sample_mask.append(keep)
            req.cached_len = end
            if keep:
                req.device_len += 1
                if self.prefill.chunked is not req:
                    self.decode.add(req)
        if batch.is_prefill:
            self.stats.prefill_tokens += int(lens.sum())
        keep = [i for i, k in enumerate(batch.sample_mask) if k]
        self._sampled = (dev(i64(keep)), dev(ends[keep])) if len(keep) < batch.size else None
        return info

    def launch(self, batch: Batch, info: SamplingInfo) -> torch.Tensor:
        """Run the forward pass; write the kept samples into the token pool (on the device), where
        the next decode batch reads its inputs."""
        tokens = self.engine.forward_batch(batch, info)
        if self._sampled is None:  # every row keeps its sample (index tensors, not a mask: no sync)
            rows, pos, kept = batch.table_idx, batch.positions[batch.logit_idx] + 1, tokens
        else:
            idx, pos = self._sampled
            rows, kept = batch.table_idx[idx], tokens[idx]
        self.table.token_pool[rows, pos] = kept.to(torch.int32)
        return tokens

    def process(self, batch: Batch, tokens: torch.Tensor) -> list[TokenEvent]:
        events = []
        for req, keep, tok in zip(batch.reqs, batch.sample_mask, tokens.tolist()):
            if not keep or req.finish_reason is not None:
                continue
            req.output_ids.append(tok)
            reason = None
            if tok in req.sampling.stop_token_ids or (not req.sampling.ignore_eos and tok in self.eos_ids):
                reason = "stop"
            elif req.prompt_len + len(req.output_ids) >= req.max_device_len:
                reason = "length"
            events.append(TokenEvent(req.uid, tok, reason))
            if reason is not None:
                self._finish(req, reason)
            elif len(req.output_ids) == 1 and self.cache.cache.shares_prefixes:
                self._share_prompt(req)
        return events

    def _share_prompt(self, req: Req) -> None:
        """Insert a request's freshly prefilled prompt into the prefix cache (its KV is written:
        this runs after the batch, and later batches are ordered after it on the device)."""
        old = req.locked_len
        match = self.cache.cache_prompt(
            req.input_ids, self.table.slots(req.table_idx, 0, req.alloc_len), old, req.cache_handle
        )
        req.locked_len, req.cache_handle = match.length, match.handle
        if match.length > old:  # point the duplicate range at the cache's copy (a no-op where it was ours)
            rows = torch.full((match.length - old,), req.table_idx, dtype=torch.int64)
            self.table.set_slots(rows, torch.arange(old, match.length), match.indices[old:])

    def _finish(self, req: Req, reason: str) -> None:
        req.finish_reason = reason  # type: ignore[assignment]
        self.decode.remove(req)
        self.reqs.pop(req.uid, None)
        if req.table_idx < 0:
            return
        tokens = req.all_token_ids()[: req.cached_len]
        slots = self.table.slots(req.table_idx, 0, req.alloc_len)
        self.cache.release(tokens, slots, req.locked_len, req.cache_handle)
        self.table.free_row(req.table_idx)
        req.table_idx = -1

    # ---- invariants ----------------------------------------------------------------------
    def check_memory(self) -> None:
        """Every slot is free, in the cache, or owned by exactly one admitted request, and no
        request holds more than it reserved."""
        cache = self.cache.cache
        cache.check_integrity()
        admitted = [r for r in self.reqs.values() if r.table_idx >= 0]
        owned = sum(r.alloc_len - r.locked_len for r in admitted)
        total = self.cache.allocator.num_free * self.page_size + cache.evictable_size + cache.protected_size
        assert total + owned == self.engine.num_pages * self.page_size, (
            f"KV accounting broken: free+cached {total} + owned {owned} != {self.engine.num_pages * self.page_size}"
        )
        for r in admitted:
            assert r.alloc_len <= -(-(r.max_device_len - 1) // self.page_size) * self.page_size, (
                f"request {r.uid} holds more KV than it reserved"
            )
        assert len(admitted) <= self.config.max_running_requests
