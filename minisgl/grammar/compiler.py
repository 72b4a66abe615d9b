"""Compiling constraints so that no client can hold the compiler: a compile has a time limit, stops
once no request waits for it, cannot make a quick one wait behind it for long, and what compiled is
kept in a cache bounded in bytes. ::

    make_request -> limits.check: size, depth, schema keywords (raises at once: a 400)
                 -> submit(key, req) ─┬─ cached (compiled or refused): that future
                                      └─ new job -> check lane (1 thread): backend.check, the syntax
                                                 -> compile lane (WORKERS threads): a trial compile in a
                                                    forked child, then the compile itself, in the thread

A running compile cannot be stopped inside one process (xgrammar's C++ holds the thread), so a new
constraint is first compiled in a fork of the scheduler's process (the backend is already in memory;
the child touches nothing else). The child is killed at ``time_limit`` or as soon as no request waits
for it, and the memory it took goes with it. Only what compiled there is compiled again in the lane's
thread, in about the trial's time, and kept: carrying the compiled form over costs more than compiling
twice (xgrammar's serialisation, docs/structured-output.md). Without ``os.fork`` there is no trial and no time
limit. The cache keeps the most recently used constraints within ``cache_bytes`` (``backend.nbytes``,
at least the text's size), refusals too: a bad constraint sent again is refused at once.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from minisgl.grammar.base import GrammarBackend, GrammarError
from minisgl.process import die_with_parent

Key = tuple[str, str]  # (kind, text): SamplingParams.grammar
WORKERS = 2  # compiles at once: a slow one leaves a lane to the others
TIME_LIMIT_S = 10.0  # per trial compile
CACHE_BYTES = 8 << 20  # of compiled constraints (xgrammar: their memory_size_bytes)
MIN_ENTRY_BYTES = 1 << 10  # what an entry costs at least (a refusal included)
FORK_LOCK = threading.Lock()  # held around each fork, and by a thread inside the backend that another may fork


@dataclass(eq=False)
class Job:
    key: Key
    future: Future = field(default_factory=Future)
    waiters: set = field(default_factory=set)  # the requests waiting for it (none: it is stopped)
    cancelled: bool = False
    nbytes: int = MIN_ENTRY_BYTES


class Compiler:
    """Compiles with the backend ``build()`` makes (once, in the check lane, on first use)."""

    def __init__(self, build: Callable[[], GrammarBackend], time_limit: float | None = TIME_LIMIT_S,
                 cache_bytes: int = CACHE_BYTES):  # fmt: skip
        self._build, self.time_limit, self.cache_bytes = build, time_limit, cache_bytes
        self.backend: GrammarBackend | None = None
        self._lock = threading.Lock()  # the jobs, their futures and waiters
        self._jobs: OrderedDict[Key, Job] = OrderedDict()  # least recently used first
        self.cached_bytes = 0  # of the finished jobs in _jobs
        self._lanes: tuple[ThreadPoolExecutor, ThreadPoolExecutor] | None = None

    def submit(self, key: Key, waiter: Any = None) -> Future:
        """The future of ``key``'s compiled form (``GrammarError``: refused); ``waiter`` (a request)
        waits for it until ``drop``."""
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                job = self._jobs[key] = Job(key)
                if self._lanes is None:
                    self._lanes = ThreadPoolExecutor(1, "grammar-check"), ThreadPoolExecutor(WORKERS, "grammar-compile")
                self._lanes[0].submit(self._check, job)
            self._jobs.move_to_end(key)
            if waiter is not None and not job.future.done():
                job.waiters.add(waiter)
        return job.future

    def drop(self, key: Key, waiter: Any) -> None:
        """``waiter`` no longer waits for ``key``: a compile that nobody waits for is stopped and forgotten."""
        with self._lock:
            job = self._jobs.get(key)
            if job is None or job.future.done():
                return
            job.waiters.discard(waiter)
            if not job.waiters:
                job.cancelled = True
                del self._jobs[key]
                job.future.set_exception(GrammarError(f"the {key[0]} was not compiled: no request waits for it"))

    def _check(self, job: Job) -> None:
        try:
            if self.backend is None:  # only this lane builds it
                self.backend = self._build()
            with FORK_LOCK:  # no fork while this thread is inside the backend
                if job.cancelled:
                    return
                self.backend.check(*job.key)
        except Exception as e:  # GrammarError, or a backend that cannot be built (no tokenizer)
            return self._finish(job, e if isinstance(e, GrammarError) else GrammarError(str(e)))
        self._lanes[1].submit(self._compile, job)

    def _compile(self, job: Job) -> None:
        kind = job.key[0]
        try:
            if hasattr(os, "fork"):  # the trial: refused, past the limit or abandoned, it raises
                limit = self.time_limit
                late = f"the {kind} took longer than {limit:g} s to compile (the limit); simplify it" if limit else ""
                gone = f"the {kind} was not compiled: no request waits for it"
                forked(lambda: (self.backend.compile(*job.key), b"")[1], limit, late, lambda: job.cancelled and gone)
            if job.cancelled:
                return
            compiled = self.backend.compile(*job.key)  # the trial's result, in about its time
        except Exception as e:  # GrammarError, or a backend's own
            return self._finish(job, e if isinstance(e, GrammarError) else GrammarError(f"{type(e).__name__}: {e}"))
        self._finish(job, compiled, self.backend.nbytes(compiled))

    def _finish(self, job: Job, result: Any, nbytes: int = 0) -> None:
        """Settle ``job`` (``result``: the compiled form or a ``GrammarError``) and keep the cache within
        ``cache_bytes``, least recently used first."""
        with self._lock:
            if job.cancelled:
                return
            if isinstance(result, GrammarError):
                job.future.set_exception(result)
            else:
                job.future.set_result(result)
            job.waiters.clear()
            if self._jobs.get(job.key) is not job:
                return
            job.nbytes = max(nbytes, len(job.key[1]), MIN_ENTRY_BYTES)
            self.cached_bytes += job.nbytes
            for key, old in list(self._jobs.items()):
                if self.cached_bytes <= self.cache_bytes:
                    break
                if old.future.done():
                    del self._jobs[key]
                    self.cached_bytes -= old.nbytes

    def shutdown(self) -> None:
        with self._lock:
            for job in self._jobs.values():
                job.cancelled = True
        if self._lanes is not None:
            for lane in self._lanes:
                lane.shutdown(wait=False, cancel_futures=True)


def forked(run: Callable[[], bytes], time_limit: float | None = None, late: str = "",
           stop: Callable[[], str | None] = lambda: None) -> bytes:  # fmt: skip
    """What ``run()`` returns, run in a forked child of this process. ``GrammarError`` if it raises one
    (its message; another exception is named), outlives ``time_limit`` seconds (``late``), or once
    ``stop()`` gives a reason; the child is then killed. ``run`` must touch nothing but its own objects:
    no device, socket or lock of the parent's (only the forking thread lives in the child)."""
    r, w = os.pipe()
    with FORK_LOCK:
        pid = os.fork()
    if pid == 0:  # the child: run, write, exit (no cleanup: the parent's state is not ours)
        os.close(r)
        gc.disable()  # no collection: it would run finalizers of the parent's objects (sockets, devices) here
        try:
            die_with_parent(signal.SIGKILL)
            out = b"+" + run()
        except GrammarError as e:
            out = b"-" + str(e).encode()[:4000]
        except BaseException as e:  # noqa: BLE001 (whatever it is, the parent hears of it)
            out = b"-" + f"{type(e).__name__}: {e}".encode()[:4000]
        try:
            view = memoryview(out)
            while view:
                view = view[os.write(w, view) :]
            os.close(w)  # the parent reads EOF now, not once this process's memory is released
        finally:
            os._exit(0)
    os.close(w)
    deadline = None if time_limit is None else time.monotonic() + time_limit
    chunks = []
    try:
        while True:
            if why := stop():
                raise GrammarError(why)
            left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if left <= 0:
                raise GrammarError(late)
            if select.select([r], [], [], left)[0]:
                if not (chunk := os.read(r, 1 << 20)):
                    break
                chunks.append(chunk)
    finally:
        os.close(r)
        os.kill(pid, signal.SIGKILL)  # (a child that has exited is a zombie until waited for: no error)
        # reaped aside: releasing a fork of a large process's memory takes as long as the fork did
        threading.Thread(target=os.waitpid, args=(pid, 0), name="grammar-reap", daemon=True).start()
    out = b"".join(chunks)
    if out[:1] != b"+":
        raise GrammarError(out[1:].decode(errors="replace") or "the child process died")
    return out[1:]
