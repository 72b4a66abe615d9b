"""Lab 11 adapter: the ``LabDetokenizer`` and ``LabStopStrings`` classes of ``lab11_detokenizer.py``,
used only through the ``Detokenizer`` / ``StopStrings`` interfaces, and the swap-in: a real
``python -m minisgl`` whose detokenizer process and API server import the lab's ``TEXT_STREAMS`` by its
``"module:attr"`` name (``--detokenizer autograder.adapters.lab11:TEXT_STREAMS``, which loads the lab file
there through ``require``).

Every unit test takes ``TEXT_STREAMS`` too (through ``require``, which refuses the engine's own
classes in it), so a lab that hands the server the engine's classes loses its points in this process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from autograder import pace
from autograder.impl import REPO, impl_folder, require
from minisgl.tokenizer.detokenizer import Detokenizer, IncrementalDecoder, StopStringCutter, StopStrings, TextStreams

STEM = "lab11_detokenizer"
# the name the server is given: both server processes load the lab file through this module (impl.load),
# which installs the grader's guards there first
SWAP_IN = f"{__name__}:TEXT_STREAMS"


def _subclass(attr: str, base: type) -> type:
    cls = require(STEM, attr)
    text_streams()  # what the server runs: refused here if it holds the engine's classes
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{attr} must be a class derived from minisgl.tokenizer.detokenizer.{base.__name__}")
    return cls


def detokenizer_class() -> type[Detokenizer]:
    return _subclass("LabDetokenizer", Detokenizer)


def stop_strings_class() -> type[StopStrings]:
    return _subclass("LabStopStrings", StopStrings)


def text_streams() -> TextStreams:
    streams = require(STEM, "TEXT_STREAMS")
    if not isinstance(streams, TextStreams):
        raise TypeError("TEXT_STREAMS must stay TextStreams(LabDetokenizer, LabStopStrings): the server runs it")
    return streams


REFERENCE = TextStreams(IncrementalDecoder, StopStringCutter)


def __getattr__(name: str):  # SWAP_IN, looked up in each server process (computed on access)
    if name == "TEXT_STREAMS":
        return text_streams()
    raise AttributeError(name)


# ---- the swap-in: a real server -------------------------------------------------------------------------
class Server:
    """``python -m minisgl`` in a subprocess on a free loopback port, its output in files."""

    def __init__(self, model: Path, detokenizer: str | None, log_dir: Path):
        from minisgl.process import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"server-{self.port}.log"
        cmd = [sys.executable, "-m", "minisgl", "--model", str(model), "--dtype", "float32", "--port", str(self.port)]
        if detokenizer is not None:
            cmd += ["--detokenizer", detokenizer]
        # the graded folder first on the path: both server processes import the lab from there
        path = os.pathsep.join(p for p in (str(impl_folder()), os.environ.get("PYTHONPATH", "")) if p)
        env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)

    def logs(self) -> str:
        return self.log.read_text()[-4000:]

    def wait_ready(self, deadline: float, waited: str) -> None:
        import httpx

        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with code {self.proc.returncode}:\n{self.logs()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"the server did not become ready within {waited}:\n{self.logs()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@contextmanager
def servers(model: Path, timeout: float = 150.0) -> Iterator[tuple[Server, Server]]:
    """The reference server and one running the lab's ``TEXT_STREAMS``, started together; both must
    be ready within ``timeout`` seconds on the reference machine, scaled to this one's pace."""
    with tempfile.TemporaryDirectory() as tmp:
        started: list[Server] = []
        try:
            started.append(Server(model, None, Path(tmp)))
            started.append(Server(model, SWAP_IN, Path(tmp)))
            limit = pace.scaled(timeout)
            deadline = time.monotonic() + limit
            waited = f"{limit:.0f} s ({timeout:g} s on the course's reference machine; {pace.describe()})"
            for s in started:
                s.wait_ready(deadline, waited)
            yield started[0], started[1]
        finally:
            for s in started:
                s.stop()
