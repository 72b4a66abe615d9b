"""Command-line arguments of ``python -m minisgl`` (the server and the shell)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from minisgl.engine.config import PAGE_SIZE_HELP

EPILOG = """\
environment variables:
  MINISGL_DISABLE_OVERLAP_SCHEDULING=1  run the plain scheduler loop even on CUDA
  MINISGL_SHELL_MAX_TOKENS              shell: tokens per answer (default 512)
  MINISGL_SHELL_TEMPERATURE             shell: sampling temperature (default 0.6; 0 = greedy)
  MINISGL_SHELL_TOP_P                   shell: nucleus sampling threshold (default 0.95)
  MINISGL_SHELL_TOP_K                   shell: top-k filter (default -1 = off)
  MINISGL_SHELL_HISTORY                 shell: history file (default: in the minisgl cache folder)
  MINISGL_CACHE_DIR                     where the embedded model is converted to (once)

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

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m minisgl",
        description="Serve a model with an OpenAI-compatible API (or chat with it in the terminal with --shell).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--model",
        default=None,
        help="Hugging Face model folder (or a hub id already in the local cache); omitted = the embedded "
        "SmolLM2-135M-Instruct; with --dummy-weight also an architecture name such as Qwen3-0.6B",
    )
    ap.add_argument("--host", default="127.0.0.1", help="address the HTTP server binds (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=1919, help="HTTP port (default 1919; 0 = any free port)")
    ap.add_argument(
        "--tp-size",
        "--tp",
        dest="tp_size",
        type=int,
        default=1,
        help="tensor-parallel ranks, one scheduler process each (default 1)",
    )
    ap.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="weights and KV dtype (auto: bfloat16 on GPU, float32 on CPU)",
    )
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    ap.add_argument(
        "--max-running-requests", type=int, default=256, help="requests decoded together at most (default 256)"
    )
    ap.add_argument(
        "--max-prefill-length",
        "--max-extend-length",
        dest="max_prefill_length",
        type=int,
        default=8192,
        help="prompt tokens per prefill batch; longer prompts are prefilled in chunks (default 8192)",
    )
    ap.add_argument(
        "--cache-type", "--cache", dest="cache_type", default="radix", choices=["radix", "naive"], help="prefix cache"
    )
    ap.add_argument("--page-size", type=int, default=None, help=PAGE_SIZE_HELP)
    ap.add_argument("--num-pages", type=int, default=None, help="KV pool size in pages (default: from memory)")
    ap.add_argument(
        "--memory-ratio",
        type=float,
        default=0.9,
        help="GPU: fraction of the memory left after loading the weights given to the KV pool (default 0.9)",
    )
    ap.add_argument(
        "--attention-backend",
        "--attn",
        dest="attention_backend",
        default="auto",
        help='auto, torch, fi, fa3, or "PREFILL,DECODE" (e.g. fa3,fi)',
    )
    ap.add_argument(
        "--cuda-graph-max-bs", type=int, default=None, help="largest CUDA-graph batch (default: from memory; 0 = off)"
    )
    ap.add_argument("--max-seq-len", type=int, default=None, help="cap on prompt + output tokens (default: model's)")
    ap.add_argument("--dummy-weight", action="store_true", help="random weights (benchmarks without a checkpoint)")
    ap.add_argument("--api-key", default=None, help="require `Authorization: Bearer API_KEY` on every request")
    ap.add_argument("--shell", action="store_true", help="chat in the terminal instead of serving HTTP")
    ap.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="(default info)")
    return ap


ENGINE_FLAGS = (
    "model",
    "tp_size",
    "dtype",
    "device",
    "max_running_requests",
    "max_prefill_length",
    "cache_type",
    "page_size",
    "num_pages",
    "memory_ratio",
    "attention_backend",
    "cuda_graph_max_bs",
    "max_seq_len",
    "dummy_weight",
)


def parse_args(argv: list[str] | None = None) -> ServerArgs:
    ap = build_parser()
    ns = ap.parse_args(argv)
    engine = {k: getattr(ns, k) for k in ENGINE_FLAGS}
    from minisgl.engine.config import EngineConfig

    try:
        EngineConfig.from_kwargs(**engine)  # check now: a bad flag is a usage error, not a crash later
    except (ValueError, TypeError) as e:
        ap.error(str(e))
    if not 0 <= ns.port < 65536:
        ap.error(f"--port must be in 0..65535 (0 = any free port), got {ns.port}")
    return ServerArgs(engine, ns.host, ns.port, ns.api_key, ns.shell, ns.log_level)
