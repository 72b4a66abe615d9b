"""The scheduler process: the in-process ``Scheduler`` behind a ZMQ inbox.

One process per tensor-parallel rank. Rank 0 alone talks ZMQ; with ``tp_size > 1`` it broadcasts
the messages it received to the other ranks before acting on them, so every rank applies the
same messages in the same order and takes the same scheduling decisions (their schedulers stay
identical without ever comparing state). Only rank 0 reports tokens.

Loop: take every waiting message (block only while there is nothing to run), apply them, run one
step, send its tokens to the detokenizer.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from minisgl.engine.config import EngineConfig
from minisgl.message import (
    AbortMsg,
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
from minisgl.server.process import Addresses, setup_child

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 500  # an idle rank 0 still wakes up this often (TP ranks wait on its broadcast)


class SchedulerWorker:
    def __init__(self, config: EngineConfig, addrs: Addresses):
        from minisgl.scheduler import Scheduler

        self.config = config
        self.rank, self.tp_size = config.tp_rank, config.tp_size
        self.sched = Scheduler(config)
        self.reqs: dict[int, Any] = {}  # uid -> Req, while the request lives (for its prompt counts)
        self.finished = self.aborted = self.rejected = 0
        self.inbox = self.outbox = None
        if self.rank == 0:
            import zmq

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
        msgs: list[Any] = []
        if self.rank == 0:
            import zmq

            timeout = 0 if self.sched.has_work else IDLE_POLL_MS
            if self.inbox.poll(timeout):
                while True:
                    try:
                        msgs.append(decode(self.inbox.recv(zmq.NOBLOCK)))
                    except zmq.Again:
                        break
        if self.tp_size > 1:
            from minisgl.distributed import broadcast_objects

            msgs = broadcast_objects(msgs if self.rank == 0 else None)
        return msgs

    def _send(self, msg: Any) -> None:
        if self.outbox is not None:
            self.outbox.send(encode(msg))

    def _generate(self, msg: GenerateMsg) -> None:
        e, sp = self.sched.engine, msg.sampling
        n = len(msg.input_ids)
        if msg.auto_max_tokens:  # fill the context, but never more than the pool could ever hold
            sp.max_tokens = max(1, min(e.max_seq_len, e.num_pages * self.sched.page_size) - n)
        try:
            if n >= e.max_seq_len:
                raise ValueError(
                    f"this model's context is {e.max_seq_len} tokens but the prompt has {n}; shorten the prompt"
                )
            req = self.sched.make_request(msg.uid, msg.input_ids, sp)
        except ValueError as err:
            self.rejected += 1
            code = "context_length_exceeded" if n >= e.max_seq_len else None
            self._send(ErrorMsg(msg.uid, str(err), 400, code=code))
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
            self.sched.eos_ids |= set(msg.info.get("eos_ids", ()))  # as LLM does with its tokenizer
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
        worker = SchedulerWorker(config, addrs)
    except (ValueError, FileNotFoundError, NotImplementedError) as e:  # bad arguments: no traceback
        logger.error("cannot start the engine: %s", e)
        sys.exit(1)
    worker.run()
