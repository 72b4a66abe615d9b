from __future__ import annotations

from minisgl.attention.base import AttentionBackend
from minisgl.core import Batch


class HybridBackend(AttentionBackend):
    """One backend for prefill batches, another for decode batches (e.g. ``fa3,fi``)."""

    def __init__(self, prefill: AttentionBackend, decode: AttentionBackend):
        self.prefill, self.decode = prefill, decode
        self.name = f"{prefill.name},{decode.name}"
        self.supports_cuda_graph = decode.supports_cuda_graph
        self.pool, self.table, self.page_table = decode.pool, decode.table, decode.page_table

    def _pick(self, batch: Batch) -> AttentionBackend:
        return self.prefill if batch.is_prefill else self.decode

    def prepare_metadata(self, batch: Batch) -> None:
        self._pick(batch).prepare_metadata(batch)

    def forward(self, q, k, v, layer_id: int, batch: Batch):
        return self._pick(batch).forward(q, k, v, layer_id, batch)

    def init_cuda_graph(self, max_bs: int) -> None:
        self.decode.init_cuda_graph(max_bs)

    def prepare_for_capture(self, batch: Batch) -> None:
        self.decode.prepare_for_capture(batch)

    def prepare_for_replay(self, batch: Batch) -> None:
        self.decode.prepare_for_replay(batch)
