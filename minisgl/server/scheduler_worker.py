"""The scheduler process: the in-process ``Scheduler`` behind a ZMQ inbox.

One process per tensor-parallel rank. Rank 0 alone talks ZMQ and reports tokens; with
``tp_size > 1`` it is a ``ReplicatedScheduler`` and the other ranks ``follow`` its command log
(``minisgl/scheduler/replicated.py``), exactly as ``LLM(tp_size=N)`` does offline.

Loop: take every waiting message (block only while there is nothing to run), apply them, run one
step, send its tokens to the detokenizer.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from minisgl.core import RequestError
from minisgl.engine.config import EngineConfig
from minisgl.message import (
    AbortMsg,
    Addresses,
    BatchTokenMsg,
    ErrorMsg,
    GenerateMsg,
    ReadyMsg,
    StatsMsg,
    StatsReqMsg,
    TokenMsg,
    decode,
    encode,
)
from minisgl.process import setup_child
from minisgl.scheduler import Scheduler
from minisgl.scheduler.replicated import ReplicatedScheduler, follow
from minisgl.scheduler.warmup import warm_up

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 500  # an idle scheduler still wakes up this often


class SchedulerWorker:
    """Rank 0: requests in over ZMQ, tokens out."""

    def __init__(self, sched: Scheduler, addrs: Addresses):
        import zmq

        self.sched, self.config = sched, sched.config
        self.tp_size = self.config.tp_size
        self.reqs: dict[int, Any] = {}  # uid -> Req, while the request lives (for its prompt counts)
        self.finished = self.aborted = self.rejected = 0
        ctx = zmq.Context()
        self.inbox = ctx.socket(zmq.PULL)
        self.inbox.bind(addrs.scheduler)
        self.outbox = ctx.socket(zmq.PUSH)
        self.outbox.connect(addrs.detokenizer)

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
            cache=dict(
                hit_rate=s.stats.hit_rate,
                prompt_tokens=s.stats.prompt_tokens,
                hit_tokens=s.stats.hit_tokens,
                prefill_tokens=s.stats.prefill_tokens,
            ),
        )

    # ---- messages ----------------------------------------------------------------------------
    def _recv(self) -> list[Any]:
        import zmq

        msgs: list[Any] = []
        timeout = 0 if self.sched.has_work else IDLE_POLL_MS
        if self.inbox.poll(timeout):
            while True:
                try:
                    msgs.append(decode(self.inbox.recv(zmq.NOBLOCK)))
                except zmq.Again:
                    break
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
        self.sched.add(req)
        self.reqs[msg.uid] = req

    def _apply(self, msg: Any, out: list[TokenMsg]) -> None:
        if isinstance(msg, GenerateMsg):
            self._generate(msg)
        elif isinstance(msg, AbortMsg):
            if self.sched.abort(msg.uid):
                self.aborted += 1
                self.reqs.pop(msg.uid, None)
                out.append(TokenMsg(msg.uid, -1, "abort"))
        elif isinstance(msg, StatsReqMsg):
            self._send(StatsMsg(msg.uid, self.stats()))
        elif isinstance(msg, ReadyMsg):  # the tokenizer's, on its way to the API server
            self.sched.add_eos_ids(msg.info.get("eos_ids", ()))  # as LLM does with its tokenizer
            self._send(msg)
        else:
            logger.warning("ignoring unexpected message %s", type(msg).__name__)

    def run(self) -> None:
        self._send(ReadyMsg("scheduler", self.info()))
        logger.info("scheduler ready: %s", self.info())
        while True:
            out: list[TokenMsg] = []
            for msg in self._recv():
                self._apply(msg, out)
            if self.sched.has_work:
                for ev in self.sched.step():
                    req = self.reqs.get(ev.uid)
                    if req is None:  # aborted meanwhile (the scheduler drops those; belt and braces)
                        continue
                    out.append(TokenMsg(ev.uid, ev.token_id, ev.finish_reason, req.prompt_len, req.hit_len))
                    if ev.finish_reason is not None:
                        self.finished += 1
                        del self.reqs[ev.uid]
            if out:
                self._send(BatchTokenMsg(out))


def run_scheduler(config: EngineConfig, addrs: Addresses, log_level: str) -> None:
    """Process entry point (one per TP rank)."""
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
        follow(sched)
        return
    if sched.device.type == "cuda":  # before the server says it is ready
        logger.info("warmed up in %.1f s", warm_up(sched))
    SchedulerWorker(sched, addrs).run()
