"""The building blocks of the decoder, each aware of tensor parallelism (identity at tp=1).

The parts the course swaps are registered by name: the norm, rotary and activation math
(``NORMS``, ``ROTARIES``, ``ACTIVATIONS``) and the set of tensor-parallel layers (``TP_LAYERS``).
:class:`LayerImpls` is one choice of each, which the decoder is built from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minisgl.layers.activation import ACTIVATIONS, ActivationFn, silu_and_mul
from minisgl.layers.attention import AttentionLayer
from minisgl.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from minisgl.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from minisgl.layers.norm import NORMS, NormFn, RMSNorm, rms_norm
from minisgl.layers.rotary import ROTARIES, RopeScaling, RotaryEmbedding, RotaryImpl, apply_rotary, rope_inv_freq
from minisgl.registry import Registry


@dataclass(frozen=True)
class TPLayers:
    """The tensor-parallel layer classes a decoder is made of (lab 10's seam). Each takes the
    constructor arguments of the engine's class it replaces and keeps its parameter names and
    ``weight_loader``s, so checkpoints load into it unchanged."""

    qkv: type = QKVParallelLinear  # column-parallel, split by heads (KV heads replicated past their number)
    merged_column: type = MergedColumnParallelLinear  # column-parallel [gate | up]
    row: type = RowParallelLinear  # row-parallel + all-reduce (o_proj, down_proj)
    embedding: type = VocabParallelEmbedding
    lm_head: type = ParallelLMHead


TP_LAYERS: Registry[TPLayers] = Registry("tensor-parallel layer set", {"default": TPLayers()})


@dataclass(frozen=True)
class LayerImpls:
    """Which implementation of each swappable part a decoder is built with."""

    norm: NormFn = rms_norm
    rotary: RotaryImpl = field(default_factory=lambda: ROTARIES.get("default"))
    activation: ActivationFn = silu_and_mul
    tp: TPLayers = field(default_factory=lambda: TP_LAYERS.get("default"))

    @classmethod
    def by_name(
        cls, norm: str = "default", rotary: str = "default", activation: str = "default", tp_layers: str = "default"
    ) -> LayerImpls:
        return cls(NORMS.get(norm), ROTARIES.get(rotary), ACTIVATIONS.get(activation), TP_LAYERS.get(tp_layers))


__all__ = [
    "ACTIVATIONS",
    "AttentionLayer",
    "LayerImpls",
    "MergedColumnParallelLinear",
    "NORMS",
    "ParallelLMHead",
    "QKVParallelLinear",
    "RMSNorm",
    "ROTARIES",
    "RopeScaling",
    "RotaryEmbedding",
    "RotaryImpl",
    "RowParallelLinear",
    "TPLayers",
    "TP_LAYERS",
    "VocabParallelEmbedding",
    "apply_rotary",
    "rms_norm",
    "rope_inv_freq",
    "silu_and_mul",
]
