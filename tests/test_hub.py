"""Models named by a hub id (``org/name``): from the local Hugging Face cache, downloaded when not
there (only the files the engine reads), never downloaded with ``HF_HUB_OFFLINE=1``. No test here
reaches the network: a prepared cache folder stands in for the hub's cache, and the download call is
replaced by a recording stand-in."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def hub_cache(root: Path, repo_id: str, model: Path) -> Path:
    """A Hugging Face cache holding ``model``'s files as the snapshot of ``repo_id`` (refs/main)."""
    folder = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = folder / "snapshots" / "0123456789abcdef"
    shutil.copytree(model, snapshot)
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0123456789abcdef")
    return snapshot


def resolve_in_subprocess(repo_id: str, cache: Path) -> subprocess.CompletedProcess:
    code = (
        "from minisgl.models.resolve import resolve_model\n"
        f"path, cfg = resolve_model({repo_id!r})\n"
        "print(path, cfg.num_layers)\n"
    )
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


def test_a_cached_hub_model_resolves_offline(tiny_llama, tmp_path):
    snapshot = hub_cache(tmp_path / "hub", "acme/tiny-llama", tiny_llama)
    r = resolve_in_subprocess("acme/tiny-llama", tmp_path / "hub")
    assert r.returncode == 0, r.stderr[-2000:]
    path, layers = r.stdout.split()
    assert Path(path) == snapshot and int(layers) == 2


def test_offline_a_model_not_in_the_cache_is_not_found(tmp_path):
    (tmp_path / "hub").mkdir()
    r = resolve_in_subprocess("acme/not-cached", tmp_path / "hub")
    assert r.returncode != 0 and "not found" in r.stderr and "HF_HUB_OFFLINE" in r.stderr


def test_a_model_not_in_the_cache_is_downloaded_with_only_the_files_the_engine_reads(tiny_llama, monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    from minisgl.models.resolve import resolve_model

    calls = []

    def fake_snapshot_download(repo_id, allow_patterns=None, local_files_only=False, **kw):
        calls.append(dict(repo_id=repo_id, allow_patterns=allow_patterns, local_files_only=local_files_only))
        if local_files_only:
            raise LocalEntryNotFoundError("not in the cache")
        return str(tiny_llama)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    path, cfg = resolve_model("acme/tiny-llama")
    assert path == tiny_llama and cfg.num_layers == 2
    assert [c["local_files_only"] for c in calls] == [True, False], "the cache first, then the download"
    patterns = calls[1]["allow_patterns"]
    assert "*.safetensors" in patterns and "config.json" in patterns and "tokenizer.json" in patterns
    assert not any(p.endswith((".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")) for p in patterns)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    calls.clear()
    with pytest.raises(ValueError, match="not found"):
        resolve_model("acme/tiny-llama")
    assert [c["local_files_only"] for c in calls] == [True], "offline: no download"


def test_paths_and_bare_names_never_reach_the_hub(monkeypatch):
    import huggingface_hub

    from minisgl.models.resolve import resolve_model

    def fail(*a, **kw):
        raise AssertionError("a path or a bare name went to the hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
    for name in ("/no/such/model", "./relative/missing", "Qwen3-0.6B"):
        with pytest.raises(ValueError, match="not found"):
            resolve_model(name)
