"""CUDA graphs for decode batches.

A decode step of a small model is hundreds of tiny kernels; launching them one by one costs more
than running them. A CUDA graph records the launches once per batch size and replays them with one
call. Everything the graph reads must live at fixed addresses, so inputs are copied into static
buffers and the batch is padded up to the next captured size with dummy requests that write their
KV into the pool's scratch page.

Sizes 1, 2, 4, 8, 16, then every 16 up to ``cuda_graph_max_bs``; captured largest first so smaller
graphs reuse the memory pool of the largest.
"""

from __future__ import annotations

import bisect
import logging
import time

import torch
from torch import nn

from minisgl.attention import AttentionBackend
from minisgl.attention.context import forward_context
from minisgl.core import Batch
from minisgl.kvcache import KVPool, ReqTable

logger = logging.getLogger(__name__)


def graph_batch_sizes(max_bs: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s < max_bs] + list(range(16, max_bs + 1, 16))
    if not sizes or sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sorted(set(sizes))


def capture_sizes(
    max_bs: int | None, device: torch.device, max_running: int, backend: AttentionBackend
) -> list[int] | None:
    """The batch sizes to capture, or None for no graphs. ``max_bs=None``: by the GPU's memory."""
    if max_bs is None:
        total = torch.cuda.get_device_properties(device).total_memory
        max_bs = 256 if total >= 60 << 30 else 128 if total >= 20 << 30 else 64
    max_bs = min(max_bs, max_running)
    if max_bs <= 0:
        logger.info("CUDA graphs: off")
        return None
    if not backend.supports_cuda_graph:
        logger.info("CUDA graphs: off (the %s attention backend does not support them)", backend.name)
        return None
    return graph_batch_sizes(max_bs)


class GraphRunner:
    def __init__(self, model: nn.Module, backend: AttentionBackend, pool: KVPool, table: ReqTable, sizes: list[int]):
        self.model, self.backend, self.sizes = model, backend, sizes
        self.max_bs = sizes[-1]
        dev = table.page_table.device
        self.scratch = pool.scratch_slot
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int32, device=dev)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.out_loc = torch.full((self.max_bs,), self.scratch, dtype=torch.int64, device=dev)
        self.logit_idx = torch.arange(self.max_bs, device=dev)
        table.point_dummy_row_at(self.scratch)
        self.table_idx = torch.full((self.max_bs,), table.dummy_row, dtype=torch.int64, device=dev)
        backend.init_cuda_graph(self.max_bs)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        t = time.perf_counter()
        mem = None
        with torch.inference_mode():
            for bs in reversed(sizes):
                batch = self._static_batch(bs)
                backend.prepare_for_capture(batch)
                with forward_context(batch, backend):
                    if mem is None:  # one eager pass first: lazy inits and JIT compiles happen outside capture
                        self._run(bs)
                        torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=mem):
                        self.outputs[bs] = self._run(bs)
                mem = graph.pool()
                self.graphs[bs] = graph
        torch.cuda.synchronize()
        logger.info(
            "CUDA graphs: captured %d batch sizes up to %d in %.1f s", len(sizes), self.max_bs, time.perf_counter() - t
        )

    def _static_batch(self, bs: int) -> Batch:
        """A batch of ``bs`` dummy requests over the static buffers (what the graph records)."""
        batch = Batch([], "decode", padded_size=bs)
        batch.input_ids, batch.positions, batch.out_loc = self.input_ids[:bs], self.positions[:bs], self.out_loc[:bs]
        batch.logit_idx, batch.table_idx = self.logit_idx[:bs], self.table_idx[:bs]
        return batch

    def _run(self, bs: int) -> torch.Tensor:
        return self.model(self.input_ids[:bs], self.positions[:bs], self.logit_idx[:bs])

    def can_run(self, batch: Batch) -> bool:
        return batch.is_decode and batch.size <= self.max_bs

    def replay(self, batch: Batch) -> torch.Tensor:
        """Logits ``[batch.size, vocab]`` of a decode batch, through the smallest graph that fits."""
        n = batch.size
        bs = self.sizes[bisect.bisect_left(self.sizes, n)]
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        self.out_loc[:n].copy_(batch.out_loc)
        if bs > n:
            self.out_loc[n:bs].fill_(self.scratch)  # padding writes only the scratch page
        batch.padded_size = bs
        self.backend.prepare_for_replay(batch)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
