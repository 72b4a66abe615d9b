"""``ModelConfig``: the few numbers of an HF ``config.json`` that the decoder needs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from minisgl.layers.rotary import RopeScaling

SUPPORTED_ARCHS = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3"}


@dataclass(frozen=True)
class ModelConfig:
    model_type: str  # "llama" | "qwen3": the only difference is per-head q/k RMSNorm
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position: int
    tie_word_embeddings: bool
    rope_scaling: RopeScaling | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @property
    def qk_norm(self) -> bool:
        return self.model_type == "qwen3"

    def check_tp_size(self, tp: int) -> None:
        """Refuse head counts that do not split over ``tp`` ranks, naming sizes that work. KV heads
        split when ``tp`` divides them, and are replicated when their number divides ``tp``."""
        splits = lambda n: (
            self.num_heads % n == 0
            and (self.num_kv_heads % n == 0 if n <= self.num_kv_heads else n % self.num_kv_heads == 0)
        )
        if not splits(tp):
            good = [n for n in range(1, self.num_heads + 1) if splits(n)]
            raise ValueError(
                f"tp_size={tp} does not divide this model's {self.num_heads} attention heads / "
                f"{self.num_kv_heads} KV heads; tensor-parallel sizes that work: {good}"
            )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        arch = (d.get("architectures") or [None])[0]
        model_type = d.get("model_type") or SUPPORTED_ARCHS.get(arch or "")
        if model_type not in ("llama", "qwen3"):
            raise ValueError(
                f"unsupported model type {model_type!r} (architectures={d.get('architectures')}); "
                "minisgl runs Llama-3.x and Qwen3 dense models"
            )
        # transformers >= 5 stores rope settings under "rope_parameters", older ones at top level
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        scaling = None
        if rope_type == "llama3":
            scaling = RopeScaling(
                factor=float(rope["factor"]),
                low_freq_factor=float(rope["low_freq_factor"]),
                high_freq_factor=float(rope["high_freq_factor"]),
                original_max_position=int(rope["original_max_position_embeddings"]),
            )
        elif rope_type not in ("default", None):
            raise ValueError(f"unsupported rope_type {rope_type!r}; supported: default, llama3")
        heads = d["num_attention_heads"]
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        return cls(
            model_type=model_type,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            max_position=d.get("max_position_embeddings", 4096),
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            rope_scaling=scaling,
            attention_bias=d.get("attention_bias", False),
            mlp_bias=d.get("mlp_bias", False),
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_path(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        cfg = cls.from_dict(json.loads((path / "config.json").read_text()))
        gen = path / "generation_config.json"
        if gen.exists():  # generation_config's eos list is the authoritative one (e.g. Llama-3 chat)
            eos = json.loads(gen.read_text()).get("eos_token_id")
            if eos is not None:
                extra = tuple(eos) if isinstance(eos, list) else (eos,)
                cfg = replace(cfg, eos_token_ids=tuple(dict.fromkeys(cfg.eos_token_ids + extra)))
        return cfg


# Published config.json values of real architectures, for --dummy-weight benchmarks (no download).
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen3-0.6B": dict(
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
        eos_token_id=151645,
    ),
    "Qwen3-14B": dict(
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        vocab_size=151936,
        hidden_size=5120,
        intermediate_size=17408,
        num_hidden_layers=40,
        num_attention_heads=40,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        eos_token_id=151645,
    ),
    "Qwen3-32B": dict(
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        vocab_size=151936,
        hidden_size=5120,
        intermediate_size=25600,
        num_hidden_layers=64,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        eos_token_id=151645,
    ),
    "Llama-3.1-8B": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-5,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        rope_theta=500000.0,
        eos_token_id=[128001, 128008, 128009],
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
    ),
}
