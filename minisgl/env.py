"""Every ``MINISGL_*`` environment variable, read once, here, when minisgl is imported.

``VARS`` below is the list (name, default, what it does); ``python -m minisgl --help`` prints it and
the engine manual's (docs/serving.md) environment table shows the same. Code reads ``ENV.<name>`` (the
variable's name in lower case, without the prefix); tests change a setting with
``monkeypatch.setattr(ENV, name, value)``. A malformed value falls back to the default at import,
and ``ENV.check()`` (called by ``python -m minisgl`` at start-up) reports it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

PREFIX = "MINISGL_"


def flag(raw: str) -> bool:
    return raw.strip().lower() not in ("", "0", "false", "no", "off")


KV_STORES = ("tvm_ffi", "triton", "torch")


CPU_ISAS = ("avx512", "avx2", "portable")  # minisgl.kernels.jit.ISAS


def cpu_isa(raw: str) -> str:
    if raw.strip().lower() not in CPU_ISAS:
        raise ValueError(f"expected one of {', '.join(CPU_ISAS)}")
    return raw.strip().lower()


def kv_store(raw: str) -> str:
    if raw.strip().lower() not in KV_STORES:
        raise ValueError(f"expected one of {', '.join(KV_STORES)}")
    return raw.strip().lower()


@dataclass(frozen=True)
class Var:
    name: str  # without the prefix
    default: Any
    parse: Callable[[str], Any]
    help: str

    @property
    def env_name(self) -> str:
        return PREFIX + self.name

    @property
    def attr(self) -> str:
        return self.name.lower()


VARS: tuple[Var, ...] = (
    Var("DISABLE_OVERLAP_SCHEDULING", False, flag, "1: the plain scheduler loop, even on CUDA"),
    Var("FUSED_KERNELS", True, flag, "0: torch instead of the fused kernels (FlashInfer, Triton; C++ on the CPU)"),
    Var("FI_TENSOR_CORES", True, flag, "0: FlashInfer's CUDA-core decode kernel"),
    Var("FI_NO_SPLIT_MIN_BS", 32, int, "captured decode batches of at least this many skip split-KV"),
    Var("FP8_FUSED", True, flag, "0: FP8 layers quantize their inputs and scale their outputs in passes of their own"),
    Var("NVTX", True, flag, "0: no NVTX ranges on CUDA"),
    Var("DISABLE_JIT", False, flag, "1: no C++ kernels through TVM FFI (torch instead)"),
    Var(
        "CPU_ISA",
        None,
        cpu_isa,
        "C++ CPU kernels: avx512, avx2 or portable (default: the widest this CPU runs; a narrower one tests its code)",
    ),
    Var("KV_STORE", "tvm_ffi", kv_store, "GPU K/V store: tvm_ffi (CUDA through TVM FFI), triton or torch"),
    Var("CACHE_DIR", None, str, "where the embedded model is converted to (once)"),
    Var("VLLM_PYTHON", None, str, "benchmarks: the interpreter of an environment with vLLM (--engine vllm)"),
    Var("SHELL_MAX_TOKENS", 512, int, "shell: tokens per answer"),
    Var(
        "SHELL_TEMPERATURE",
        None,
        float,
        "shell: sampling temperature (default 0, greedy, on the embedded model; 0.6 on others)",
    ),
    Var("SHELL_TOP_P", 0.95, float, "shell: nucleus sampling threshold"),
    Var("SHELL_TOP_K", -1, int, "shell: top-k filter (-1 = off)"),
    Var("SHELL_HISTORY", None, str, "shell: history file (default: in the minisgl cache folder)"),
)

_TYPE_NAMES = {int: "integer", float: "number", flag: "flag (0 or 1)", str: "string"}


class Env:
    """The settings of ``VARS``, as attributes."""

    disable_overlap_scheduling: bool
    fused_kernels: bool
    fi_tensor_cores: bool
    fi_no_split_min_bs: int
    fp8_fused: bool
    nvtx: bool
    disable_jit: bool
    cpu_isa: str | None
    kv_store: str
    cache_dir: str | None
    vllm_python: str | None
    shell_max_tokens: int
    shell_temperature: float
    shell_top_p: float
    shell_top_k: int
    shell_history: str | None

    def __init__(self, environ: Mapping[str, str] | None = None, strict: bool = True):
        """Read ``environ`` (default ``os.environ``). ``strict``: a malformed value raises
        ``ValueError`` naming the variable; otherwise it is kept in ``errors`` and the default used."""
        environ = os.environ if environ is None else environ
        self.errors: list[str] = []
        for var in VARS:
            raw = environ.get(var.env_name)
            value = var.default
            if raw not in (None, ""):
                try:
                    value = var.parse(raw)
                except ValueError as e:
                    kind = _TYPE_NAMES.get(var.parse)
                    msg = f"{var.env_name}={raw!r} is not a valid {kind}" if kind else f"{var.env_name}={raw!r}: {e}"
                    if strict:
                        raise ValueError(msg) from None
                    self.errors.append(msg)
            setattr(self, var.attr, value)

    def check(self) -> None:
        """Raise ``ValueError`` for the first malformed variable read at import."""
        if self.errors:
            raise ValueError(self.errors[0])


def help_table() -> str:
    """The variables as lines for ``--help``."""

    def default(v: Var) -> str:
        if v.default is None:
            return ""
        return f" (default {int(v.default) if isinstance(v.default, bool) else v.default})"

    return "\n".join(f"  {v.env_name:<38}{v.help}{default(v)}" for v in VARS)


ENV = Env(strict=False)
