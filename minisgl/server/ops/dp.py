"""Data-parallel replicas behind SGLang's router: ``python -m minisgl --dp N``.

::

    client ──HTTP──> the front, on --host:--port (front.py, a thread of the launcher: the API key, every route)
                       │
                     sglang-router, on a loopback port (one process, Rust; cache-aware by default)
                       ├──> replica 0: python -m minisgl --host 127.0.0.1 --port PORT+1
                       ├──> replica 1: python -m minisgl --host 127.0.0.1 --port PORT+2
                       ├──> ...        (each a whole server: API server, tokenizer, scheduler ranks, detokenizer)
                       └──> --worker-urls: replicas already running elsewhere, e.g. on other hosts

Each replica is a plain ``python -m minisgl`` with the launcher's own arguments (so every engine flag
applies to each), its own port and, on a GPU host, its own ``--tp`` GPUs (``CUDA_VISIBLE_DEVICES``).
The router (``pip install 'minisgl[router]'``) is SGLang's, unchanged: what it asks of a worker is
``GET /health``, ``/server_info`` and ``/model_info`` to register it, and the routes it forwards
(``/v1/*``, ``/generate``, ``/flush_cache``), whose bodies it rewrites with SGLang's extra fields
(``protocol.GenerateRequest``, ``openai_routes.ROUTER_UNNAMED``).

Lifecycle: replicas start first (the model resolved, i.e. converted, once before); the router starts
once they all answer ``/health``, the front once the router counts every worker healthy, and then
"serving" is printed. Ctrl-C / SIGTERM stops the front and the router, then the replicas (each stops
its own workers); a child also dies with the launcher (``PR_SET_PDEATHSIG``). A replica that dies is
logged and routed around (the router retries a failed request on another worker and its health check
drops the dead one); the launcher exits with code 1 when the router dies or no replica is left.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from minisgl.process import die_with_parent, free_port, setup_logging

if TYPE_CHECKING:
    from minisgl.server.args import ServerArgs

logger = logging.getLogger("minisgl.dp")

START_TIMEOUT_S = 1800.0  # a big model on a slow disk; the router waits as long for its workers
STOP_TIMEOUT_S = 15.0  # a replica stops its own workers within ~5 s of SIGTERM
ROUTER_HEALTH_INTERVAL_S = 5  # how often the router asks each worker's /health
ROUTER_MISSING = "--dp needs SGLang's router: pip install 'minisgl[router]' (or: pip install sglang-router)"


def routed(args: ServerArgs) -> bool:
    """Whether ``python -m minisgl`` runs the router and replicas (not a server of its own)."""
    return args.dp != 1 or bool(args.worker_urls)


def replica_ports(port: int, n: int) -> list[int]:
    """Consecutive ports after the router's; any free ones when the router's is 0 (any)."""
    return [free_port() for _ in range(n)] if port == 0 else [port + 1 + i for i in range(n)]


def replica_envs(args: ServerArgs, n: int) -> list[dict[str, str]]:
    """Each replica's environment: on a GPU host its own ``--tp`` GPUs; on a CPU a share of the cores
    (N replicas with torch's default of one thread per core would fight over every core)."""
    tp = int(args.engine.get("tp_size", 1))
    envs = [dict(os.environ) for _ in range(n)]
    if str(args.engine.get("device", "auto")) != "cpu" and (gpus := _visible_gpus()):
        if len(gpus) < n * tp:
            raise SystemExit(f"minisgl: --dp {n} with --tp {tp} needs {n * tp} GPUs; {len(gpus)} are visible")
        for i, env in enumerate(envs):
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[i * tp : (i + 1) * tp])
    elif "OMP_NUM_THREADS" not in os.environ:
        for env in envs:
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // (n * tp)))
    return envs


def _visible_gpus() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [g for g in listed.split(",") if g.strip()] if listed else [str(i) for i in range(torch.cuda.device_count())]
    return ids[: torch.cuda.device_count()]


def _spawn(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    # in the child, before exec: SIGTERM when the launcher dies, even by SIGKILL
    return subprocess.Popen(cmd, env=env, preexec_fn=lambda: die_with_parent(signal.SIGTERM))


def router_command(args: ServerArgs, urls: list[str], port: int) -> list[str]:
    """sglang-router's command line: on loopback ``port`` (the front, ``front.py``, is what clients
    reach), the policy, the workers, and health checks every few seconds, so a dead replica leaves the
    rotation in ~2 checks (its default is 60 s); its requests meanwhile are retried on another replica."""
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--worker-urls", *urls, "--policy", args.router_policy]
    cmd += ["--health-check-interval-secs", str(ROUTER_HEALTH_INTERVAL_S), "--health-failure-threshold", "2"]
    cmd += ["--worker-startup-check-interval", "1", "--shutdown-grace-period-secs", "5"]
    # a request sent to a replica that just died is retried (5 tries), but cache-aware routing picks the
    # same replica again for the same prompt until the health check drops it: the circuit breaker,
    # opened after 3 failures (default 10), sends the 4th try elsewhere; 10 s later it tries again
    cmd += ["--cb-failure-threshold", "3", "--cb-timeout-duration-secs", "10"]
    # its metrics (requests per worker, latencies) on a free loopback port: two routers must not collide
    cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    cmd += ["--log-level", {"warning": "warn"}.get(args.log_level, args.log_level)]
    return cmd + (["--api-key", args.api_key] if args.api_key else [])


def _get(url: str, api_key: str | None) -> dict | None:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(url, headers=headers, timeout=5.0)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def launch_dp(args: ServerArgs, argv: list[str]) -> int:
    """Run ``args.dp`` replicas and the router until Ctrl-C, SIGTERM, the router's death or the last
    replica's; returns the exit code. ``argv``: the launcher's own arguments, given to each replica."""
    setup_logging(args.log_level, "dp")
    if importlib.util.find_spec("sglang_router") is None:
        print(f"minisgl: {ROUTER_MISSING}", file=sys.stderr)
        return 2
    from minisgl.models.resolve import resolve_model

    try:  # converts the embedded model once, before N replicas race to do it
        if args.dp:
            resolve_model(args.engine.get("model"), args.engine.get("dummy_weight", False))
    except (ValueError, FileNotFoundError) as e:
        print(f"minisgl: {e}", file=sys.stderr)
        return 2
    if args.port == 0:
        args.port = free_port(args.host)
    ports = replica_ports(args.port, args.dp)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    replicas: list[subprocess.Popen] = []
    router: subprocess.Popen | None = None
    front = None
    old_term = signal.signal(signal.SIGTERM, _interrupt)
    try:
        # later flags win in argparse: the replica's own --dp, --host and --port override the launcher's
        for port, env in zip(ports, replica_envs(args, args.dp)):
            tail = ["--dp", "1", "--worker-urls", "--host", "127.0.0.1", "--port", str(port)]
            replicas.append(_spawn([sys.executable, "-m", "minisgl", *argv, *tail], env))
        logger.info("starting %d replicas on ports %s", len(replicas), ports)
        if not _wait(lambda: all(_get(f"{u}/health", None) is not None for u in urls), replicas, None):
            return 1
        router_port = free_port()
        router = _spawn(router_command(args, urls + args.worker_urls, router_port))
        everyone = len(urls) + len(args.worker_urls)

        def ready() -> bool:
            got = _get(f"http://127.0.0.1:{router_port}/readiness", args.api_key) or {}
            return got.get("healthy_workers") == everyone

        if not _wait(ready, replicas, router):
            return 1
        from minisgl.server.ops.front import start_front

        try:
            front, _ = start_front(args.host, args.port, f"http://127.0.0.1:{router_port}", args.api_key)
        except OSError as e:
            logger.error("%s; stopping", e)
            return 1
        print(
            f"minisgl: serving at {args.url} (OpenAI API: {args.url}/v1) through sglang-router ({args.router_policy}) "
            f"over {everyone} replicas: {', '.join(urls + args.worker_urls)}",
            flush=True,
        )
        return _watch(replicas, router, ports)
    except KeyboardInterrupt:
        return 0
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):  # a second signal must not cut the shutdown short
            signal.signal(sig, signal.SIG_IGN)
        if front is not None:
            front.should_exit = True
        _stop([router] if router else [])  # first: no new request reaches a stopping replica
        _stop(replicas)
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        logger.info("stopped")


def _interrupt(sig, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM as Ctrl-C: the `finally` of launch_dp stops everyone


def _wait(cond, replicas: list[subprocess.Popen], router: subprocess.Popen | None) -> bool:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        dead = [p for p in replicas + ([router] if router else []) if p.poll() is not None]
        if dead:
            logger.error("pid %d exited with code %s while starting; stopping", dead[0].pid, dead[0].returncode)
            return False
        if cond():
            return True
        time.sleep(0.2)
    logger.error("not ready after %.0f s; stopping", START_TIMEOUT_S)
    return False


def _watch(replicas: list[subprocess.Popen], router: subprocess.Popen, ports: list[int]) -> int:
    gone: set[int] = set()
    while True:
        if router.poll() is not None:
            logger.error(
                "the router (pid %d) exited with code %s; stopping the replicas", router.pid, router.returncode
            )
            return 1
        for i, p in enumerate(replicas):
            if i not in gone and p.poll() is not None:
                gone.add(i)
                logger.error(
                    "replica %d (pid %d, port %d) exited with code %s; the router routes around it",
                    i, p.pid, ports[i], p.returncode,
                )  # fmt: skip
        if replicas and len(gone) == len(replicas):
            logger.error("no replica is left; stopping")
            return 1
        time.sleep(0.2)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            logger.warning("pid %d ignored SIGTERM; killing it", p.pid)
            p.kill()
            p.wait(2.0)
