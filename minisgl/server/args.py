"""Command-line arguments of ``python -m minisgl`` (the server and the shell). The engine's flags
come from ``EngineConfig``'s fields (``add_engine_args``), the environment table from
``minisgl.env``: each default and help text is written once."""

from __future__ import annotations

import argparse
import ipaddress
from dataclasses import dataclass, field
from typing import Any

from minisgl.engine.config import EngineConfig, add_engine_args, engine_kwargs
from minisgl.env import help_table
from minisgl.server.ops.router_args import add_dp_args, check_dp_args
from minisgl.server.ops.sglang_args import add_sglang_args, apply_sglang_args
from minisgl.server.protocol import MAX_SEQUENCES_PER_REQUEST
from minisgl.toolcall import REASONING_PARSERS

DEFAULT_READ_TIMEOUT_S = 30.0  # --request-read-timeout
DEFAULT_MAX_CONNECTIONS = 10_000  # --max-connections, unless the open-file limit allows fewer

EXAMPLES = """\
examples:
  python -m minisgl                               # serve the embedded model on 127.0.0.1:1919
  python -m minisgl --model path/to/Qwen3-0.6B --port 30000 --api-key secret
  python -m minisgl --shell                       # chat in the terminal
"""
# a heartbeat goes round every second and takes milliseconds; the bound leaves room for a burst of
# work between steps (tokenizing an 8 MiB prompt takes seconds). A long step is excused apart
# (BusyMsg), so it need not cover one: a CPU prefill of 8k tokens takes a minute.
HEALTH_TIMEOUT_S = 10.0
SSE_KEEPALIVE_S = 10.0  # --sse-keepalive: under common client read timeouts (30-60 s), and cheap


@dataclass
class ServerArgs:
    engine: dict[str, Any] = field(default_factory=dict)  # EngineConfig keyword arguments
    host: str = "127.0.0.1"
    port: int = 1919
    api_key: str | None = None
    shell: bool = False
    log_level: str = "info"
    max_sequences_per_request: int = MAX_SEQUENCES_PER_REQUEST
    request_read_timeout: float = DEFAULT_READ_TIMEOUT_S
    max_connections: int | None = None  # None: DEFAULT_MAX_CONNECTIONS, or what the open-file limit allows
    request_timeout: float | None = None  # seconds; None: requests may run as long as they need
    health_timeout: float = HEALTH_TIMEOUT_S
    sse_keepalive: float = SSE_KEEPALIVE_S  # seconds without a byte before a stream gets a comment; 0: off
    nnodes: int = 1  # machines the TP ranks spread over; node 0 runs the API server and rank 0
    node_rank: int = 0
    dist_init_addr: str | None = None  # host:port of node 0's rendezvous (required with nnodes > 1)
    served_model_name: str | None = None  # the name clients see; None: --model as given (SGLang's flag)
    reasoning_parser: str = "auto"  # <think> text as reasoning_content (minisgl/toolcall/parse.py)
    trust_remote_code: bool = False  # accepted for SGLang's command lines; never acted on
    dp: int = 1  # replicas behind sglang-router (minisgl/server/ops/router_args.py, dp.py); 1: this process serves
    router_policy: str = "cache_aware"
    worker_urls: list[str] = field(default_factory=list)  # replicas elsewhere the router also routes to
    chat_template: str | None = None  # SGLang's --chat-template (the template's text): replaces the model's
    log_requests: bool = False  # SGLang's --log-requests: a log line per finished or aborted request
    incremental_streaming_output: bool = False  # SGLang's: /generate streams deltas, not the text so far

    @property
    def detokenizer(self) -> str:
        """The ``DETOKENIZERS`` name the detokenizer process and the API server run (``--detokenizer``)."""
        parts = self.engine.get("components") or {}
        return parts.get("detokenizer", "default") if isinstance(parts, dict) else parts.detokenizer

    @property
    def ranks(self) -> range:
        """The TP ranks this node runs: ``tp / nnodes`` consecutive ones."""
        per_node = self.engine.get("tp_size", 1) // self.nnodes
        return range(self.node_rank * per_node, (self.node_rank + 1) * per_node)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def loopback_only(self) -> bool:
        """Whether only this machine can reach the server (a host name other than localhost is
        not resolved, and counts as reachable from outside)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m minisgl",
        description="Serve a model with an OpenAI-compatible API (or chat with it in the terminal with --shell).",
        epilog=f"environment variables:\n{help_table()}\n\n{EXAMPLES}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the HTTP server binds (default 127.0.0.1; one other machines reach, without --api-key, "
        "logs a warning)",
    )
    ap.add_argument("--port", type=int, default=1919, help="HTTP port (default 1919; 0 = any free port)")
    ap.add_argument(
        "--api-key",
        default=None,
        help="require `Authorization: Bearer API_KEY` on every request but /health (ASCII; the scheme's case is free)",
    )
    ap.add_argument(
        "--request-read-timeout",
        type=float,
        default=DEFAULT_READ_TIMEOUT_S,
        metavar="SECONDS",
        help="close a connection whose request (head and body) has not fully arrived this long after it began "
        f"(default {DEFAULT_READ_TIMEOUT_S:g})",
    )
    ap.add_argument(
        "--max-connections",
        type=int,
        default=None,
        metavar="N",
        help=f"open HTTP connections at most (default {DEFAULT_MAX_CONNECTIONS}, fewer if the open-file limit is "
        "lower); past it a new connection closes the oldest one still waiting for its request",
    )
    ap.add_argument(
        "--max-sequences-per-request",
        type=int,
        default=MAX_SEQUENCES_PER_REQUEST,
        help="most sequences (prompts x n) one request may ask for; more get a 400 (default %(default)s)",
    )
    ap.add_argument(
        "--reasoning-parser",
        default="auto",
        choices=REASONING_PARSERS,
        help="<think> text as reasoning_content: qwen3, none, or auto (qwen3 if the chat template knows <think>)",
    )
    ap.add_argument("--shell", "--shell-mode", action="store_true", help="chat in the terminal instead of serving HTTP")
    ap.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="(default info)")
    ap.add_argument(
        "--request-timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="abort a request still unfinished after S seconds: 504, or an error event on a stream (default: none)",
    )
    ap.add_argument(
        "--health-timeout",
        type=_seconds,
        default=HEALTH_TIMEOUT_S,
        metavar="S",
        help="GET /health answers 503 when a worker has not answered its heartbeat for S seconds "
        f"(default {HEALTH_TIMEOUT_S:g}; a long step does not count)",
    )
    ap.add_argument(
        "--detokenizer",
        default="default",
        metavar="NAME",
        help="how tokens become the client's text (incremental detokenization and stop strings): a name "
        "registered in minisgl.tokenizer.detokenizer.DETOKENIZERS, or 'module:attr' of a TextStreams "
        "(default %(default)s)",
    )
    ap.add_argument(
        "--sse-keepalive",
        type=float,
        default=SSE_KEEPALIVE_S,
        metavar="S",
        help="a stream with nothing to send for S seconds (queued, or between two tokens) gets an SSE comment "
        "line, so that clients' read timeouts do not fire; it begins after S s even if its first token has not "
        "come (default %(default)s; 0 = off)",
    )
    nodes = ap.add_argument_group("several machines (tensor parallelism across nodes)")
    nodes.add_argument("--nnodes", type=int, default=1, help="machines the --tp ranks spread over (default 1)")
    nodes.add_argument(
        "--node-rank", type=int, default=0, help="this machine's index; node 0 serves HTTP and runs rank 0 (default 0)"
    )
    nodes.add_argument(
        "--dist-init-addr",
        default=None,
        metavar="HOST:PORT",
        help="an address of node 0 that every node reaches, where the ranks meet (required with --nnodes > 1)",
    )
    add_engine_args(ap.add_argument_group("engine"), step_time="auto")  # a server bounds its steps in time
    add_sglang_args(ap)
    add_dp_args(ap)
    return ap


def parse_args(argv: list[str] | None = None) -> ServerArgs:
    ap = build_parser()
    ns = ap.parse_args(argv)
    engine = engine_kwargs(ns)
    apply_sglang_args(ap, ns, engine)
    if ns.detokenizer != "default":
        from minisgl.tokenizer.detokenizer import text_streams

        try:  # imported here too: a wrong name is a usage error, not a dead worker
            text_streams(ns.detokenizer)
        except (ValueError, ImportError) as e:
            ap.error(f"--detokenizer: {e}")
        engine["components"] = {**(engine.get("components") or {}), "detokenizer": ns.detokenizer}
    algo = engine.get("speculative_algorithm")
    if algo is not None and ":" not in algo:
        from minisgl.speculative import DRAFTERS

        if algo.lower() not in DRAFTERS:
            ap.error(f"--speculative-algorithm: {algo!r} is not NGRAM, STANDALONE, none or a registered drafter")
        if algo.lower() == "standalone" and not engine.get("speculative_draft_model_path"):
            ap.error("--speculative-algorithm STANDALONE needs --speculative-draft-model-path")
    try:
        EngineConfig.from_kwargs(**engine)  # check now: a bad flag is a usage error, not a crash later
    except (ValueError, TypeError) as e:
        ap.error(str(e))
    if not 0 <= ns.port < 65536:
        ap.error(f"--port must be in 0..65535 (0 = any free port), got {ns.port}")
    if ns.max_sequences_per_request < 1:
        ap.error(f"--max-sequences-per-request must be at least 1, got {ns.max_sequences_per_request}")
    if ns.api_key is not None and not (ns.api_key.isascii() and ns.api_key == ns.api_key.strip()):
        # a header carries bytes: a non-ASCII key has no one spelling a client would send, and
        # surrounding whitespace is stripped from header values, so such a key could never match
        ap.error("--api-key must be ASCII, without leading or trailing whitespace")
    if not ns.request_read_timeout > 0:
        ap.error(f"--request-read-timeout must be > 0 seconds, got {ns.request_read_timeout}")
    if ns.max_connections is not None and ns.max_connections < 1:
        ap.error(f"--max-connections must be >= 1, got {ns.max_connections}")
    if not 0 <= ns.sse_keepalive < float("inf"):  # also refuses nan
        ap.error(f"--sse-keepalive must be >= 0 seconds (0 = off), got {ns.sse_keepalive}")
    check_nodes(ap, ns, engine.get("tp_size", 1))
    check_dp_args(ap, ns)
    return ServerArgs(
        engine,
        ns.host,
        ns.port,
        ns.api_key,
        ns.shell,
        ns.log_level,
        request_read_timeout=ns.request_read_timeout,
        max_connections=ns.max_connections,
        max_sequences_per_request=ns.max_sequences_per_request,
        request_timeout=ns.request_timeout,
        health_timeout=ns.health_timeout,
        sse_keepalive=ns.sse_keepalive,
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        dist_init_addr=ns.dist_init_addr,
        served_model_name=ns.served_model_name,
        reasoning_parser=ns.reasoning_parser,
        trust_remote_code=ns.trust_remote_code,
        dp=ns.dp,
        router_policy=ns.router_policy,
        worker_urls=ns.worker_urls,
        chat_template=ns.chat_template,
        log_requests=ns.log_requests,
        incremental_streaming_output=ns.incremental_streaming_output,
    )


def check_nodes(ap: argparse.ArgumentParser, ns: argparse.Namespace, tp: int) -> None:
    if ns.nnodes < 1:
        ap.error(f"--nnodes must be >= 1, got {ns.nnodes}")
    if tp % ns.nnodes:
        ap.error(f"--tp {tp} does not split over --nnodes {ns.nnodes}: every node runs the same number of ranks")
    if not 0 <= ns.node_rank < ns.nnodes:
        ap.error(f"--node-rank must be in 0..{ns.nnodes - 1}, got {ns.node_rank}")
    if ns.nnodes > 1 and ns.dist_init_addr is None:
        ap.error("--nnodes > 1 needs --dist-init-addr HOST:PORT (an address of node 0 every node reaches)")
    if ns.dist_init_addr is not None:
        host, _, port = ns.dist_init_addr.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            ap.error(f"--dist-init-addr must be HOST:PORT, got {ns.dist_init_addr!r}")
    if ns.node_rank > 0 and ns.shell:
        ap.error("--shell runs on node 0 (--node-rank 0)")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value
