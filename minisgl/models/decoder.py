"""One decoder for Llama-3.x and Qwen3 (dense). The only architectural difference, Qwen3's
per-head RMSNorm of q and k before rotary, is a config flag (``ModelConfig.qk_norm``).

Activations are flat: ``[num_tokens, hidden]`` for all requests of a batch back to back; the
attention backend knows where each request starts (``Batch.attn_metadata``).
Module and parameter names follow HF's, except the fused ``qkv_proj`` and ``gate_up_proj``.
"""

from __future__ import annotations

import torch
from torch import nn

from minisgl.kernels import triton_ops
from minisgl.layers import (
    AttentionLayer,
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    VocabParallelEmbedding,
    silu_and_mul,
)
from minisgl.models.config import ModelConfig


class DecoderAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, rotary: RotaryEmbedding):
        super().__init__()
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.attention_bias
        )
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_local_heads, self.qkv_proj.num_local_kv_heads
        self.head_dim = cfg.head_dim
        self.o_proj = RowParallelLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, cfg.attention_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm
        self.rotary = [rotary]  # a list, so the shared table is not registered once per layer
        self.attn = AttentionLayer(layer_id, self.num_heads, self.num_kv_heads, cfg.head_dim)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split(self.qkv_proj.local_sizes, dim=-1)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        tri = triton_ops(qkv)
        if tri is not None and tri.can_fuse(self.head_dim):  # GPU: norms + rope in one kernel
            qw, kw = (self.q_norm.weight, self.k_norm.weight) if self.qk_norm else (None, None)
            eps = self.q_norm.eps if self.qk_norm else 0.0
            rot = self.rotary[0].cos_sin
            q, k = tri.qk_norm_rope(qkv, positions, rot, self.num_heads, self.num_kv_heads, self.head_dim, qw, kw, eps)
        else:
            q = q.view(-1, self.num_heads, self.head_dim)
            k = k.view(-1, self.num_kv_heads, self.head_dim)
            if self.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = self.rotary[0](positions, q, k)
        o = self.attn(q, k, v)
        return self.o_proj(o.reshape(-1, self.num_heads * self.head_dim))


class DecoderMLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        inter = cfg.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, [inter, inter], cfg.mlp_bias)
        self.down_proj = RowParallelLinear(inter, cfg.hidden_size, cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, rotary: RotaryEmbedding):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DecoderAttention(cfg, layer_id, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DecoderMLP(cfg)

    def forward(self, positions, x, residual):
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position, cfg.rope_theta, cfg.rope_scaling)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, self.rotary) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        x, _ = self.norm(x, residual)
        return x


class DecoderForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = DecoderModel(cfg)
        tie = self.model.embed_tokens if cfg.tie_word_embeddings else None
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tie_to=tie)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, logit_idx: torch.Tensor) -> torch.Tensor:
        """Logits ``[len(logit_idx), vocab]`` (the model's dtype) for the rows ``logit_idx`` of the batch
        (the last token of each request: the only ones a sampler needs)."""
        hidden = self.model(input_ids, positions)
        return self.lm_head(hidden[logit_idx])
