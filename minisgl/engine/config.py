"""``EngineConfig``: every knob of the engine, shared by the offline API, the server, the shell and
the benchmarks. Each field carries its one default and its one help text; the command-line flags
of ``python -m minisgl`` and of the benchmarks are generated from them (``add_engine_args``)."""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from minisgl.env import ENV

# FlashInfer reads ragged batches faster in larger pages, but prefix-cache hits come in whole pages: 64
# tokens ties 256 on speed and loses little of a hit (measured in docs/benchmarks-gpu.md).
FLASHINFER_PAGE_SIZE = 64
# Prompt tokens per prefill batch. A batch's time is a pause for every running stream (decodes run
# between two chunks of a long prompt), and a CPU computes a chunk thousands of times slower (worst gaps
# by chunk size: docs/benchmarks.md, "Chunked prefill, CPU").
GPU_PREFILL_LENGTH, CPU_PREFILL_LENGTH = 8192, 128
# --step-time auto on a CPU: a prefill batch's target (minisgl.scheduler.timed.AdaptiveChunking)
CPU_STEP_TIME_S = 0.5
GRAMMAR_BACKEND_REFUSED = (  # SGLang's --grammar-backend: ours are minisgl.grammar.GRAMMAR_BACKENDS
    "xgrammar (the default) and dfa are built in; outlines and llguidance are not, and none is never needed"
)


def option(default: Any, help: str, *flags: str, choices: tuple[str, ...] | None = None, cli: bool = True, parse=None):
    """A config field with its help text and command-line flags (the first is the main spelling;
    the others are aliases, e.g. mini-sglang's). ``cli=False``: not a flag (API only); ``parse``:
    how the flag's text becomes the value (default: by the field's type)."""
    return field(default=default, metadata=dict(help=help, flags=flags, choices=choices, cli=cli, parse=parse))


def _length_or_auto(text: str) -> int | str | None:
    word = text.strip().lower()
    if word == "auto":
        return "auto"
    return None if word in ("none", "0") else int(word)


@dataclass
class Components:
    """Which registered implementation runs each part the course swaps (``minisgl/registry.py``).
    A lab registers its own under a new name and picks it here, e.g. ``LLM(components={"norm":
    "lab01"})``. The prefix cache and the attention backend are ``EngineConfig`` fields of their own."""

    sampler: str = "default"  # minisgl.engine.sample.SAMPLERS
    norm: str = "default"  # minisgl.layers.NORMS
    rotary: str = "default"  # minisgl.layers.ROTARIES
    activation: str = "default"  # minisgl.layers.ACTIVATIONS
    tp_layers: str = "default"  # minisgl.layers.TP_LAYERS
    communicator: str = "default"  # minisgl.distributed.COMMUNICATORS
    allocator: str = "default"  # minisgl.kvcache.ALLOCATORS
    req_table: str = "default"  # minisgl.kvcache.REQ_TABLES
    admission: str = "default"  # minisgl.scheduler.ADMISSION_POLICIES
    chunking: str = "default"  # minisgl.scheduler.CHUNKING_POLICIES
    loop: str = "auto"  # minisgl.scheduler.LOOPS; auto = "overlap" on CUDA, else "plain"
    graph_plan: str = "default"  # minisgl.engine.graph.GRAPH_PLANS (CUDA graphs: sizes, buckets, padding)
    detokenizer: str = "default"  # minisgl.tokenizer.detokenizer.DETOKENIZERS (the server's text, the shell's)
    grammar: str = "default"  # minisgl.grammar.GRAMMAR_BACKENDS (constrained decoding; default: xgrammar)
    verifier: str = "default"  # minisgl.speculative.VERIFIERS (speculative decoding's accept/reject step)


@dataclass
class EngineConfig:
    model: str | None = option(
        None,
        "Hugging Face model folder, or a hub id (org/name: from the local cache, else downloaded unless "
        "HF_HUB_OFFLINE=1); omitted = the embedded "
        "SmolLM2-135M-Instruct; with --dummy-weight also an architecture name such as Qwen3-0.6B",
        "--model",
        "--model-path",
    )
    dtype: str = option(
        "auto",
        "weights and KV dtype (auto: bfloat16 on GPUs and on AVX-512 CPUs with native bfloat16, else float32)",
        choices=("auto", "float32", "bfloat16", "float16"),
    )
    kv_cache_dtype: str = option(
        "auto",
        "KV cache dtype: auto (the model's dtype) or fp8_e4m3 (half the bytes of bf16 per token; values stored "
        "with a scale per layer and KV head calibrated at load, saturating at +-448 times it)",
        choices=("auto", "fp8_e4m3"),
    )
    quantization: str | None = option(
        None,
        "fp8: the linear layers' weights in FP8 with a scale per output row, inputs quantized per token "
        "(W8A8; FP8 tensor cores on Hopper, the same rounding emulated elsewhere); the embedding and LM "
        "head stay in --dtype; int8 / int4 (CPU): weight-only GGUF Q8_0 / Q4_1 blocks of 32, de-quantized in "
        "the C++ kernels; auto: the embedded model's own GGUF Q4_1 blocks, kept as they are",
        choices=("fp8", "int8", "int4", "auto"),
    )
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    tp_size: int = option(
        1, "tensor-parallel ranks, one scheduler process each", "--tp-size", "--tp", "--tensor-parallel-size"
    )
    page_size: int | None = option(
        None, f"tokens per KV page (default {FLASHINFER_PAGE_SIZE} where FlashInfer decodes, else 1)"
    )
    num_pages: int | None = option(None, "KV pool size in pages (default: from memory)")
    memory_ratio: float = option(0.9, "GPU: fraction of the memory left after loading the weights given to the KV pool")
    mem_fraction_static: float | None = option(
        None,
        "SGLang's: weights + KV pool take this share of the device's memory (GPU: all of it; CPU: the RAM)",
        parse=float,
    )
    max_running_requests: int = option(256, "requests decoded together at most")
    max_prefill_length: int | str | None = option(
        "auto",
        f"prompt tokens per prefill batch while requests decode; longer prompts are prefilled in chunks, with "
        f"the running requests decoding between them (default auto: {GPU_PREFILL_LENGTH} on GPUs, "
        f"{CPU_PREFILL_LENGTH} on CPUs; none: no limit)",
        "--max-prefill-length",
        "--max-extend-length",
        parse=_length_or_auto,
    )
    idle_prefill_length: int | str | None = option(
        "auto",
        "prompt tokens per prefill batch while no request decodes (nobody waits on it then)",
        cli=False,
    )
    step_time: float | str | None = option(
        None,
        "target seconds of a prefill batch: chunks are sized by the prefill speed measured as the engine runs, "
        "idle or not, so a long prompt never holds the other requests for longer (auto: 0.5 on CPUs, off on "
        "GPUs; the server's default is auto, the offline LLM's none)",
        "--step-time",
        parse=lambda t: t.strip().lower() if t.strip().lower() in ("auto", "none") else float(t),
    )
    mixed_chunk: bool = option(
        False,
        "decoding requests ride in prefill batches (one token each) instead of a decode step between two "
        "prefill batches. Off by default: their attention then runs as a prefill (on a CPU the torch "
        "backend gathers their whole context: the CPU benchmark ran at half speed; on a GPU, outside the "
        "CUDA graphs)",
        "--mixed-chunk",
        "--enable-mixed-chunk",
    )
    cache_type: str = option("radix", "prefix cache", "--cache-type", "--cache", choices=("radix", "naive"))
    attention_backend: str = option(
        "auto",
        'auto, torch, fi, fa3 (or fa), triton, or "PREFILL,DECODE" (e.g. fa3,fi)',
        "--attention-backend",
        "--attn",
    )
    speculative_algorithm: str | None = option(
        None,
        "speculative decoding: NGRAM (prompt lookup: drafts copied from the prompt and the text so far, verified "
        "in one pass; pays on repetitive and code-like output), STANDALONE (a smaller draft model with the same "
        "vocabulary: --speculative-draft-model-path), or none (default); any name registered in "
        "minisgl.speculative.DRAFTERS",
        parse=lambda t: None if t.strip().lower() in ("", "none") else t.strip(),
    )
    speculative_num_draft_tokens: int = option(4, "draft tokens per request per step, at most (speculative decoding)")
    speculative_draft_model_path: str | None = option(
        None, "the draft model's folder (speculative decoding with STANDALONE): same vocabulary as the model"
    )
    speculative_backoff: int = option(
        64,
        "speculative decoding: after a verify step that accepted none of a request's drafts, the request does "
        "not draft for 2 decode steps, doubling with each such step in a row (an accepted draft resets it), at "
        "most this many; 0: it drafts at every step",
    )
    grammar_backend: str | None = option(None, f"SGLang's name for components.grammar: {GRAMMAR_BACKEND_REFUSED}")
    cuda_graph_max_bs: int | None = option(None, "largest CUDA-graph batch (default: from memory; 0 = off)")
    dummy_weight: bool = option(False, "random weights (benchmarks without a checkpoint)")
    max_seq_len: int | None = option(
        None,
        "cap on prompt + output tokens (default: the model's)",
        "--max-seq-len",
        "--max-seq-len-override",
        "--context-length",
    )
    seed: int = option(0, "seeds the seeds drawn for unseeded sampled requests", cli=False)
    debug_checks: bool = option(False, "check every memory invariant after each step (slow)", cli=False)
    components: Components = field(default_factory=Components)  # the implementation of each swappable part
    # internal: set by the tensor-parallel launcher
    tp_rank: int = option(0, "this process's rank", cli=False)
    dist_init_method: str = option("", "tcp://host:port of rank 0's rendezvous", cli=False)

    def __post_init__(self) -> None:
        if isinstance(self.components, dict):
            known = {f.name for f in fields(Components)}
            if set(self.components) - known:
                raise ValueError(f"unknown component(s) {sorted(set(self.components) - known)}; known: {sorted(known)}")
            self.components = Components(**self.components)
        if self.grammar_backend not in (None, "xgrammar", "dfa"):
            raise ValueError(f"grammar_backend {self.grammar_backend!r}: {GRAMMAR_BACKEND_REFUSED}")
        if self.grammar_backend is not None:
            self.components.grammar = {"xgrammar": "default"}.get(self.grammar_backend, self.grammar_backend)
        if self.page_size is None:
            self.page_size = self._default_page_size()
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        if self.idle_prefill_length == "auto":  # the auto budget: GPU_PREFILL_LENGTH, else as when busy
            auto = self.max_prefill_length == "auto"
            self.idle_prefill_length = GPU_PREFILL_LENGTH if auto else self.max_prefill_length
        if self.step_time == "auto":
            self.step_time = None if self.torch_device.type == "cuda" else CPU_STEP_TIME_S
        if self.step_time in ("none", 0, 0.0):
            self.step_time = None
        if self.step_time is not None and not (isinstance(self.step_time, (int, float)) and self.step_time > 0):
            raise ValueError(f"step_time must be > 0 seconds, auto or None, got {self.step_time!r}")
        if self.max_prefill_length == "auto":  # with a step time, the time bounds a batch, not a CPU's small budget
            cuda = self.torch_device.type == "cuda"
            self.max_prefill_length = GPU_PREFILL_LENGTH if cuda or self.step_time else CPU_PREFILL_LENGTH
        for name in ("max_prefill_length", "idle_prefill_length"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be >= 1 (or None), got {value!r}")
        # (an unknown speculative_algorithm is refused where the scheduler looks it up: DRAFTERS is a layer above)
        if self.speculative_num_draft_tokens < 1:
            raise ValueError(f"speculative_num_draft_tokens must be >= 1, got {self.speculative_num_draft_tokens}")
        if self.speculative_backoff < 0:
            raise ValueError(f"speculative_backoff must be >= 0 (0: off), got {self.speculative_backoff}")
        if self.num_pages is not None and self.num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {self.num_pages}")
        if self.mem_fraction_static is not None and not (0 < self.mem_fraction_static <= 1 and self.num_pages is None):
            raise ValueError(
                f"mem_fraction_static must be in (0, 1], without num_pages; got {self.mem_fraction_static}"
            )
        if not (0.0 < self.memory_ratio <= 1.0):
            raise ValueError(f"memory_ratio must be in (0, 1], got {self.memory_ratio}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.quantization not in (None, "fp8", "int8", "int4", "auto"):
            raise ValueError(f"quantization must be fp8, int8, int4, auto or None, got {self.quantization!r}")
        if self.kv_cache_dtype not in ("auto", "fp8_e4m3"):
            raise ValueError(f"kv_cache_dtype must be auto or fp8_e4m3, got {self.kv_cache_dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(kwargs) - known
        if unknown:
            raise TypeError(f"unknown engine argument(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**kwargs)

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            kind = "cuda" if torch.cuda.is_available() else "cpu"
        else:
            kind = self.device
        if kind == "cuda":
            return torch.device("cuda", self.tp_rank % max(1, torch.cuda.device_count()))
        return torch.device(kind)

    def _default_page_size(self) -> int:
        """``FLASHINFER_PAGE_SIZE`` when FlashInfer runs decode: its kernels read a ragged batch's KV
        faster in larger pages. 1 for the torch backend, the course's CPU path, where a page is a token
        and the radix cache shares prefixes token by token."""
        from minisgl.attention import auto_runs_flashinfer

        decode = self.attention_backend.split(",")[-1]
        if decode == "auto":
            return FLASHINFER_PAGE_SIZE if auto_runs_flashinfer(self.torch_device, self.torch_dtype) else 1
        return 1 if decode == "torch" else FLASHINFER_PAGE_SIZE

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype != "auto":
            return _DTYPES[self.dtype]
        return torch.bfloat16 if self.torch_device.type == "cuda" else default_cpu_dtype()

    @property
    def decode_rows_per_request(self) -> int:
        """Rows a running request may take in one decode pass (speculative decoding's verify pass: the
        last token and every draft): what CUDA graphs are captured for."""
        return 1 + self.speculative_num_draft_tokens if self.speculative_algorithm else 1

    @property
    def torch_kv_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn if self.kv_cache_dtype == "fp8_e4m3" else self.torch_dtype

    @property
    def loop(self) -> str:
        """The scheduler loop's name: ``components.loop``, where ``auto`` is ``overlap`` on CUDA
        (unless ``MINISGL_DISABLE_OVERLAP_SCHEDULING``) and ``plain`` elsewhere."""
        if self.components.loop != "auto":
            return self.components.loop
        return "overlap" if self.torch_device.type == "cuda" and not ENV.disable_overlap_scheduling else "plain"


_DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_cpu_dtype() -> torch.dtype:
    """The dtype measured fastest on the level the CPU kernels run (``minisgl.kernels.jit.isa()``;
    docs/cpu.md, "The CPU decode step"): bfloat16 on avx512 where the CPU has native bfloat16
    arithmetic (AVX512-BF16, AMX), where its matmuls are several times faster than float32's (2.4x on an
    AVX512-BF16 EPYC) and a decode step reads half the bytes; float32 elsewhere. On avx2, bf16 weights
    (widened to float32 in registers) made a decode step 7% faster at batch 1 but 5% slower at 64, and
    torch's bf16 matmuls (prefill) are 5.6x slower than its float32 ones there; portable: unmeasured.
    Parity tests against HF pin ``dtype="float32"``."""
    from minisgl.kernels.jit import isa

    native_bf16 = {"avx512_bf16", "amx_bf16"} & _cpu_flags()
    return torch.bfloat16 if isa() == "avx512" and native_bf16 else torch.float32


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return frozenset()


# ---- command-line flags, generated from the fields above -----------------------------------------
def cli_fields(names: list[str] | None = None) -> list:
    """The fields that are flags (all of them, or ``names`` in that order)."""
    by_name = {f.name: f for f in fields(EngineConfig) if f.metadata.get("cli")}
    if names is None:
        return list(by_name.values())
    return [by_name[n] for n in names]


def add_engine_args(parser: argparse.ArgumentParser, names: list[str] | None = None, **defaults: Any) -> None:
    """Add a flag per engine field (or per field in ``names``) to ``parser``. ``defaults`` overrides
    a field's default for this program only (a benchmark's ``model="Qwen3-0.6B"``)."""
    for f in cli_fields(names):
        meta = f.metadata
        flags = meta["flags"] or ("--" + f.name.replace("_", "-"),)
        default = defaults.get(f.name, f.default)
        shown = "default" in meta["help"] or default is None or isinstance(default, bool)
        help = meta["help"] if shown else f"{meta['help']} (default {default})"
        kw: dict[str, Any] = dict(dest=f.name, default=default, help=help)
        if f.type in ("bool", bool):
            kw["action"] = "store_true"
        else:
            kw["type"] = meta["parse"] or {"int | None": int, "int": int, "float": float}.get(str(f.type), str)
            if meta["choices"]:
                kw["choices"] = meta["choices"]
        parser.add_argument(*flags, **kw)


def engine_kwargs(ns: argparse.Namespace, names: list[str] | None = None) -> dict[str, Any]:
    """The ``EngineConfig`` keyword arguments parsed by ``add_engine_args``."""
    return {f.name: getattr(ns, f.name) for f in cli_fields(names) if hasattr(ns, f.name)}
