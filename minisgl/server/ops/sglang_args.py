"""SGLang's spellings of the server's flags (``python -m sglang.launch_server``): the flags that mean
the same as ours are aliases in ``EngineConfig``'s flag tuples (``--model-path``, ``--tp``,
``--context-length``, ...); here are SGLang's values of our flags, and SGLang's own flags turned into
our engine arguments, or refused with a sentence naming ours."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from minisgl.engine.config import EngineConfig

SGLANG_VALUES = {"dtype": {"half": "float16", "float": "float32"}, "attention_backend": {"torch_native": "torch"}}
MEM_FRACTION_REFUSED = (
    "--mem-fraction-static is not supported: in SGLang it is the share of the GPU's whole memory that the "
    "weights and the KV pool take together; minisgl's --memory-ratio R gives the KV pool R of the memory still "
    "free once the weights are loaded (default 0.9). Use --memory-ratio, or --max-total-tokens N (or --num-pages N)"
)


def add_sglang_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("SGLang's flags (those that mean the same as ours are aliases above)")
    name_help = "the model name /v1/models and responses report, and requests may name (default: --model as given)"
    g.add_argument("--served-model-name", metavar="NAME", help=name_help)
    trust_help = "accepted and ignored: minisgl never runs code from a model folder (it implements each architecture)"
    g.add_argument("--trust-remote-code", action="store_true", help=trust_help)
    chunk_help = "--max-prefill-length N, a fixed budget of N tokens (no --step-time); -1: no chunking"
    g.add_argument("--chunked-prefill-size", type=int, metavar="N", help=chunk_help)
    pool_help = "KV pool size in tokens: --num-pages N / page size (rounded down to whole pages)"
    g.add_argument("--max-total-tokens", type=int, metavar="N", help=pool_help)
    g.add_argument("--disable-radix-cache", action="store_true", help="--cache-type naive (no prefix sharing)")
    g.add_argument("--disable-cuda-graph", action="store_true", help="--cuda-graph-max-bs 0")
    g.add_argument("--random-seed", type=int, metavar="N", help="seeds the engine (unseeded sampling, dummy weights)")
    g.add_argument("--mem-fraction-static", type=float, metavar="F", help="refused: see --memory-ratio")
    for action in ap._actions:  # SGLang's names for some of our flags' values (argparse lists no actions publicly)
        table = SGLANG_VALUES.get(action.dest)
        if table is not None:
            action.type = _translating(table)


def _translating(table: dict[str, str]) -> Callable[[str], str]:
    def value(text: str) -> str:  # each part of a "PREFILL,DECODE" pair on its own
        return ",".join(table.get(part, part) for part in text.split(","))

    return value


def apply_sglang_args(ap: argparse.ArgumentParser, ns: argparse.Namespace, engine: dict[str, Any]) -> None:
    """Turn SGLang's flags into ``engine``'s keyword arguments, or exit with a usage error naming ours."""
    from minisgl.attention import BACKENDS

    if ns.mem_fraction_static is not None:
        ap.error(MEM_FRACTION_REFUSED)
    if ns.served_model_name is not None and not ns.served_model_name.strip():
        ap.error("--served-model-name must not be empty")
    n = ns.chunked_prefill_size
    if n is not None:
        if engine.get("max_prefill_length") != "auto":
            ap.error("give one of --chunked-prefill-size (SGLang's name) and --max-prefill-length")
        if n == 0 or n < -1:
            ap.error(f"--chunked-prefill-size must be >= 1, or -1 for no chunking; got {n}")
        engine["max_prefill_length"] = None if n == -1 else n
        if engine.get("step_time") == "auto":  # the server's default: chunks sized by time, not N tokens
            engine["step_time"] = None
    if ns.max_total_tokens is not None:
        if engine.get("num_pages") is not None:
            ap.error("give one of --max-total-tokens (SGLang's, in tokens) and --num-pages (in pages)")
        try:
            page = EngineConfig.from_kwargs(**engine).page_size  # resolved here, pinned below
        except (ValueError, TypeError) as e:
            ap.error(str(e))
        if ns.max_total_tokens < page:
            ap.error(f"--max-total-tokens must be at least one page ({page} tokens), got {ns.max_total_tokens}")
        engine["page_size"], engine["num_pages"] = page, ns.max_total_tokens // page
    engine.update({"cache_type": "naive"} if ns.disable_radix_cache else {})
    engine.update({"cuda_graph_max_bs": 0} if ns.disable_cuda_graph else {})
    engine.update({"seed": ns.random_seed} if ns.random_seed is not None else {})
    backend = str(engine.get("attention_backend", "auto"))
    if backend != "auto" and not all(part in BACKENDS for part in backend.split(",")):
        ap.error(
            f"--attention-backend {backend}: unknown; minisgl has {', '.join(BACKENDS.names())} (or flashinfer, fa, "
            "torch_native), a PREFILL,DECODE pair of them, or auto; SGLang's triton, flashmla, trtllm, ... it has not"
        )
