"""The HTTP server's connections: how many it keeps open, how long a client may take to send its
request, and what the log says when the process runs out of file descriptors.

uvicorn bounds an *idle* keep-alive connection (``timeout_keep_alive``) and the size of a request
head (h11's 16 KiB), but not the time a client takes: a connection that sends nothing, or a head or
body that trickles in, stays open for ever, holding a file descriptor. Enough of them exhaust
``RLIMIT_NOFILE``; then ``accept()`` fails, ``/health`` hangs for everyone, and asyncio logs the
failure in a tight loop (its accept loop goes on after EMFILE, up to ``backlog`` tries per tick,
each logged with a traceback).

The guard, in four parts:

- ``GuardedH11Protocol`` (uvicorn's h11 protocol, subclassed) starts a clock when a request begins
  (at accept, or at its first byte after a keep-alive pause) and closes the connection, without an
  answer, if the head and the body have not both arrived ``read_timeout`` seconds later. Trickling
  bytes does not reset the clock.
- Connections that wait on their client (no complete request in hand: new, trickling, or idle
  between requests) queue oldest first. When a new connection makes more than ``max_connections``,
  the oldest waiting one is closed; it is the new one itself when every other connection is being
  answered. A load balancer's ``/health`` sends its request at once and leaves the queue, so a
  flood of silent connections only pushes out older silent ones. (uvicorn's ``limit_concurrency``
  would not do: it counts requests, not connections, and answers 503 to ``/health`` too.)
- ``plan_connections`` raises the soft open-file limit to the hard one and keeps the cap plus the
  listen backlog below it: asyncio accepts up to ``backlog`` sockets in one go, before any of them
  is counted here.
- ``RepeatFilter`` lets one out-of-descriptors log record through per ``LOG_EVERY_S`` seconds, as a
  single line that counts the records dropped since the previous one.

The server speaks HTTP/1.1 through h11 even where httptools is installed: the guard reads h11's
per-connection state (``their_state``) to tell a complete request from a partial one.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import time
from collections.abc import Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from minisgl.server.args import DEFAULT_MAX_CONNECTIONS

logger = logging.getLogger("minisgl.server")

KEEP_ALIVE_S = 5  # uvicorn's default, written down: an idle keep-alive connection closes after it
MAX_BACKLOG = 2048
FD_RESERVE = 128  # descriptors the launcher needs besides connections: ZMQ, pipes to children, logs
LOG_EVERY_S = 5.0
# h11's view of the client while its request is incomplete (IDLE: nothing or part of a head yet)
WAITING_ON_CLIENT = (h11.IDLE, h11.SEND_BODY)
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)  # as asyncio's accept loop


def plan_connections(requested: int | None, read_timeout: float) -> ConnectionLimits:
    """Limits that fit below the open-file limit, after raising its soft value to the hard one;
    ``requested`` None means ``DEFAULT_MAX_CONNECTIONS``, or fewer if that does not fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    backlog = min(MAX_BACKLOG, soft // 8)
    cap = min(requested or DEFAULT_MAX_CONNECTIONS, max(1, soft - backlog - FD_RESERVE))
    if requested is not None and cap < requested:
        logger.warning(
            "--max-connections %d lowered to %d to fit the open-file limit %d (ulimit -n)", requested, cap, soft
        )
    return ConnectionLimits(cap, read_timeout, backlog)


class ConnectionLimits:
    """What one server's connections share: the cap, the read timeout, and the queue of those
    waiting on their client (the ones that may be closed to make room)."""

    def __init__(self, max_connections: int, read_timeout: float, backlog: int = MAX_BACKLOG):
        self.max_connections, self.read_timeout, self.backlog = max_connections, read_timeout, backlog
        self.open: set[GuardedH11Protocol] = set()  # accepted and not yet closed by the guard
        self.waiting: dict[GuardedH11Protocol, None] = {}  # a dict keeps insertion order: oldest first

    def admit(self, conn: GuardedH11Protocol) -> None:
        self.open.add(conn)
        self.waiting[conn] = None
        while len(self.open) > self.max_connections:  # `conn` waits too, so there is always one to close
            next(iter(self.waiting)).drop()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on reading each request and a place in the queue of
    ``limits`` (a class attribute: ``guarded_protocol`` makes one subclass per server).

    Invariant, restored by ``track`` after every event that can change it: a connection waiting on
    its client is in ``limits.waiting`` and has a deadline -- uvicorn's keep-alive timer while it
    idles between requests, the read clock otherwise."""

    limits: ConnectionLimits

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.read_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.limits.admit(self)
        self.track()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # cancels the keep-alive timer: a request has begun
        self.track()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms the keep-alive timer; may start a pipelined request
        self.track()

    def track(self) -> None:
        if self not in self.limits.open:  # closed by the guard
            return
        if self.conn.their_state not in WAITING_ON_CLIENT:  # the whole request is in: the app's turn
            self.stop_read_clock()
            self.limits.waiting.pop(self, None)
            return
        self.limits.waiting.setdefault(self, None)  # a newcomer to the queue goes last
        if self.read_timer is None and self.timeout_keep_alive_task is None:
            self.start_read_clock()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self.forget()  # another protocol owns the transport from now on
        super().handle_websocket_upgrade(event)

    def connection_lost(self, exc: Exception | None) -> None:
        self.forget()
        super().connection_lost(exc)

    def start_read_clock(self) -> None:
        self.read_timer = self.loop.call_later(self.limits.read_timeout, self.read_timed_out)

    def stop_read_clock(self) -> None:
        if self.read_timer is not None:
            self.read_timer.cancel()
            self.read_timer = None

    def read_timed_out(self) -> None:
        self.read_timer = None
        # NOTE: the clock is not stopped when a body completes after its early (e.g. 401) response:
        # h11 is IDLE again, and closing that idle connection at the deadline is harmless.
        if self.conn.their_state in WAITING_ON_CLIENT:
            self.drop()

    def drop(self) -> None:
        """Close the connection without an answer (its request, if any, sees a disconnect)."""
        self.forget()
        self.transport.close()

    def forget(self) -> None:
        self.stop_read_clock()
        self.limits.open.discard(self)
        self.limits.waiting.pop(self, None)


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """The protocol class to pass as uvicorn's ``http=``, bound to one server's ``limits``."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})


class RepeatFilter(logging.Filter):
    """Lets through one record caused by running out of descriptors (or buffers) per ``every``
    seconds, shortened to one line that counts the like records dropped since the last one."""

    def __init__(self, every: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.every, self.clock = every, clock
        self.last_at: float | None = None
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not (isinstance(exc, OSError) and exc.errno in OUT_OF_RESOURCES):
            return True
        now = self.clock()
        if self.last_at is not None and now - self.last_at < self.every:
            self.dropped += 1
            return False
        line = f"{record.getMessage().splitlines()[0]}: {exc}"
        if self.dropped:
            line += f" ({self.dropped} more like it in the last {now - self.last_at:.0f} s not logged)"
        record.msg, record.args, record.exc_info, record.exc_text = line, (), None, None
        self.last_at, self.dropped = now, 0
        return True


def limit_resource_errors() -> RepeatFilter:
    """Install one ``RepeatFilter`` on the loggers that report failed accepts and failed requests."""
    filt = RepeatFilter()
    for name in ("asyncio", "uvicorn.error"):
        logging.getLogger(name).addFilter(filt)
    return filt
