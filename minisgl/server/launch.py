"""Starting, watching and stopping the server's processes.

::

    python -m minisgl  =  the launcher, which is also the API server (uvicorn, asyncio)
      ├── scheduler (one process per TP rank; rank 0 owns the ZMQ side)
      ├── tokenizer
      └── detokenizer

Lifecycle, and what guarantees it:
- The HTTP port is bound before anything is spawned (a port in use fails at once), and answers
  from the start: ``/health`` is 503 until the scheduler and the tokenizer have reported ready;
  only then is "serving ... at http://..." printed.
- Ctrl-C / SIGTERM: uvicorn stops accepting, waiting requests get a 503, the children get SIGTERM
  (then SIGKILL after a few seconds). Exit code 0.
- A child that dies (crash, OOM kill, failed start-up) is noticed within ~0.2 s: its requests get a
  503, the server logs which process died and how, stops the others and exits with code 1.
- The launcher killed outright (SIGKILL) cannot clean up: the children notice their parent is
  gone and exit by themselves (``minisgl.process``); the private folder of the ZMQ sockets stays
  behind until the next server of the same user starts (``minisgl.server.ipc``).
- Slow or silent clients cannot use up the open files: each request must arrive within
  ``--request-read-timeout`` and the connections are capped (``connections``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import shutil
import signal
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING

from minisgl.message import Addresses
from minisgl.process import free_port, setup_logging
from minisgl.server.args import ServerArgs
from minisgl.server.ipc import make_socket_folder

if TYPE_CHECKING:
    from minisgl.server.ops.connections import ConnectionLimits

logger = logging.getLogger("minisgl.server")

WATCH_INTERVAL_S = 0.2
STOP_TIMEOUT_S = 5.0


def bind_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # NOTE: proto must be IPPROTO_TCP, not 0: accepted sockets inherit it, and asyncio sets
    # TCP_NODELAY only on sockets whose proto says TCP. Without it Nagle's algorithm meets the
    # client's delayed ACK and every response on a keep-alive connection waits ~40 ms.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise SystemExit(
            f"minisgl: cannot listen on {host}:{port}: {e.strerror} (is another server running?)"
        ) from None
    sock.listen(backlog)  # connections queue up while the app starts, instead of being refused
    return sock


def start_workers(args: ServerArgs, addrs: Addresses | None) -> list[mp.Process]:
    """Spawn (not fork: CUDA and torch's threads do not survive a fork) this node's child processes:
    its scheduler ranks, and on node 0 the tokenizer and the detokenizer."""
    from minisgl.engine.config import EngineConfig
    from minisgl.server.detokenizer_worker import run_detokenizer
    from minisgl.server.scheduler_worker import run_scheduler
    from minisgl.server.tokenizer_worker import run_tokenizer

    ctx = mp.get_context("spawn")
    engine, log_level = args.engine, args.log_level
    tp = engine["tp_size"]
    if args.dist_init_addr is not None:
        init = f"tcp://{args.dist_init_addr}"
    else:
        init = f"tcp://127.0.0.1:{free_port()}" if tp > 1 else ""
    procs = []
    for rank in args.ranks:
        cfg = EngineConfig.from_kwargs(**engine, tp_rank=rank, dist_init_method=init)
        name = "scheduler" if tp == 1 else f"scheduler-{rank}"
        procs.append(ctx.Process(target=run_scheduler, args=(cfg, addrs, log_level), name=name))
    if args.node_rank == 0:
        model, dummy = engine["model"], engine["dummy_weight"]
        tok_args = (model, dummy, addrs, log_level, args.chat_template)
        procs.append(ctx.Process(target=run_tokenizer, args=tok_args, name="tokenizer"))
        detok_args = (model, dummy, addrs, log_level, args.detokenizer)
        procs.append(ctx.Process(target=run_detokenizer, args=detok_args, name="detokenizer"))
    for p in procs:
        p.start()
    return procs


def stop_workers(procs: list[mp.Process], timeout: float = STOP_TIMEOUT_S) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            logger.warning("%s (pid %d) ignored SIGTERM; killing it", p.name, p.pid)
            p.kill()
            p.join(1.0)


def _uvicorn_server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises a captured SIGTERM after shutting down, which would kill this process
        before it stops its children; here a signal only starts the shutdown."""

        on_signal = staticmethod(lambda sig: None)

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in old.items():
                    signal.signal(s, h)

        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            self.on_signal(sig)

    return Server


async def _watch(server, fe, procs: list[mp.Process], args: ServerArgs, state: dict) -> None:
    announced = False
    while not server.should_exit:
        for p in procs:
            if p.exitcode is not None and not server.should_exit:  # polls (and reaps) without blocking
                # (a signal to the whole process group, e.g. Ctrl-C or `kill -- -PGID`, also reaches
                # the children; the launcher's handler has set should_exit by then: not a crash)
                how = f"was killed by signal {-p.exitcode}" if p.exitcode < 0 else f"exited with code {p.exitcode}"
                when = "while starting" if not fe.ready.is_set() else "while serving"
                why = f"the {p.name} process (pid {p.pid}) {how} {when}"
                logger.error("%s; shutting the server down", why)
                fe.fail_all(f"the engine stopped: {why}")
                state["code"] = 1
                server.should_exit = True
                return
        if not announced and fe.ready.is_set() and server.started:
            announced = True
            model = fe.info.get("model")
            print(f"minisgl: serving {model} at {args.url} (OpenAI API: {args.url}/v1)", flush=True)
        await asyncio.sleep(WATCH_INTERVAL_S)


async def _serve(
    args: ServerArgs, addrs: Addresses, sock: socket.socket, procs: list[mp.Process], limits: ConnectionLimits
) -> int:
    import uvicorn

    from minisgl.server.app import create_app
    from minisgl.server.ops.connections import KEEP_ALIVE_S, guarded_protocol, limit_resource_errors

    app = create_app(
        addrs,
        args.api_key,
        args.max_sequences_per_request,
        args.request_timeout,
        args.health_timeout,
        args.detokenizer,
        sse_keepalive_s=args.sse_keepalive,
    )
    app.state.processes = {p.name: p.pid for p in procs}  # shown by GET /stats
    app.state.server_args = args  # shown by GET /get_server_info (without the API key)
    app.state.metrics.log_requests = args.log_requests
    fe = app.state.frontend
    fe.served_model_name = args.served_model_name
    config = uvicorn.Config(
        app,
        log_level=args.log_level,
        access_log=args.log_level == "debug",
        timeout_graceful_shutdown=3,
        lifespan="on",
        http=guarded_protocol(limits),
        timeout_keep_alive=KEEP_ALIVE_S,
        backlog=limits.backlog,  # asyncio's accept loop takes up to this many sockets per tick
    )
    limit_resource_errors()
    server = _uvicorn_server_class()(config)
    loop = asyncio.get_running_loop()
    # a signal handler must not touch asyncio objects directly: hand the work to the loop
    server.on_signal = lambda sig: loop.call_soon_threadsafe(fe.fail_all, "the server is shutting down")
    state = {"code": 0}
    watcher = asyncio.create_task(_watch(server, fe, procs, args, state))
    try:
        await server.serve(sockets=[sock])
    finally:
        watcher.cancel()
    if not server.started:
        return 1
    return state["code"]


def _stop_on_sigterm(sig, frame) -> None:
    raise SystemExit(0)  # runs the `finally` below, which stops the children


def launch(args: ServerArgs) -> int:
    """Run the server until Ctrl-C, SIGTERM or a dead child; returns the exit code."""
    setup_logging(args.log_level, "server")
    if args.api_key is None and not args.loopback_only:
        logger.warning(
            "--host %s lets other machines connect and no --api-key is set: anyone who reaches the port "
            "can use the model",
            args.host,
        )
    from minisgl.models.resolve import resolve_model

    try:  # a wrong --model fails here, before any process starts (and converts the embedded model
        # once, before three workers race to do it)
        resolve_model(args.engine.get("model"), args.engine.get("dummy_weight", False))
    except (ValueError, FileNotFoundError) as e:
        print(f"minisgl: {e}", file=sys.stderr)
        return 2
    if args.node_rank > 0:
        return follow_node(args)
    from minisgl.server.ops.connections import plan_connections

    limits = plan_connections(args.max_connections, args.request_read_timeout)
    sock = bind_socket(args.host, args.port, limits.backlog)
    args.port = sock.getsockname()[1]
    folder = make_socket_folder()  # only this user can enter it: see minisgl.server.ipc
    addrs = Addresses.under(folder)
    logger.debug("ZMQ sockets in %s", folder)
    old_term = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    procs: list[mp.Process] = []
    try:
        procs = start_workers(args, addrs)
        return asyncio.run(_serve(args, addrs, sock, procs, limits))
    except KeyboardInterrupt:
        return 0
    finally:
        stop_workers(procs)
        sock.close()
        shutil.rmtree(folder, ignore_errors=True)
        signal.signal(signal.SIGTERM, old_term)
        logger.info("stopped")


def follow_node(args: ServerArgs) -> int:
    """A node other than node 0: only its scheduler ranks, which join node 0's ranks at
    ``--dist-init-addr`` and follow rank 0's command log; no HTTP, no tokenizer. Runs until a rank
    exits (node 0 stopped, or a crash: code 1), Ctrl-C or SIGTERM."""
    logger.info(
        "node %d of %d: ranks %s, meeting at %s", args.node_rank, args.nnodes, list(args.ranks), args.dist_init_addr
    )
    old_term = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    procs: list[mp.Process] = []
    try:
        procs = start_workers(args, None)
        while True:
            for p in procs:
                if p.exitcode is not None:
                    logger.info("%s (pid %d) exited with code %s; stopping this node", p.name, p.pid, p.exitcode)
                    return 0 if p.exitcode == 0 else 1
            time.sleep(WATCH_INTERVAL_S)
    except KeyboardInterrupt:
        return 0
    finally:
        stop_workers(procs)
        signal.signal(signal.SIGTERM, old_term)
        logger.info("stopped")
