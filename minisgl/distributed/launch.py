"""Tensor parallelism for the offline API: ``LLM(..., tp_size=N)``.

Rank 0 is the caller's process; ranks 1..N-1 are spawned processes. Every rank runs the same
``Scheduler`` on the same requests, so they take the same decisions without comparing state:

    rank 0:  add/abort/flush -> outbox ──broadcast (gloo, CPU)──> ranks 1..N-1 apply the same commands
             step(): broadcast the outbox, then schedule + forward (all-reduces inside the model)

Sampling needs no communication: the logits are all-gathered, so every rank holds the same
numbers, and the sampler's randomness is a pure function of each request's seed and step (rank 0
draws the seeds of unseeded requests; they travel inside the broadcast requests).
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import traceback
from dataclasses import replace
from typing import Any

from minisgl.core import Req
from minisgl.distributed import broadcast_objects
from minisgl.engine.config import EngineConfig
from minisgl.scheduler import Scheduler, TokenEvent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TPScheduler(Scheduler):
    """Rank 0 of an offline tensor-parallel group; behaves like ``Scheduler``."""

    def __init__(self, config: EngineConfig):
        from minisgl.engine.engine import check_tp_size, resolve_model

        # fail fast, before any process starts: unknown model, head counts that do not split
        path, model_config = resolve_model(config.model, config.dummy_weight)
        check_tp_size(model_config, config.tp_size)
        model = str(path) if path is not None else config.model  # the embedded model is converted once, here
        config = replace(config, model=model, dist_init_method=f"tcp://127.0.0.1:{free_port()}")
        ctx = mp.get_context("spawn")
        self._errors = ctx.Queue()
        self._procs = [
            ctx.Process(
                target=_worker, args=(replace(config, tp_rank=r), self._errors), name=f"minisgl-tp{r}", daemon=True
            )
            for r in range(1, config.tp_size)
        ]
        for p in self._procs:
            p.start()
        self._outbox: list[tuple[str, Any]] = []
        try:
            super().__init__(replace(config, tp_rank=0))
        except BaseException as e:
            self._stop_workers()
            raise self._failure(e) from e

    def add(self, req: Req) -> Req:
        super().add(req)
        self._outbox.append(("add", req))
        return req

    def abort(self, uid: int) -> bool:
        if not super().abort(uid):
            return False
        self._outbox.append(("abort", uid))
        return True

    def flush_cache(self) -> None:
        super().flush_cache()
        self._outbox.append(("flush", None))

    def step(self) -> list[TokenEvent]:
        dead = [p for p in self._procs if not p.is_alive()]
        if dead:
            raise self._failure(RuntimeError(f"{dead[0].name} exited with code {dead[0].exitcode}"))
        try:
            broadcast_objects([(self._outbox, sorted(self.eos_ids))])
            self._outbox = []
            return super().step()
        except RuntimeError as e:  # a peer died inside a collective
            raise self._failure(e) from e

    def _failure(self, e: BaseException) -> BaseException:
        """The error to raise: a rank's own traceback if one reported it, else ``e``."""
        for p in self._procs:
            p.join(timeout=2.0 if not p.is_alive() else 0.0)
        reports = []
        while not self._errors.empty():
            reports.append(self._errors.get_nowait())
        if not reports:
            return e
        rank, text = reports[0]
        return RuntimeError(f"tensor-parallel rank {rank} failed:\n{text}")

    def _stop_workers(self) -> None:
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()

    def shutdown(self) -> None:
        """Stop the other ranks and leave the process group (a new TP engine may start after)."""
        told = False
        if all(p.is_alive() for p in self._procs):
            try:
                broadcast_objects([("stop", None)])
                told = True
            except RuntimeError:
                pass
        if not told:
            self._stop_workers()
            self.engine.shutdown()
            return
        try:  # leave the process group together with the other ranks: on NCCL a rank waits for its peers
            self.engine.shutdown()
        finally:
            self._stop_workers()


def _worker(config: EngineConfig, errors) -> None:
    """Ranks 1..N-1: apply rank 0's commands, step whenever there is work, until told to stop."""
    from minisgl.server.process import setup_child

    setup_child(f"tp{config.tp_rank}", "warning")
    try:
        sched = Scheduler(config)
        while True:
            (msg,) = broadcast_objects(None)
            if msg[0] == "stop":
                break
            commands, eos = msg
            sched.eos_ids = set(eos)
            for kind, arg in commands:
                if kind == "add":
                    sched.add(arg)
                elif kind == "abort":
                    sched.abort(arg)
                else:
                    sched.flush_cache()
            if sched.has_work:
                sched.step()
        sched.engine.shutdown()
    except BaseException:
        errors.put((config.tp_rank, traceback.format_exc()))
        raise SystemExit(1) from None
