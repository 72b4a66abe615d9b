"""The attention-backend interface.

A backend is created once per engine with the KV pool and the request table, whose device tensor
``table.page_table[row, position] -> KV slot`` maps every running request's positions to slots
(``row`` = ``Req.table_idx``; ``minisgl/kvcache/table.py``).

Per batch the engine calls ``prepare_metadata(batch)`` once; every layer then calls
``forward(q, k, v, layer_id, batch)``, which must

1. store the new ``k``/``v`` (``[num_tokens, kv_heads, head_dim]``) at slots ``batch.out_loc``, and
2. return causal attention of ``q`` (``[num_tokens, heads, head_dim]``) over positions
   ``[0, ends[i])`` of each request ``i`` — the cached prefix plus the tokens of this pass —
   as ``[num_tokens, heads * head_dim]``.

Tokens of request ``i`` in the flat batch sit at positions ``starts[i] .. ends[i]-1`` and come in
request order. Backends that support CUDA graphs also implement the three graph hooks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from minisgl.core import Batch
from minisgl.kvcache.pool import KVPool
from minisgl.kvcache.table import ReqTable


class AttentionBackend(ABC):
    name: str = "base"
    supports_cuda_graph: bool = False

    def __init__(self, pool: KVPool, table: ReqTable, num_heads: int, head_dim: int):
        self.pool, self.table, self.page_table = pool, table, table.page_table
        self.num_heads, self.head_dim = num_heads, head_dim
        self.num_kv_heads = pool.num_kv_heads
        self.scale = head_dim**-0.5

    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None:
        """Build ``batch.attn_metadata`` (index tensors, kernel plans). Runs once per batch."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch):
        """Store k/v of the new tokens, then attend; see the module docstring."""

    # ---- CUDA graphs (decode only) ----
    def init_cuda_graph(self, max_bs: int) -> None:
        raise NotImplementedError(f"the {self.name} backend does not support CUDA graphs")

    def prepare_for_capture(self, batch: Batch) -> None:
        raise NotImplementedError

    def prepare_for_replay(self, batch: Batch) -> None:
        raise NotImplementedError
