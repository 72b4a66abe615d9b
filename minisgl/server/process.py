"""What every child process of the server does first: logging, signals, and dying with its parent.

The launcher (the API server's process) owns its children: it stops them on Ctrl-C / SIGTERM and
when one of them crashes. If the launcher itself is killed (``kill -9``, OOM) nobody is left to do
that, so each child also watches its parent and exits when it is gone: ``prctl(PR_SET_PDEATHSIG)``
on Linux, and a thread polling ``os.getppid()`` everywhere (and as a backstop).
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Addresses:
    """The ZMQ endpoints, one PULL socket per process (bound by the process that reads it).

    ``ipc://`` (Unix domain) sockets: no TCP ports to leak or collide. On Linux they live in the
    abstract namespace (``ipc://@name``), which leaves no file behind even when a process is
    killed; elsewhere in a private temporary folder that the launcher removes."""

    tokenizer: str
    scheduler: str
    detokenizer: str
    frontend: str

    @classmethod
    def under(cls, prefix: str) -> Addresses:
        return cls(*(f"ipc://{prefix}/{name}" for name in ("tokenizer", "scheduler", "detokenizer", "frontend")))


def setup_logging(level: str, name: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s [{name}] %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
        force=True,
    )


def setup_child(name: str, log_level: str) -> None:
    """Call first thing in a child process."""
    setup_logging(log_level, name)
    # Ctrl-C in a terminal reaches the whole process group; only the launcher reacts to it (and
    # then stops us with SIGTERM), so children do not print KeyboardInterrupt tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    launcher = mp.parent_process()
    parent = launcher.pid if launcher is not None else os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass
    if os.getppid() != parent:  # the launcher died before prctl took effect
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watchdog", daemon=True).start()


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            logging.getLogger(__name__).error("the server process (pid %d) is gone; exiting", parent)
            os._exit(1)
