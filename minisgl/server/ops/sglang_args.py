"""SGLang's spellings of the server's flags (``python -m sglang.launch_server``): the flags that mean
the same as ours are aliases in ``EngineConfig``'s flag tuples (``--model-path``, ``--tp``,
``--context-length``, ...); here are SGLang's values of our flags, and SGLang's own flags turned into
our engine arguments, or refused with a sentence naming ours."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from minisgl.engine.config import EngineConfig

SGLANG_VALUES = {"dtype": {"half": "float16", "float": "float32"}, "attention_backend": {"torch_native": "torch"}}
SCHEDULE_POLICIES = {"fcfs": None, "default": "default", "reserve-all": "reserve-all"}  # -> our admission policy
SCHEDULE_POLICY_REFUSED = (
    "minisgl admits waiting requests in arrival order (fcfs); the prefix cache reuses shared prefixes whatever the "
    "order, but nothing reorders the queue by them (lpm, dfs-weight), by length (lof), by priority or at random. "
    "Accepted: fcfs, or our admission policies default and reserve-all (minisgl.scheduler.ADMISSION_POLICIES)"
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
    g.add_argument("--enable-metrics", action="store_true", help="accepted: GET /metrics is always on here")
    g.add_argument("--disable-overlap-schedule", action="store_true", help="the plain scheduler loop (even on CUDA)")
    prefill_help = "the most prompt tokens in one prefill batch: caps --max-prefill-length (busy) and the idle budget"
    g.add_argument("--max-prefill-tokens", type=int, metavar="N", help=prefill_help)
    policy_help = "fcfs (ours: arrival order), or an admission policy of ours (default, reserve-all); others refused"
    g.add_argument("--schedule-policy", metavar="NAME", help=policy_help)
    template_help = "a Jinja chat template (a file, or the template itself) used instead of the model's"
    g.add_argument("--chat-template", metavar="FILE_OR_TEMPLATE", help=template_help)
    g.add_argument("--log-requests", action="store_true", help="log each request's id, prompt and output lengths")
    stream_help = "/generate streams only the new text and token ids in each chunk (default: all so far, as SGLang)"
    g.add_argument("--incremental-streaming-output", action="store_true", help=stream_help)
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

    if ns.enable_metrics:
        print("minisgl: --enable-metrics: nothing to do, GET /metrics is always on", file=sys.stderr)
    if ns.disable_overlap_schedule:
        engine["components"] = {**(engine.get("components") or {}), "loop": "plain"}
    if ns.schedule_policy is not None:
        if ns.schedule_policy not in SCHEDULE_POLICIES:
            ap.error(f"--schedule-policy {ns.schedule_policy}: {SCHEDULE_POLICY_REFUSED}")
        if SCHEDULE_POLICIES[ns.schedule_policy] is not None:
            engine["components"] = {
                **(engine.get("components") or {}),
                "admission": SCHEDULE_POLICIES[ns.schedule_policy],
            }
    if ns.chat_template is not None and os.path.isfile(ns.chat_template):
        with open(ns.chat_template, encoding="utf-8") as f:
            ns.chat_template = f.read()
    elif ns.chat_template is not None and "{" not in ns.chat_template:  # a Jinja template has {{ }} or {% %}
        why = "SGLang's named templates (chatml, ...) are not built in: give a Jinja file or the template itself"
        ap.error(f"--chat-template {ns.chat_template}: no such file, and not a template. {why}")
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
    if (n := ns.max_prefill_tokens) is not None:
        if n < 1:
            ap.error(f"--max-prefill-tokens must be >= 1, got {n}")
        busy = engine.get("max_prefill_length")
        engine["max_prefill_length"] = n if busy in ("auto", None) else min(busy, n)
        engine["idle_prefill_length"] = engine["max_prefill_length"] if busy not in ("auto", None) else n
        if engine.get("step_time") == "auto":  # as --chunked-prefill-size: a budget in tokens, not in time
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
