"""CUDA graphs for decode batches.

A decode step of a small model is hundreds of tiny kernels; launching them one by one costs more
than running them. A CUDA graph records the launches once per batch size and replays them with one
call. Everything the graph reads must live at fixed addresses, so inputs are copied into static
buffers and the batch is padded up to the next captured size with dummy requests that write their
KV into the pool's scratch page::

    static rows   0 .. n-1            n .. bs-1                 bs .. max_bs-1
    out_loc       the batch's slots | scratch slot            | (not read by the graph of bs)
    table_idx     the batch's rows  | dummy row (-> scratch)  |

Which sizes to capture, in which order and pool, which batches run in a graph, a batch's bucket,
its padding and the slice of the output are a ``GraphPlan`` (lab 09's seam, ``GRAPH_PLANS``;
``components={"graph_plan": name}``); ``GraphRunner`` owns the buffers and the CUDA calls. The
default: sizes 1, 2, 4, 8, 16, then every 16 up to ``cuda_graph_max_bs``; captured largest first so
smaller graphs reuse the memory pool of the largest.
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

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


class CapturedGraph(Protocol):
    """What ``capture_one`` returns beside the output: ``torch.cuda.CUDAGraph`` on a GPU, a simulated
    graph on CPU (``autograder/graph_sim.py``)."""

    def replay(self) -> None: ...

    def pool(self) -> Any: ...


# (bs, pool) -> (graph, output): records the decode forward over rows [0, bs) of the static buffers in
# `pool` (None: a new pool); `output` is the [bs, vocab] logits tensor every replay of the graph rewrites
CaptureFn = Callable[[int, Any], tuple[CapturedGraph, torch.Tensor]]


@dataclass
class GraphState:
    """What a graph runner keeps between capture and replays. ``static`` is ``[max_bs]`` buffers at
    fixed addresses: every graph reads rows ``[0, bs)`` of exactly these tensors, whatever they hold at
    replay time, so a replay must write *into* them."""

    sizes: list[int]  # the sizes to capture, ascending (GraphPlan.sizes)
    static: GraphInputs
    scratch_slot: int  # a slot of the pool's scratch page: no request ever owns it
    dummy_row: int  # the request-table row that maps every position to the scratch page
    graphs: dict[int, CapturedGraph] = field(default_factory=dict)  # bs -> its graph
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)  # bs -> the logits its replays write


class GraphPlan(ABC):
    """Lab 09's seam, registered in ``GRAPH_PLANS``: which batch sizes get a graph, how they are
    captured, which batches run in one, and the replay's bookkeeping (bucket, padding, outputs)."""

    @abstractmethod
    def sizes(self, max_bs: int, budget: float, cost: Callable[[int], float]) -> list[int]:
        """The batch sizes to capture, ascending, distinct, in ``[1, max_bs]``. ``max_bs`` is always
        the last one (every decode batch the engine sends fits some graph), and the sizes' ``cost``
        together stay within ``budget`` (``cost(bs)``: the bytes a graph of ``bs`` rows keeps; with
        ``budget = inf`` every size the plan wants). ``[]`` when even ``max_bs`` alone does not fit
        (no graphs: every batch runs eagerly)."""

    @abstractmethod
    def capture(self, state: GraphState, capture_one: CaptureFn) -> None:
        """Capture one graph per size of ``state.sizes`` into ``state.graphs`` / ``state.outputs``,
        largest first and all in one memory pool: the first call ``capture_one(max_bs, None)`` makes
        the pool, every later one passes that graph's ``pool()``, so a smaller graph reuses the blocks
        of the largest instead of adding its own."""

    @abstractmethod
    def use_graph(self, phase: str, n: int, sizes: list[int]) -> bool:
        """Whether a batch of ``n`` requests in ``phase`` (``"decode"``, or ``"prefill"``, which a
        mixed batch is too) runs in a graph: only a decode batch that some captured size holds
        (``1 <= n <= sizes[-1]``); ``False`` with no graphs (``sizes == []``)."""

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

    @abstractmethod
    def replay(self, state: GraphState, batch: GraphInputs, prepare: Callable[[int], None]) -> torch.Tensor:
        """The logits ``[n, vocab]`` of a decode batch of ``n`` rows: its bucket ``bs``, the batch padded
        into ``state.static``, ``prepare(bs)`` (the attention metadata for ``bs`` rows) before the
        graph of ``bs`` replays, then the first ``n`` rows of that graph's output (a view: the next
        replay overwrites it)."""


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

    def capture(self, state: GraphState, capture_one: CaptureFn) -> None:
        pool = None
        for bs in reversed(state.sizes):  # largest first: the pool grows once, to the largest graph
            graph, out = capture_one(bs, pool)
            state.graphs[bs], state.outputs[bs] = graph, out
            pool = graph.pool() if pool is None else pool

    def use_graph(self, phase: str, n: int, sizes: list[int]) -> bool:
        return phase == "decode" and bool(sizes) and 1 <= n <= sizes[-1]

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

    def replay(self, state: GraphState, batch: GraphInputs, prepare: Callable[[int], None]) -> torch.Tensor:
        n = len(batch.input_ids)
        bs = self.bucket(n, state.sizes)
        self.pad(state.static, batch, bs, state.scratch_slot, state.dummy_row)
        prepare(bs)
        state.graphs[bs].replay()
        return state.outputs[bs][:n]  # rows [n, bs) are the padding's logits


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
    """CUDA graphs of a decode forward, one per captured size, run through a ``GraphPlan``: the runner
    owns the static buffers and the CUDA calls; the plan, the bookkeeping."""

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
        table.point_dummy_row_at(pool.scratch_slot)
        static = GraphInputs(
            torch.zeros(self.max_bs, dtype=torch.int32, device=dev),
            torch.zeros(self.max_bs, dtype=torch.int64, device=dev),
            torch.full((self.max_bs,), pool.scratch_slot, dtype=torch.int64, device=dev),
            torch.full((self.max_bs,), table.dummy_row, dtype=torch.int64, device=dev),
        )
        self.logit_idx = torch.arange(self.max_bs, device=dev)
        self.state = GraphState(sizes, static, pool.scratch_slot, table.dummy_row)
        self.graphs = self.state.graphs  # Engine.shutdown clears it before NCCL goes
        backend.init_cuda_graph(self.max_bs)
        t = time.perf_counter()
        with torch.inference_mode():
            self.plan.capture(self.state, self._capture_one)
        torch.cuda.synchronize()
        missing = sorted(set(sizes) - set(self.graphs))
        if missing:
            raise RuntimeError(f"the graph plan captured no graph of sizes {missing}")
        logger.info(
            "CUDA graphs: captured %d batch sizes up to %d in %.1f s", len(sizes), self.max_bs, time.perf_counter() - t
        )

    def _static_batch(self, bs: int) -> Batch:
        """A batch of ``bs`` dummy requests over the static buffers (what the graph records)."""
        batch = Batch([], "decode", padded_size=bs)
        batch.input_ids, batch.positions, batch.out_loc, batch.table_idx = (t[:bs] for t in self.state.static)
        batch.logit_idx = self.logit_idx[:bs]
        return batch

    def _capture_one(self, bs: int, mem: Any) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        static = self.state.static
        batch = self._static_batch(bs)
        self.backend.prepare_for_capture(batch)
        with forward_context(batch, self.backend):
            if mem is None:  # one eager pass first: lazy inits and JIT compiles happen outside capture
                self.model(static.input_ids[:bs], static.positions[:bs], self.logit_idx[:bs])
                torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=mem):
                out = self.model(static.input_ids[:bs], static.positions[:bs], self.logit_idx[:bs])
        return graph, out

    def can_run(self, batch: Batch) -> bool:
        return self.plan.use_graph(batch.phase, batch.size, self.sizes)

    def replay(self, batch: Batch) -> torch.Tensor:
        """Logits ``[batch.size, vocab]`` of a decode batch, through the plan's bucket and padding."""

        def prepare(bs: int) -> None:
            batch.padded_size = bs
            self.backend.prepare_for_replay(batch)

        inputs = GraphInputs(batch.input_ids, batch.positions, batch.out_loc, batch.table_idx)
        return self.plan.replay(self.state, inputs, prepare)
