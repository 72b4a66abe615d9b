"""Which model a name means: a local Hugging Face folder, the embedded model, a known architecture
(with dummy weights), or a hub id already in the local cache."""

from __future__ import annotations

from pathlib import Path

from minisgl.models.config import KNOWN_CONFIGS, ModelConfig


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
    try:  # a hub id that is already in the local HF cache (we never download)
        from huggingface_hub import snapshot_download

        local = Path(snapshot_download(model, local_files_only=True))
        return local, ModelConfig.from_path(local)
    except Exception:
        pass
    known = ", ".join(KNOWN_CONFIGS)
    raise ValueError(
        f"model {model!r} not found: pass a local Hugging Face folder (with config.json and "
        f"*.safetensors), omit --model for the embedded model, or use --dummy-weight with one of {known}"
    )
