"""SGLang's own serving benchmark (``python -m sglang.bench_serving``) against this server, without
installing SGLang's runtime.

    pip install --no-deps "sglang==0.5.23" && pip install msgspec orjson
    python -m minisgl &                                # or: python -m minisgl --dp 2
    python -m minisgl.benchmark.sglang_bench --backend sglang-oai --base-url http://127.0.0.1:1919 \\
        --dataset-name random-ids --random-input-len 256 --random-output-len 64 --random-range-ratio 0.5 \\
        --num-prompts 64 --request-rate 4 --seed 0

Every argument is ``sglang.bench_serving``'s (``--help`` lists them). Without ``--tokenizer`` (and
``--model``) the embedded model's tokenizer is used, so nothing is downloaded.

Why a shim: the benchmark (``sglang.benchmark.serving`` in SGLang 0.5.23, which
``sglang.bench_serving`` re-exports) is a client: aiohttp, a tokenizer, numpy. But importing any
``sglang`` module first runs ``sglang/__init__.py``, which loads SGLang's runtime (torch, FlashInfer,
its patches to transformers), and the benchmark imports two names from that runtime. This module puts
into ``sys.modules``, before the benchmark is imported:

- ``sglang``, ``sglang.srt``: bare packages over the wheel's folders (their submodules load from the
  wheel; their ``__init__`` does not run);
- ``sglang.srt.disaggregation.utils``: ``FAKE_BOOTSTRAP_HOST``, the placeholder address the
  benchmark writes into requests only in prefill/decode-disaggregation mode;
- ``sglang.srt.utils.network``: ``resolve_base_url`` / ``resolve_host_port``, the URL from
  ``--base-url`` or ``--host`` and ``--port``;
- ``sglang.benchmark.datasets.image`` and ``.mmmu``: the image data sets (PIL, pybase64, HF
  ``datasets``), which a text-only server does not serve; asking for them is an error.

Nothing of SGLang's is copied here; the wheel is SGLang's, unchanged.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

SGLANG_VERSION = "0.5.23"  # the version these stubs were written against
INSTALL = f'pip install --no-deps "sglang=={SGLANG_VERSION}" && pip install msgspec orjson'


def _package(name: str, folder: Path) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__path__ = [str(folder)]  # a package: its submodules are found in the wheel's folder
    sys.modules[name] = mod
    return mod


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def _url(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _NoImages:
    def __init__(self, *args, **kwargs):
        raise SystemExit("sglang_bench: the image data sets (image, mmmu) need a multimodal server; this one is text")

    @classmethod
    def from_args(cls, args):
        return cls()


def install_stubs() -> None:
    """Make ``sglang.benchmark.serving`` importable without SGLang's runtime (see the module's doc)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"sglang_bench: SGLang's wheel is not installed: {INSTALL}")
    root = Path(next(iter(spec.submodule_search_locations)))
    _package("sglang", root)
    _package("sglang.srt", root / "srt")
    _package("sglang.srt.disaggregation", root / "srt" / "disaggregation")
    _package("sglang.srt.utils", root / "srt" / "utils")
    _module("sglang.srt.disaggregation.utils", FAKE_BOOTSTRAP_HOST="2.2.2.2")
    _module(
        "sglang.srt.utils.network",
        resolve_base_url=lambda base_url, host, port: base_url or f"http://{_url(host, port)}",
        resolve_host_port=lambda base_url, host, port: base_url or _url(host, port),
    )
    _module("sglang.benchmark.datasets.image", ImageDataset=_NoImages)
    _module("sglang.benchmark.datasets.mmmu", MMMUDataset=_NoImages)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    install_stubs()
    try:
        from sglang.benchmark import serving
    except ImportError as e:
        raise SystemExit(f"sglang_bench: {e} (written against sglang {SGLANG_VERSION}: {INSTALL})") from None
    if not any(a.split("=")[0] in ("--tokenizer", "--model") for a in argv):
        from minisgl.models.embedded import embedded_model_path

        # the model's name comes from /v1/models; its tokenizer from the local files (the embedded
        # model's served name is no hub id)
        argv += ["--tokenizer", str(embedded_model_path())]
    sys.argv = ["sglang.bench_serving", *argv]
    serving.cli_main()


if __name__ == "__main__":
    main()
