"""Tensor parallelism, the scheduling side: one scheduler per rank, kept identical by a replicated
command log. Used by ``LLM(tp_size=N)`` and by the server's scheduler processes alike.

::

    rank 0:  add / abort / flush / eos  ->  applied here, and appended to the log
             step(): broadcast the log (gloo, CPU), then schedule + forward (all-reduces inside)
    rank k:  follow(): receive the log, apply the same commands in the same order, step

Every rank applies the same commands between the same steps, so all take the same scheduling
decisions without ever comparing state. Sampling needs no communication: the logits are
all-gathered, so every rank holds the same numbers, and the sampler's randomness is a pure function
of each request's seed and step (rank 0 draws the seeds of unseeded requests; they travel inside the
broadcast requests).
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from dataclasses import dataclass, replace
from typing import Any, Literal

from minisgl.core import Req
from minisgl.distributed import broadcast_objects
from minisgl.engine.config import EngineConfig
from minisgl.engine.engine import Engine
from minisgl.models.resolve import resolve_model
from minisgl.process import free_port, setup_child
from minisgl.scheduler.events import TokenEvent
from minisgl.scheduler.scheduler import Scheduler

MAIN_GUARD_HINT = (
    'A script that creates LLM(tp_size=N) must do it under `if __name__ == "__main__":`: the other '
    "ranks are started with multiprocessing's spawn method, which re-imports the script, and an unguarded "
    "script would start ranks again from inside a rank."
)


@dataclass
class Command:
    kind: Literal["add", "abort", "flush", "eos", "pace", "stop"]
    arg: Any = None


def apply(sched: Scheduler, cmd: Command) -> None:
    if cmd.kind == "add":
        sched.add(cmd.arg)
    elif cmd.kind == "abort":
        sched.abort(cmd.arg)
    elif cmd.kind == "flush":
        sched.flush_cache()
    elif cmd.kind == "eos":
        sched.add_eos_ids(cmd.arg)
    elif cmd.kind == "pace":  # rank 0's measured prefill speed (AdaptiveChunking)
        sched.chunking.calibrate(cmd.arg)
    else:
        raise ValueError(f"unknown command {cmd.kind!r}")


class ReplicatedScheduler(Scheduler):
    """Rank 0 of a tensor-parallel group: a ``Scheduler`` whose every change of state is logged
    and broadcast to the other ranks (running ``follow``) before its next step."""

    def __init__(self, config: EngineConfig, engine: Engine | None = None):
        super().__init__(config, engine)
        self._log: list[Command] = []
        if self.chunking.measures:  # the prefill speed measured here: every rank sizes by it
            self.chunking.on_pace = lambda scale: self._log.append(Command("pace", scale))

    def add(self, req: Req) -> Req:
        super().add(req)
        self._log.append(Command("add", req))
        return req

    def abort(self, uid: int) -> bool:
        if not super().abort(uid):
            return False
        self._log.append(Command("abort", uid))
        return True

    def flush_cache(self) -> None:
        super().flush_cache()
        self._log.append(Command("flush"))

    def add_eos_ids(self, ids) -> None:
        super().add_eos_ids(ids)
        self._log.append(Command("eos", sorted(int(i) for i in ids)))

    def step(self) -> list[TokenEvent]:
        broadcast_objects([self._log])
        self._log = []
        return super().step()

    def stop_followers(self) -> None:
        """Tell the other ranks to leave ``follow`` (they then leave the process group)."""
        broadcast_objects([[Command("stop")]])


class LeaderGone(RuntimeError):
    """Rank 0 closed its connection while this rank waited for its next commands (its server or
    node stopped, or it died between steps)."""


def follow(sched: Scheduler) -> None:
    """Ranks 1..N-1: apply rank 0's commands and step whenever there is work, until told to stop
    (or until rank 0 is gone: ``LeaderGone``)."""
    sched.chunking.measures = False  # its own step times differ from rank 0's: it takes rank 0's "pace"
    while True:
        try:
            (commands,) = broadcast_objects(None)
        except RuntimeError as e:  # gloo: "Connection closed by peer"
            raise LeaderGone(str(e).splitlines()[0][:300]) from e
        for cmd in commands:
            if cmd.kind == "stop":
                return
            apply(sched, cmd)
        if sched.has_work:
            sched.step()


# ---- LLM(tp_size=N): rank 0 in the caller's process, the others spawned ---------------------------
def run_follower(config: EngineConfig, reports) -> None:
    """Process entry point of a spawned rank: reports ("started" | "error", rank, text) to rank 0."""
    setup_child(f"tp{config.tp_rank}", "warning")
    reports.put(("started", config.tp_rank, ""))
    try:
        sched = Scheduler(config)
        follow(sched)
        sched.engine.shutdown()
    except BaseException:
        reports.put(("error", config.tp_rank, traceback.format_exc()))
        raise SystemExit(1) from None


class TPScheduler(ReplicatedScheduler):
    """Rank 0 of an offline tensor-parallel group; behaves like ``Scheduler``."""

    def __init__(self, config: EngineConfig):
        # fail fast, before any process starts: unknown model, head counts that do not split
        path, model_config = resolve_model(config.model, config.dummy_weight)
        model_config.check_tp_size(config.tp_size)
        model = str(path) if path is not None else config.model  # the embedded model is converted once, here
        config = replace(config, model=model, dist_init_method=f"tcp://127.0.0.1:{free_port()}")
        ctx = mp.get_context("spawn")
        self._reports = ctx.Queue()
        self._started: set[int] = set()
        self._errors: dict[int, str] = {}
        self._procs = {
            r: ctx.Process(target=run_follower, args=(replace(config, tp_rank=r), self._reports), name=f"minisgl-tp{r}")
            for r in range(1, config.tp_size)
        }
        for p in self._procs.values():
            p.daemon = True
            p.start()
        try:
            config = replace(config, tp_rank=0)
            super().__init__(config, Engine(config, check_peers=self.check_followers))
        except BaseException as e:
            error = self._failure(e)
            self._stop_followers(grace=0.0)
            raise error from e

    @property
    def processes(self) -> list[mp.Process]:
        """The spawned ranks 1..N-1."""
        return list(self._procs.values())

    def _drain(self) -> None:
        while not self._reports.empty():
            kind, rank, text = self._reports.get_nowait()
            if kind == "started":
                self._started.add(rank)
            else:
                self._errors[rank] = text

    def check_followers(self) -> None:
        """Raise if a rank died: with its traceback if it reported one, else with the likely cause."""
        dead = [(r, p) for r, p in self._procs.items() if p.exitcode is not None]
        if not dead:
            return
        self._drain()
        rank, p = dead[0]
        if rank in self._errors:
            raise RuntimeError(f"tensor-parallel rank {rank} failed:\n{self._errors[rank]}")
        if rank not in self._started:
            raise RuntimeError(
                f"tensor-parallel rank {rank} (pid {p.pid}) exited with code {p.exitcode} before it started. "
                + MAIN_GUARD_HINT
            )
        raise RuntimeError(f"tensor-parallel rank {rank} (pid {p.pid}) exited with code {p.exitcode}")

    def step(self) -> list[TokenEvent]:
        self.check_followers()
        try:
            return super().step()
        except RuntimeError as e:  # a peer died inside a collective
            raise self._failure(e) from e

    def _failure(self, e: BaseException) -> BaseException:
        """The error to raise: a dead rank's own report if there is one, else ``e``."""
        for p in self._procs.values():
            p.join(timeout=2.0 if not p.is_alive() else 0.0)
        try:
            self.check_followers()
        except RuntimeError as dead:
            return dead
        return e

    def _stop_followers(self, grace: float = 10.0) -> None:
        """Wait up to ``grace`` seconds for the ranks to exit, then kill them."""
        for p in self._procs.values():
            p.join(timeout=grace)
            if p.is_alive():
                p.kill()
                p.join()

    def shutdown(self) -> None:
        """Stop the other ranks and leave the process group (a new TP engine may start after)."""
        told = False
        if all(p.is_alive() for p in self._procs.values()):
            try:
                self.stop_followers()
                told = True
            except RuntimeError:
                pass
        if not told:
            self._stop_followers()
            self.engine.shutdown()
            return
        try:  # leave the process group together with the other ranks: on NCCL a rank waits for its peers
            self.engine.shutdown()
        finally:
            self._stop_followers()
