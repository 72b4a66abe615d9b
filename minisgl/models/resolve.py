"""Which model a name means: a local Hugging Face folder, the embedded model, a known architecture
(with dummy weights), or a hub id (``org/name``): from the local Hugging Face cache, else downloaded
(only the files the engine reads) unless ``HF_HUB_OFFLINE=1``."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from minisgl.models.config import KNOWN_CONFIGS, ModelConfig

logger = logging.getLogger(__name__)

# what the engine reads from a hub repository: config, safetensors weights, tokenizer and chat template
HUB_FILES = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model(model: str | None, dummy_weight: bool = False) -> tuple[Path | None, ModelConfig]:
    """The model folder and its config. ``None`` = the embedded model; a known architecture name
    (e.g. ``Qwen3-0.6B``) with ``dummy_weight`` needs no folder at all."""
    if model is None:
        from minisgl.models.embedded import embedded_model_path

        path = embedded_model_path()
        return path, ModelConfig.from_path(path)
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"{path} has no config.json: not a Hugging Face model folder")
        return path, ModelConfig.from_path(path)
    if dummy_weight and model in KNOWN_CONFIGS:
        return None, ModelConfig.from_dict(KNOWN_CONFIGS[model])
    local = from_hub(model) if _HUB_ID.match(model) else None
    if local is not None:
        return local, ModelConfig.from_path(local)
    known = ", ".join(KNOWN_CONFIGS)
    raise ValueError(
        f"model {model!r} not found: pass a local Hugging Face folder (with config.json and *.safetensors), "
        "a hub id (org/name; with HF_HUB_OFFLINE=1 only from the local Hugging Face cache), omit --model "
        f"for the embedded model, or use --dummy-weight with one of {known}"
    )


def from_hub(repo_id: str) -> Path | None:
    """The snapshot folder of ``repo_id``: from the local Hugging Face cache, else downloaded with a
    progress bar (only ``HUB_FILES``). None when it is not cached and downloads are off
    (``HF_HUB_OFFLINE``) or ``huggingface_hub`` is missing; ``ValueError`` when a download fails."""
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError:
        return None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES, local_files_only=True))
    except Exception:  # not in the cache (or an incomplete snapshot)
        pass
    if constants.HF_HUB_OFFLINE:
        return None
    logger.info("downloading %s from the Hugging Face hub (config, safetensors, tokenizer)", repo_id)
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except Exception as e:
        raise ValueError(f"cannot download {repo_id!r} from the Hugging Face hub: {type(e).__name__}: {e}") from e
