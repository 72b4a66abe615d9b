"""CUDA graphs for decode batches.

A decode step of a small model is hundreds of tiny kernels; launching them one by one costs more
than running them. A CUDA graph records the launches once per batch size and replays them with one
call. Everything the graph reads must live at fixed addresses, so inputs are copied into static
buffers and the batch is padded up to the next captured size with dummy requests that write their
KV into the pool's scratch page::

    static rows   0 .. n-1            n .. bs-1                 bs .. max_bs-1
    out_loc       the batch's slots | scratch slot            | (not read by the graph of bs)
    table_idx     the batch's rows  | dummy row (-> scratch)  |

Which sizes to capture, the bucket of a batch and the padding are a ``GraphPlan`` (lab 09's seam,
``GRAPH_PLANS``; ``components={"graph_plan": name}``). The default: sizes 1, 2, 4, 8, 16, then every
16 up to ``cuda_graph_max_bs``; captured largest first so smaller graphs reuse the memory pool of the
largest.
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from minisgl.attention import AttentionBackend
from minisgl.attention.context import forward_context
from minisgl.core import Batch
from minisgl.kvcache import KVPool, ReqTable
from minisgl.registry import Registry

logger = logging.getLogger(__name__)


def graph_batch_sizes(max_bs: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s < max_bs] + list(range(16, max_bs + 1, 16))
    if not sizes or sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sorted(set(sizes))


class GraphInputs(NamedTuple):
    """What a captured decode graph reads, one entry per row: in the ``GraphRunner`` these are its
    static ``[max_bs]`` buffers (fixed addresses: a replay sees only what was copied *into* them); for
    a batch, its own ``[n]`` tensors."""

    input_ids: torch.Tensor  # int32: the token each row feeds
    positions: torch.Tensor  # int64: its position
    out_loc: torch.Tensor  # int64: the KV slot its new K/V is written to
    table_idx: torch.Tensor  # int64: its request-table row (attention reads the row's slots)


class GraphPlan(ABC):
    """Lab 09's seam, registered in ``GRAPH_PLANS``: which batch sizes get a graph, which graph runs
    a batch, and how a batch is padded up to it."""

    @abstractmethod
    def sizes(self, max_bs: int, budget: float, cost: Callable[[int], float]) -> list[int]:
        """The batch sizes to capture, ascending, distinct, in ``[1, max_bs]``. ``max_bs`` is always
        the last one (every decode batch the engine sends fits some graph), and the sizes' ``cost``
        together stay within ``budget`` (``cost(bs)``: the bytes a graph of ``bs`` rows keeps; with
        ``budget = inf`` every size the plan wants). ``[]`` when even ``max_bs`` alone does not fit
        (no graphs: every batch runs eagerly)."""

    @abstractmethod
    def bucket(self, n: int, sizes: list[int]) -> int:
        """The graph that runs a batch of ``n`` requests: the smallest of ``sizes`` (ascending) that
        is ``>= n``. ``ValueError`` when ``n > sizes[-1]`` (no graph holds it)."""

    @abstractmethod
    def pad(self, static: GraphInputs, batch: GraphInputs, bs: int, scratch_slot: int, dummy_row: int) -> None:
        """Fill rows ``[0, bs)`` of the ``static`` buffers, in place (a graph reads their addresses),
        for a batch of ``n = len(batch.input_ids) <= bs`` rows: rows ``[0, n)`` are the batch's own;
        the padding rows ``[n, bs)`` write only the scratch page: ``out_loc`` is ``scratch_slot`` and
        ``table_idx`` is ``dummy_row`` (the row that points at the scratch page). A padding row's token
        id and position may be any valid ones (whatever an earlier batch left there). Rows from ``bs``
        on are not read by the graph of ``bs``."""


class BucketPlan(GraphPlan):
    """1, 2, 4, 8, then every 16 up to ``max_bs`` (and ``max_bs``). Under a budget, ``max_bs`` comes
    first, then the others from the smallest up, each if it still fits: a small batch is where launch
    overhead is the largest share of a step, and its graph costs the least."""

    def sizes(self, max_bs: int, budget: float, cost: Callable[[int], float]) -> list[int]:
        if budget == math.inf:
            return graph_batch_sizes(max_bs)
        if cost(max_bs) > budget:
            return []
        chosen, spent = [max_bs], cost(max_bs)
        for bs in graph_batch_sizes(max_bs)[:-1]:
            if spent + cost(bs) <= budget:
                chosen.append(bs)
                spent += cost(bs)
        return sorted(chosen)

    def bucket(self, n: int, sizes: list[int]) -> int:
        if n > sizes[-1]:
            raise ValueError(f"a batch of {n} is larger than the largest graph ({sizes[-1]})")
        return sizes[bisect.bisect_left(sizes, n)]

    def pad(self, static: GraphInputs, batch: GraphInputs, bs: int, scratch_slot: int, dummy_row: int) -> None:
        n = len(batch.input_ids)
        static.input_ids[:n].copy_(batch.input_ids)
        static.positions[:n].copy_(batch.positions)
        static.out_loc[:n].copy_(batch.out_loc)
        static.table_idx[:n].copy_(batch.table_idx[:n])
        if bs > n:
            static.out_loc[n:bs].fill_(scratch_slot)  # padding writes only the scratch page
            static.table_idx[n:bs].fill_(dummy_row)


GRAPH_PLANS: Registry[type[GraphPlan]] = Registry("CUDA-graph plan", {"default": BucketPlan})


def capture_sizes(
    max_bs: int | None,
    device: torch.device,
    max_running: int,
    backend: AttentionBackend,
    plan: GraphPlan,
    cost: Callable[[int], float],
) -> list[int] | None:
    """The batch sizes to capture (``plan.sizes`` without a memory budget), or None for no graphs.
    ``max_bs=None``: by the GPU's memory."""
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
    return plan.sizes(max_bs, math.inf, cost) or None


class GraphRunner:
    def __init__(
        self,
        model: nn.Module,
        backend: AttentionBackend,
        pool: KVPool,
        table: ReqTable,
        sizes: list[int],
        plan: GraphPlan | None = None,
    ):
        self.model, self.backend, self.sizes = model, backend, sizes
        self.plan = plan or BucketPlan()
        self.max_bs = sizes[-1]
        dev = table.page_table.device
        self.scratch, self.dummy_row = pool.scratch_slot, table.dummy_row
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int32, device=dev)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.out_loc = torch.full((self.max_bs,), self.scratch, dtype=torch.int64, device=dev)
        self.logit_idx = torch.arange(self.max_bs, device=dev)
        table.point_dummy_row_at(self.scratch)
        self.table_idx = torch.full((self.max_bs,), table.dummy_row, dtype=torch.int64, device=dev)
        self.static = GraphInputs(self.input_ids, self.positions, self.out_loc, self.table_idx)
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
        bs = self.plan.bucket(n, self.sizes)
        inputs = GraphInputs(batch.input_ids, batch.positions, batch.out_loc, batch.table_idx)
        self.plan.pad(self.static, inputs, bs, self.scratch, self.dummy_row)
        batch.padded_size = bs
        self.backend.prepare_for_replay(batch)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
