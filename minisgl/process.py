"""Process helpers shared by the server, the tensor-parallel ranks and the tests: a free TCP port,
logging, and what every child process does first (signals, dying with its parent).

A launcher (the API server's process, or ``LLM(tp_size=N)``'s) owns its children: it stops them on
Ctrl-C / SIGTERM and when one of them crashes. If the launcher itself is killed (``kill -9``, OOM)
nobody is left to do that, so each child also watches its parent and exits when it is gone:
``prctl(PR_SET_PDEATHSIG)`` on Linux, and a thread polling ``os.getppid()`` (also a backstop).
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the caller binds it soon after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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
