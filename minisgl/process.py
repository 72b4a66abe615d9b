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
import math
import mmap
import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

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
    die_with_parent(signal.SIGKILL)
    if os.getppid() != parent:  # the launcher died before prctl took effect
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watchdog", daemon=True).start()


def die_with_parent(sig: int) -> None:
    """Linux: this process gets ``sig`` when its parent dies, even by SIGKILL (elsewhere: nothing)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
        except OSError:
            pass


def zeros_not_forked(shape: tuple[int, ...], dtype, device) -> torch.Tensor:
    """``torch.zeros(shape, dtype, device)``; on Linux a CPU tensor of 64 MiB or more lies in an anonymous
    mapping of its own that a fork of this process leaves out (``MADV_DONTFORK``): the fork copies no
    page table for it (1 GiB on 4 KiB pages: most of a fork's time) and the child, which must never read
    it, does not keep it. The mapping is the tensor's alone and is unmapped with it. (Advising the pages
    of a ``torch.zeros`` instead is unsafe: malloc may carve even a large block out of free heap space,
    and once freed those pages hold malloc's own lists, which a forked child then lacks: it crashes.)"""
    import torch

    numel = math.prod(shape)
    nbytes = numel * dtype.itemsize
    if not sys.platform.startswith("linux") or torch.device(device).type != "cpu" or nbytes < 64 << 20:
        return torch.zeros(shape, dtype=dtype, device=device)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # zero-filled; the tensor keeps it
    buf.madvise(mmap.MADV_DONTFORK)
    return torch.frombuffer(buf, dtype=dtype, count=numel).view(shape)


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            logging.getLogger(__name__).error("the server process (pid %d) is gone; exiting", parent)
            os._exit(1)
