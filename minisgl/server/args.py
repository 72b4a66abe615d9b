"""Command-line arguments of ``python -m minisgl`` (the server and the shell). The engine's flags
come from ``EngineConfig``'s fields (``add_engine_args``), the environment table from
``minisgl.env``: each default and help text is written once."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from minisgl.engine.config import EngineConfig, add_engine_args, engine_kwargs
from minisgl.env import help_table
from minisgl.server.protocol import MAX_SEQUENCES_PER_REQUEST

EXAMPLES = """\
examples:
  python -m minisgl                               # serve the embedded model on 127.0.0.1:1919
  python -m minisgl --model path/to/Qwen3-0.6B --port 30000 --api-key secret
  python -m minisgl --shell                       # chat in the terminal
"""


@dataclass
class ServerArgs:
    engine: dict[str, Any] = field(default_factory=dict)  # EngineConfig keyword arguments
    host: str = "127.0.0.1"
    port: int = 1919
    api_key: str | None = None
    shell: bool = False
    log_level: str = "info"
    max_sequences_per_request: int = MAX_SEQUENCES_PER_REQUEST

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m minisgl",
        description="Serve a model with an OpenAI-compatible API (or chat with it in the terminal with --shell).",
        epilog=f"environment variables:\n{help_table()}\n\n{EXAMPLES}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--host", default="127.0.0.1", help="address the HTTP server binds (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=1919, help="HTTP port (default 1919; 0 = any free port)")
    ap.add_argument("--api-key", default=None, help="require `Authorization: Bearer API_KEY` on every request")
    ap.add_argument(
        "--max-sequences-per-request",
        type=int,
        default=MAX_SEQUENCES_PER_REQUEST,
        help="most sequences (prompts x n) one request may ask for; more get a 400 (default %(default)s)",
    )
    ap.add_argument("--shell", "--shell-mode", action="store_true", help="chat in the terminal instead of serving HTTP")
    ap.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="(default info)")
    add_engine_args(ap.add_argument_group("engine"))
    return ap


def parse_args(argv: list[str] | None = None) -> ServerArgs:
    ap = build_parser()
    ns = ap.parse_args(argv)
    engine = engine_kwargs(ns)
    try:
        EngineConfig.from_kwargs(**engine)  # check now: a bad flag is a usage error, not a crash later
    except (ValueError, TypeError) as e:
        ap.error(str(e))
    if not 0 <= ns.port < 65536:
        ap.error(f"--port must be in 0..65535 (0 = any free port), got {ns.port}")
    if ns.max_sequences_per_request < 1:
        ap.error(f"--max-sequences-per-request must be at least 1, got {ns.max_sequences_per_request}")
    return ServerArgs(engine, ns.host, ns.port, ns.api_key, ns.shell, ns.log_level, ns.max_sequences_per_request)
