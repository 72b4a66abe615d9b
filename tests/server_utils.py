"""Helpers for the server tests: start a real ``python -m minisgl`` on a free loopback port."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from minisgl.process import free_port

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 120.0


def server_env(**extra: str) -> dict[str, str]:
    # server and client share two cores: one intra-op thread per process avoids torch stalls
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


class ServerProcess:
    """A server in a subprocess, its output in files (so a full pipe never blocks it)."""

    def __init__(
        self,
        args: list[str],
        log_dir: Path,
        api_key: str | None = None,
        env: dict | None = None,
        fd_limit: int | None = None,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.out_path, self.err_path = log_dir / "server.out", log_dir / "server.err"
        cmd = [sys.executable, "-m", "minisgl", "--port", str(self.port), "--log-level", "info", *args]
        if api_key:
            cmd += ["--api-key", api_key]
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            # fd_limit: the server's open-file limit, soft and hard (so the server cannot raise it)
            limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))) if fd_limit else None
            env = server_env(**(env or {}))
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=err, preexec_fn=limit)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def health(self) -> int | None:
        try:
            return httpx.get(f"{self.url}/health", timeout=2.0).status_code
        except httpx.HTTPError:
            return None

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> list[int | None]:
        """Poll /health until 200; returns every status seen (None: no answer yet)."""
        seen: list[int | None] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()}")
            code = self.health()
            seen.append(code)
            if code == 200:
                return seen
            time.sleep(0.1)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.logs()}")

    def logs(self) -> str:
        return self.out_path.read_text() + "\n--- stderr ---\n" + self.err_path.read_text()[-6000:]

    def stats(self) -> dict:
        r = httpx.get(f"{self.url}/stats", headers=self.headers, timeout=30.0)
        r.raise_for_status()
        return r.json()

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "minisgl", *args]
    return subprocess.run(cmd, cwd=REPO, env=server_env(), capture_output=True, text=True, timeout=timeout)


def wait_until(cond, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval)
    return cond()


def wait_idle(server: ServerProcess, timeout: float = 20.0) -> dict:
    """Stats once no request is running or queued and the KV pool holds nothing but cache."""
    last: dict = {}

    def idle() -> bool:
        nonlocal last
        last = server.stats()
        kv = last["kv"]
        return (
            last["running_requests"] == 0
            and last["waiting_requests"] == 0
            and kv["free_slots"] + kv["evictable_slots"] == kv["total_slots"]
        )

    assert wait_until(idle, timeout, 0.2), f"the server did not become idle: {last}"
    return last


def alive_pids(pids: list[int]) -> list[int]:
    """Those of ``pids`` that still run (zombies count as gone)."""
    import psutil

    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out
