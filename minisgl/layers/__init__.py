"""The building blocks of the decoder, each aware of tensor parallelism (identity at tp=1)."""

from minisgl.layers.activation import silu_and_mul
from minisgl.layers.attention import AttentionLayer
from minisgl.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from minisgl.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from minisgl.layers.norm import RMSNorm
from minisgl.layers.rotary import RotaryEmbedding

__all__ = [
    "AttentionLayer",
    "MergedColumnParallelLinear",
    "ParallelLMHead",
    "QKVParallelLinear",
    "RMSNorm",
    "RotaryEmbedding",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "silu_and_mul",
]
