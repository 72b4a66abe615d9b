"""The scheduler process: the in-process ``Scheduler`` behind a ZMQ inbox.

One process per tensor-parallel rank. Rank 0 alone talks ZMQ and reports tokens; with
``tp_size > 1`` it is a ``ReplicatedScheduler`` and the other ranks ``follow`` its command log
(``minisgl/scheduler/replicated.py``), exactly as ``LLM(tp_size=N)`` does offline.

Loop: take every waiting message (block only while there is nothing to run), apply them, run one
step, send its tokens to the detokenizer. A malformed frame, or a message that fails to apply, is
dropped and logged (``minisgl.server.ipc``): the loop never dies of its input. While one step runs
for more than half a second (a long prefill, a first-time kernel compile), a thread says so twice a
second (``BusyMsg``), so that ``/health`` tells a busy scheduler from a hung one.

``FlushCacheReqMsg`` (``POST /flush_cache``) empties the prefix cache only while no request is
running or waiting, as SGLang does: otherwise it is refused, and nothing is flushed. A partial flush
(the prefixes no running request holds) would leave the cache holding what the running requests
lock, and a benchmark that flushes to start from an empty cache would silently measure a warm one.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import deque
from typing import Any

from minisgl.core import RequestError
from minisgl.engine.config import EngineConfig
from minisgl.message import (
    AbortMsg,
    Addresses,
    BatchTokenMsg,
    BusyMsg,
    ErrorMsg,
    FlushCacheReqMsg,
    GenerateMsg,
    PingMsg,
    ReadyMsg,
    StatsMsg,
    StatsReqMsg,
    TokenLogprobs,
    TokenMsg,
    encode,
)
from minisgl.process import setup_child
from minisgl.scheduler import Scheduler
from minisgl.scheduler.events import BatchEvent
from minisgl.scheduler.replicated import LeaderGone, ReplicatedScheduler, follow
from minisgl.scheduler.warmup import warm_up
from minisgl.server.ipc import MsgReader, bind_inbox
from minisgl.speculative.feature import spec_stats

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 500  # an idle scheduler still wakes up this often
COMPILE_POLL_MS = 5  # how often an otherwise idle scheduler looks whether a grammar has compiled
MAX_MSGS_PER_STEP = 256  # messages taken between two steps (the rest wait for the next)
BUSY_EVERY_S = 0.5  # the busy thread reports every this often, once a step has run this long
ACCEPTS = (GenerateMsg, AbortMsg, StatsReqMsg, FlushCacheReqMsg, ReadyMsg, PingMsg)  # from the tokenizer


class SchedulerWorker:
    """Rank 0: requests in over ZMQ, tokens out."""

    def __init__(self, sched: Scheduler, addrs: Addresses):
        import zmq

        self.sched, self.config = sched, sched.config
        self.tp_size = self.config.tp_size
        self.reqs: dict[int, Any] = {}  # uid -> Req, while the request lives (for its prompt counts)
        self.finished = self.aborted = self.rejected = self.generated = 0
        # for GET /metrics' queue-time histogram: when each request entered the queue (perf_counter), and the
        # waits of the latest ones to leave it (readers keep their own count of those seen: several may read)
        self.arrived: dict[int, float] = {}
        self.waits, self.num_waits = deque(maxlen=1024), 0
        sched.observers.append(self._left_queue)
        self.reader = MsgReader("scheduler", ACCEPTS)
        self.step_started: float | None = None  # monotonic time, while inside sched.step()
        # flush requests that found no request live but memory still held by a batch in flight
        # (the overlap loop frees it one step later): answered once the scheduler has no work
        self.flushes: list[int] = []
        self.ctx = ctx = zmq.Context()
        self.inbox = bind_inbox(ctx, addrs.scheduler)
        self.outbox = ctx.socket(zmq.PUSH)
        self.outbox.connect(addrs.detokenizer)
        self.addrs = addrs

    def info(self) -> dict[str, Any]:
        from minisgl.models.embedded import EMBEDDED_NAME

        e = self.sched.engine
        return dict(
            model=self.config.model or EMBEDDED_NAME,
            max_seq_len=e.max_seq_len,
            vocab_size=e.model_config.vocab_size,
            num_pages=e.num_pages,
            page_size=self.sched.page_size,
            tp_size=self.tp_size,
            device=str(e.device),
            dtype=str(e.dtype).removeprefix("torch."),
            # for GET /get_model_info and /get_server_info: the model's kind, the resolved settings
            model_type=e.model_config.model_type,
            architectures=_architectures(e.model_path),
            max_prefill_length=self.config.max_prefill_length,
            max_running_requests=self.config.max_running_requests,
            cache_type=self.config.cache_type,
            kv_cache_dtype=self.config.kv_cache_dtype,
            attention_backend=self.config.attention_backend,
        )

    def stats(self) -> dict[str, Any]:
        s, c = self.sched, self.sched.cache
        total = s.engine.num_pages * s.page_size
        free = c.allocator.num_free * s.page_size
        evictable, protected = c.cache.evictable_size, c.cache.protected_size
        return dict(
            running_requests=s.num_running,
            waiting_requests=s.num_waiting,
            finished_requests=self.finished,
            aborted_requests=self.aborted,
            rejected_requests=self.rejected,
            kv=dict(
                total_slots=total,
                free_slots=free,
                evictable_slots=evictable,  # cached prefixes nobody uses: reclaimable at once
                protected_slots=protected,  # cached prefixes locked by running requests
                used_slots=total - free - evictable - protected,  # owned by running requests
                page_size=s.page_size,
                usage=(total - free - evictable) / total,
            ),
            generated_tokens=self.generated,
            retracted_requests=s.stats.retracted,
            queue_times=dict(count=self.num_waits, latest=list(self.waits)),
            cache=dict(
                hit_rate=s.stats.hit_rate,
                prompt_tokens=s.stats.prompt_tokens,
                hit_tokens=s.stats.hit_tokens,
                prefill_tokens=s.stats.prefill_tokens,
            ),
            # the features' counters; ``speculative`` is always there (zeros without it: a stable shape)
            **{"speculative": spec_stats(None)} | {f.name: r for f in s.features if (r := f.report())},
        )

    def _left_queue(self, ev: BatchEvent) -> None:
        """Observer: a request's first batch ends its wait (SGLang's queue time: queued -> first scheduled)."""
        for uid in ev.uids:
            if (t := self.arrived.pop(uid, None)) is not None:
                self.waits.append(ev.t_scheduled - t)
                self.num_waits += 1

    # ---- messages ----------------------------------------------------------------------------
    def _recv(self) -> list[Any]:
        import zmq

        msgs: list[Any] = []
        timeout = 0 if self.sched.has_work else COMPILE_POLL_MS if len(self.sched.offered) else IDLE_POLL_MS
        if self.inbox.poll(timeout):
            # at most MAX_MSGS_PER_STEP: a flood that arrives as fast as it is read must not keep
            # the running requests from ever stepping again
            for _ in range(MAX_MSGS_PER_STEP):
                try:
                    frame = self.inbox.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                msg = self.reader.read(frame)
                if msg is not None:
                    msgs.append(msg)
        return msgs

    def _send(self, msg: Any) -> None:
        self.outbox.send(encode(msg))

    def _generate(self, msg: GenerateMsg) -> None:
        try:
            req = self.sched.make_request(msg.uid, msg.input_ids, msg.sampling)
        except RequestError as err:
            self.rejected += 1
            self._send(ErrorMsg(msg.uid, str(err), 400, code=err.code, param=err.param))
            return
        self.sched.offered.add(req)  # queued once its features' work (a grammar's compile) is done
        self.reqs[req.uid] = req
        self.arrived[req.uid] = time.perf_counter()
        self._add_offered()

    def _add_offered(self) -> None:
        """Queue the offered requests whose work is done; refuse those whose work failed (a grammar that
        does not compile). The work runs on threads of the scheduler: the loop steps meanwhile."""
        for req, err in self.sched.offered.admit():
            self.rejected += 1
            self.reqs.pop(req.uid, None)
            self.arrived.pop(req.uid, None)
            self._send(ErrorMsg(req.uid, str(err), 400, code=err.code, param=err.param))

    def _apply(self, msg: Any, out: list[TokenMsg]) -> None:
        if isinstance(msg, GenerateMsg):
            self._generate(msg)
        elif isinstance(msg, AbortMsg):
            if self.sched.abort(msg.uid):  # (one still offered too: a compile nobody waits for stops)
                self.aborted += 1
                self.reqs.pop(msg.uid, None)
                self.arrived.pop(msg.uid, None)
                out.append(TokenMsg(msg.uid, -1, "abort"))
        elif isinstance(msg, StatsReqMsg):
            self._send(StatsMsg(msg.uid, self.stats()))
        elif isinstance(msg, FlushCacheReqMsg):
            self.flushes.append(msg.uid)
            self._answer_flushes()
        elif isinstance(msg, ReadyMsg):  # the tokenizer's, on its way to the API server
            self.sched.add_eos_ids(msg.info.get("eos_ids", ()))  # as LLM does with its tokenizer
            self._send(msg)
        elif isinstance(msg, PingMsg):  # the API server's heartbeat, on its way back
            self._send(msg)

    def _answer_flushes(self) -> None:
        """Flush (and answer every waiting flush request) if no request is live; refuse them if one
        is. Memory that only a batch in flight still holds waits for the next step."""
        s = self.sched
        if s.reqs:
            why = (
                f"the cache was not flushed: {s.num_running} running and {s.num_waiting} waiting requests; "
                "it is flushed only when no request is running or waiting (retry once they finish)"
            )
            answer = dict(flushed=False, message=why, freed_tokens=0)
        elif s.has_work:  # finished, not yet freed: their prefixes join the cache at the next step
            return
        else:
            freed = s.cache.cache.evictable_size
            s.flush_cache()  # through the scheduler: with TP, every rank flushes
            answer = dict(flushed=True, message="Cache flushed.", freed_tokens=freed)
        for uid in self.flushes:
            self._send(StatsMsg(uid, answer))
        self.flushes = []

    def _report_busy(self) -> None:
        """Thread: every BUSY_EVERY_S, if one step has run that long, say so (on its own socket:
        a ZMQ socket belongs to one thread)."""
        import zmq

        out = self.ctx.socket(zmq.PUSH)
        out.connect(self.addrs.detokenizer)  # through the detokenizer: it proves that one alive too
        while True:
            time.sleep(BUSY_EVERY_S)
            started = self.step_started  # one read: the main thread may reset it meanwhile
            if started is not None and time.monotonic() - started >= BUSY_EVERY_S:
                out.send(encode(BusyMsg(time.monotonic() - started)))

    def run(self) -> None:
        self._send(ReadyMsg("scheduler", self.info()))
        logger.info("scheduler ready: %s", self.info())
        threading.Thread(target=self._report_busy, name="busy-reporter", daemon=True).start()
        while True:
            out: list[TokenMsg] = []
            for msg in self._recv():
                try:
                    self._apply(msg, out)
                except Exception as e:  # well-formed, yet it cannot apply (e.g. ReadyMsg.info with bad eos_ids)
                    self.reader.drop(f"{type(msg).__name__} failed to apply: {type(e).__name__}: {e}")
            if self.sched.has_work:
                self.step_started = time.monotonic()
                events = self.sched.step()
                self.step_started = None
                self.generated += len(events)
                for ev in events:
                    req = self.reqs.get(ev.uid)
                    if req is None:  # aborted meanwhile (the scheduler drops those; belt and braces)
                        continue
                    lps = token_logprobs(ev, req)
                    out.append(TokenMsg(ev.uid, ev.token_id, ev.finish_reason, req.prompt_len, req.hit_len, *lps))
                    if ev.finish_reason is not None:
                        self.finished += 1
                        del self.reqs[ev.uid]
            if len(self.sched.offered):
                self._add_offered()
            if out:
                self._send(BatchTokenMsg(out))
            if self.flushes:
                self._answer_flushes()


def token_logprobs(ev: Any, req: Any) -> tuple[TokenLogprobs | None, TokenLogprobs | None]:
    """A ``TokenEvent``'s logprobs as they travel: the token's, and the prompt's (first token only)."""
    split = lambda tops: ([[i for i, _ in t] for t in tops], [[v for _, v in t] for t in tops])
    out = prompt = None
    if ev.logprob is not None:
        out = TokenLogprobs([ev.token_id], [ev.logprob], *split([ev.top_logprobs or []]))
    if ev.prompt_logprobs is not None:
        lps = ev.prompt_logprobs
        prompt = TokenLogprobs(list(req.input_ids), [lp for lp, _ in lps], *split([t for _, t in lps]))
    return out, prompt


def _architectures(model_path: Any) -> list[str] | None:
    """``config.json``'s ``architectures`` of the model folder (None: no folder, e.g. dummy weights)."""
    import json
    from pathlib import Path

    try:
        return list(json.loads((Path(model_path) / "config.json").read_text()).get("architectures") or [])
    except (TypeError, OSError, ValueError):
        return None


def run_scheduler(config: EngineConfig, addrs: Addresses | None, log_level: str) -> None:
    """Process entry point (one per TP rank; only rank 0 talks to the other processes, at ``addrs``)."""
    name = "scheduler" if config.tp_size == 1 else f"scheduler-{config.tp_rank}"
    setup_child(name, log_level)
    try:
        if config.tp_rank > 0:
            sched = Scheduler(config)
        else:
            sched = ReplicatedScheduler(config) if config.tp_size > 1 else Scheduler(config)
    except (ValueError, FileNotFoundError, NotImplementedError) as e:  # bad arguments: no traceback
        logger.error("cannot start the engine: %s", e)
        sys.exit(1)
    if config.tp_rank > 0:
        try:
            follow(sched)
        except LeaderGone as e:  # on another node this is how a stop of node 0 arrives
            logger.info("rank 0 has gone (%s); stopping", e)
            # Not a normal return: gloo's threads still hold the dead peer's sockets, and tearing
            # them down at interpreter exit can abort the process ("terminate called without an
            # active exception", code -6) although the stop was clean.
            logging.shutdown()
            os._exit(0)
        return
    if sched.device.type == "cuda":  # before the server says it is ready
        logger.info("warmed up in %.1f s", warm_up(sched))
    else:  # the same for the C++ kernels: no request's step waits for their compile
        from minisgl.kernels.jit import wait_built

        wait_built(logger.info)
    SchedulerWorker(sched, addrs).run()
