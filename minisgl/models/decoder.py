"""One decoder for Llama-3.x and Qwen3 (dense). The only architectural difference, Qwen3's
per-head RMSNorm of q and k before rotary, is a config flag (``ModelConfig.qk_norm``).

Activations are flat: ``[num_tokens, hidden]`` for all requests of a batch back to back; the
attention backend knows where each request starts (``Batch.attn_metadata``).
Module and parameter names follow HF's, except the fused ``qkv_proj`` and ``gate_up_proj``.
"""

from __future__ import annotations

import torch
from torch import nn

from minisgl.layers import AttentionLayer, LayerImpls, RMSNorm, RotaryEmbedding
from minisgl.models import cpu_decode
from minisgl.models.config import ModelConfig


class DecoderAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, rotary: RotaryEmbedding, impls: LayerImpls):
        super().__init__()
        self.qkv_proj = impls.tp.qkv(cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.attention_bias)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_local_heads, self.qkv_proj.num_local_kv_heads
        self.head_dim = cfg.head_dim
        self.o_proj = impls.tp.row(cfg.num_heads * cfg.head_dim, cfg.hidden_size, cfg.attention_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, impls.norm)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, impls.norm)
        self.qk_norm = cfg.qk_norm
        self.rotary = [rotary]  # a list, so the shared table is not registered once per layer
        self.attn = AttentionLayer(layer_id, self.num_heads, self.num_kv_heads, cfg.head_dim)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        norms = (self.q_norm, self.k_norm) if self.qk_norm else ()
        q, k, v = self.rotary[0].rotate_qkv(positions, qkv, self.num_heads, self.num_kv_heads, *norms)
        o = self.attn(q, k, v)
        return self.o_proj(o.reshape(-1, self.num_heads * self.head_dim))


class DecoderMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, impls: LayerImpls):
        super().__init__()
        inter = cfg.intermediate_size
        self.gate_up_proj = impls.tp.merged_column(cfg.hidden_size, [inter, inter], cfg.mlp_bias)
        self.down_proj = impls.tp.row(inter, cfg.hidden_size, cfg.mlp_bias)
        self.act = impls.activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, rotary: RotaryEmbedding, impls: LayerImpls):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, impls.norm)
        self.self_attn = DecoderAttention(cfg, layer_id, rotary, impls)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, impls.norm)
        self.mlp = DecoderMLP(cfg, impls)

    def forward(self, positions, x, residual):
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, impls: LayerImpls):
        super().__init__()
        self.embed_tokens = impls.tp.embedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position, cfg.rope_theta, cfg.rope_scaling, impls.rotary)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, self.rotary, impls) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, impls.norm)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        fused = cpu_decode.run_layers(self, positions, x)  # a CPU decode step: each layer one C++ call
        if fused is not None:
            x, residual = fused
        for layer in self.layers if fused is None else ():
            x, residual = layer(positions, x, residual)
        x, _ = self.norm(x, residual)
        return x


class DecoderForCausalLM(nn.Module):
    """``impls``: which norm, rotary, activation and tensor-parallel layers to build with (default:
    the engine's own)."""

    def __init__(self, cfg: ModelConfig, impls: LayerImpls | None = None):
        super().__init__()
        impls = impls if impls is not None else LayerImpls()
        self.config = cfg
        self.model = DecoderModel(cfg, impls)
        tie = self.model.embed_tokens if cfg.tie_word_embeddings else None
        self.lm_head = impls.tp.lm_head(cfg.vocab_size, cfg.hidden_size, tie_to=tie)

    @classmethod
    def build(
        cls, cfg: ModelConfig, impls: LayerImpls | None, dtype: torch.dtype, device: torch.device
    ) -> DecoderForCausalLM:
        """The model with its parameters made in ``dtype`` on ``device`` (no weights loaded yet); torch's
        default dtype is restored after, whatever happens."""
        prev = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                return cls(cfg, impls)
        finally:
            torch.set_default_dtype(prev)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, logit_idx: torch.Tensor) -> torch.Tensor:
        """Logits ``[len(logit_idx), vocab]`` (the model's dtype) for the rows ``logit_idx`` of the batch
        (the last token of each request: the only ones a sampler needs)."""
        hidden = self.model(input_ids, positions)
        return self.lm_head(hidden[logit_idx])
