"""The server's internal channel: where its ZMQ sockets live, who can reach them, and how a process
reads its inbox without trusting what arrives.

The sockets carry no authentication: whoever can connect to one can inject text into another
client's answer, abort its requests or stop the engine, whatever ``--api-key`` says. So:

- They are ``ipc://`` files in one folder made by ``tempfile.mkdtemp`` (mode 0700, a random name):
  another user can see the folder's name (in ``/tmp``, in ``/proc/net/unix``) but cannot enter
  it, list it or connect to anything inside. Each socket file is also chmod 0600 once bound.
- The launcher removes the folder whenever it exits on its own (Ctrl-C, SIGTERM, a crashed child,
  a failed start). A SIGKILLed launcher cannot: it leaves the folder and four dead socket files,
  still 0700; the next server of the same user removes such folders (launcher pid gone and no
  socket in them answering).
- Request ids are random (``Frontend.new_uid``), so that even a process of the same user cannot
  aim a forged message at a request it does not know.
- Every frame is decoded inside error handling and checked field by field
  (``minisgl.message.decode``): a malformed one is dropped, and logged at most once per
  ``LOG_EVERY_S`` per socket with a count. Frames above ``MAX_FRAME_BYTES`` are refused by ZMQ
  itself before they are buffered.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from typing import Any

from minisgl.message import BadMessage, decode

logger = logging.getLogger(__name__)

FOLDER_PREFIX = "minisgl-"
# the largest legitimate frame is a tokenized prompt from one request body (8 MiB of JSON: at most
# ~8M tokens of <= 5 msgpack bytes each); a peer that sends more is disconnected by ZMQ
MAX_FRAME_BYTES = 64 << 20
LOG_EVERY_S = 10.0
_MAX_BASE_LEN = 64  # unix socket paths are limited to ~107 bytes: "<base>/minisgl-PID-XXXXXXXX/detokenizer"


def make_socket_folder() -> str:
    """A new private (0700) folder for the sockets, after removing this user's stale ones."""
    base = tempfile.gettempdir()
    if len(base) > _MAX_BASE_LEN and os.path.isdir("/tmp"):
        base = "/tmp"
    for stale in stale_folders(base):
        logger.info("removing %s, left behind by a server that was killed", stale)
        shutil.rmtree(stale, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-", dir=base)


def stale_folders(base: str) -> list[str]:
    """Socket folders in ``base`` that this user owns, whose launcher is gone and whose sockets no
    longer answer (both: a pid can be reused, and another pid namespace may share ``base``)."""
    out = []
    with contextlib.suppress(OSError), os.scandir(base) as entries:
        for e in entries:
            m = re.fullmatch(re.escape(FOLDER_PREFIX) + r"(\d+)-\w+", e.name)
            try:
                if not m or not e.is_dir(follow_symlinks=False) or e.stat(follow_symlinks=False).st_uid != os.getuid():
                    continue
            except OSError:
                continue
            if not _pid_alive(int(m[1])) and not _any_socket_answers(e.path):
                out.append(e.path)
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process now has that pid: not ours to judge
        return True
    return True


def _any_socket_answers(folder: str) -> bool:
    try:
        names = os.listdir(folder)
    except OSError:
        return True  # cannot tell: keep it
    for name in names:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            try:
                s.connect(os.path.join(folder, name))
                return True
            except OSError:
                pass
    return False


def socket_path(addr: str) -> str:
    return addr.removeprefix("ipc://")


def bind_inbox(ctx, addr: str):
    """A PULL socket bound to ``addr`` (a file in the private folder), readable by its owner only,
    that refuses frames above ``MAX_FRAME_BYTES``. ``ctx`` is a ``zmq.Context`` (sync or asyncio)."""
    import zmq

    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    sock.bind(addr)
    os.chmod(socket_path(addr), 0o600)  # the folder already keeps others out; this is a second wall
    return sock


class MsgReader:
    """Turns one inbox's frames into messages of the kinds it ``accept``s; drops anything else."""

    def __init__(self, name: str, accept: tuple[type, ...]):
        self.name, self.accept = name, accept
        self.dropped = 0
        self._logged_at = -LOG_EVERY_S

    def read(self, frame: bytes) -> Any | None:
        """The message, or None (counted and logged) when the frame is malformed."""
        try:
            return decode(frame, self.accept)
        except BadMessage as e:
            self.drop(f"{len(frame)} bytes: {e}")
            return None

    def drop(self, why: str) -> None:
        """Count one bad message; log it unless another was logged less than LOG_EVERY_S ago."""
        self.dropped += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            logger.warning("%s: dropped a malformed message (%d so far): %s", self.name, self.dropped, why)
