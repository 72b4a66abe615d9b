"""What a captured decode graph computes, run eagerly on CPU (lab 09's tests and lesson 09).

A CUDA graph of ``bs`` rows replays the model's decode forward over rows ``[0, bs)`` of the static
buffers, whatever they hold. ``decode_forward`` runs exactly that forward, eagerly, with the torch
attention backend: every row writes its K/V at its ``out_loc`` and attends to the slots of its
``table_idx`` row up to its position. So a padding mistake shows on a CPU as it would on a GPU: a
padding row that writes a real request's slot changes that request's KV.

* ``Bench``: a small engine's pieces (model, KV pool, request table, torch backend) and a decode
  state: ``n`` running requests with random contexts on random slots (slot 0 among them), random KV
  everywhere, and static buffers as an earlier, larger batch left them (its slots are real ones).
* ``SimCapture`` / ``SimGraph`` / ``SimPool``: a fake ``capture_one`` for ``GraphPlan.capture``. A
  simulated graph keeps the static tensors it was captured with and replays ``decode_forward`` over
  them, so a replay that did not copy its batch *into* those tensors computes on stale rows, as a CUDA
  graph would; pools count what the graphs cost (largest first in one pool: the largest's cost).
* ``SimGraphRunner``: the engine's ``GraphRunner`` with simulated graphs. Installed as an engine's
  ``graph_runner`` it runs every decode batch of a CPU engine through a plan's capture, ``use_graph``
  and replay.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from minisgl.attention.context import forward_context
from minisgl.core import Batch
from minisgl.engine.graph import GraphInputs, GraphPlan, GraphState

DTYPES = (torch.int32, torch.int64, torch.int64, torch.int64)  # of GraphInputs' four fields


@dataclass
class _Row:
    """A stand-in request: the torch backend reads only its table row."""

    table_idx: int


def decode_forward(engine, rows: GraphInputs) -> torch.Tensor:
    """The decode forward over every row of ``rows`` (eager, the engine's model and attention backend):
    logits ``[len(rows.input_ids), vocab]``; row ``i`` writes its K/V at ``out_loc[i]``."""
    pos = rows.positions.tolist()
    batch = Batch([_Row(int(r)) for r in rows.table_idx.tolist()], "decode", starts=pos, ends=[p + 1 for p in pos])
    batch.input_ids, batch.positions, batch.out_loc, batch.table_idx = rows
    batch.logit_idx = torch.arange(len(pos))
    with torch.inference_mode(), forward_context(batch, engine.attn_backend):
        engine.attn_backend.prepare_metadata(batch)
        return engine.model(batch.input_ids, batch.positions, batch.logit_idx)


def static_buffers(max_bs: int, scratch_slot: int, dummy_row: int, device="cpu") -> GraphInputs:
    """The runner's static buffers as the engine's GraphRunner creates them."""
    return GraphInputs(
        torch.zeros(max_bs, dtype=torch.int32, device=device),
        torch.zeros(max_bs, dtype=torch.int64, device=device),
        torch.full((max_bs,), scratch_slot, dtype=torch.int64, device=device),
        torch.full((max_bs,), dummy_row, dtype=torch.int64, device=device),
    )


class Bench:
    """A CPU engine's model (``None``: the embedded one), KV pool, request table and torch backend
    (``page_size`` tokens a page), for decode states built by hand."""

    def __init__(
        self, model: Path | None, page_size: int = 1, num_pages: int = 2048, rows: int = 48, dtype: str = "float32"
    ):
        from minisgl.engine import Engine, EngineConfig

        cfg = EngineConfig(
            model=None if model is None else str(model),
            device="cpu",
            dtype=dtype,
            attention_backend="torch",
            page_size=page_size,
            num_pages=num_pages // page_size,
            max_running_requests=rows,
            max_seq_len=256,
        )
        self.engine = Engine(cfg)
        self.pool, self.table = self.engine.kv_pool, self.engine.table
        self.scratch_slot, self.dummy_row = self.pool.scratch_slot, self.table.dummy_row
        self.vocab = self.engine.model_config.vocab_size
        self.table.point_dummy_row_at(self.scratch_slot)

    @property
    def scratch_slots(self) -> range:
        """The scratch page's slots (the pool's last page)."""
        return range(self.scratch_slot, self.scratch_slot + self.pool.page_size)

    def state(self, n: int, seed: int, stale_bs: int) -> tuple[GraphInputs, GraphInputs, dict[int, int]]:
        """``n`` decoding requests with random contexts (1 to 30 tokens) on random distinct slots, slot 0
        among them; random KV in the whole pool. Returns the batch (``[n]`` each), static buffers of
        ``max(stale_bs, n)`` rows as an earlier batch of ``stale_bs`` requests left them (tokens,
        positions, slots and rows of these requests' contexts), and ``{slot: request}`` of every slot
        the requests hold."""
        rng = random.Random(seed)
        gen = torch.Generator().manual_seed(seed)
        for row in list(getattr(self, "_rows", [])):
            self.table.free_row(row)
        self._rows = []
        self.pool.buffer.copy_(torch.randn(self.pool.buffer.shape, generator=gen))
        lengths = [rng.randint(1, 30) for _ in range(n)]
        free = list(range(1, self.pool.num_slots))
        rng.shuffle(free)
        owner: dict[int, int] = {}
        batch = [[], [], [], []]
        for i, length in enumerate(lengths):
            row = self.table.alloc_row()
            self._rows.append(row)
            # positions [0, length]: the context, then the new token at `length`
            slots = [free.pop() for _ in range(length + 1)]
            if i == 0:
                slots[0] = 0  # slot 0 holds a real request's KV
            self.table.set_slots(row, 0, torch.tensor(slots, dtype=torch.int64))
            owner.update({s: i for s in slots})
            for field, value in zip(batch, (rng.randrange(3, self.vocab), length, slots[length], row)):
                field.append(value)
        self.table.sync()
        rows = GraphInputs(*(torch.tensor(v, dtype=d) for v, d in zip(batch, DTYPES)))
        size = max(stale_bs, n)
        held = [s for s in owner if s != 0] or [0]
        stale = GraphInputs(
            torch.tensor([rng.randrange(3, self.vocab) for _ in range(size)], dtype=torch.int32),
            torch.tensor([rng.randint(0, 30) for _ in range(size)], dtype=torch.int64),
            torch.tensor([rng.choice(held) for _ in range(size)], dtype=torch.int64),
            torch.tensor([rng.choice(self._rows) for _ in range(size)], dtype=torch.int64),
        )
        return rows, stale, owner


class SimPool:
    """A simulated CUDA-graph memory pool. A graph captured into it reuses the blocks already there if
    it needs no more than the pool holds; a larger one adds its whole cost (its intermediates do not fit
    the blocks the smaller graphs left). So graphs captured largest first in one pool cost the largest
    one; smallest first, more (every graph larger than what the pool holds by then adds its own cost); each
    in its own pool, the sum."""

    def __init__(self):
        self.bytes, self.sizes = 0, []

    def add(self, bs: int, cost: float) -> None:
        self.sizes.append(bs)
        if cost > self.bytes:
            self.bytes += cost


class SimGraph:
    """A graph of ``bs`` rows: it holds the static tensors it was captured with (views of rows ``[0, bs)``)
    and its output, and a replay runs the decode forward over *those* tensors, as a CUDA graph reads the
    addresses it recorded, whatever the runner's names are bound to now."""

    def __init__(self, capture: SimCapture, bs: int, reads: GraphInputs, pool: SimPool):
        self._capture, self.bs, self.reads, self._pool = capture, bs, reads, pool
        self.output = torch.zeros(bs, capture.engine.model_config.vocab_size)
        self.replays = 0

    def pool(self) -> SimPool:
        return self._pool

    def replay(self) -> None:
        planned = self._capture.prepared
        if planned != self.bs:
            raise AssertionError(
                f"the graph of {self.bs} rows replayed with the attention metadata "
                + ("never prepared" if planned is None else f"prepared for {planned} rows")
                + f": call prepare({self.bs}) with the bucket before the graph's replay()"
            )
        self._capture.prepared = None
        self.replays += 1
        self.output.copy_(decode_forward(self._capture.engine, self.reads))


class SimCapture:
    """``capture_one`` for ``GraphPlan.capture`` on CPU: ``(bs, pool) -> (SimGraph, output)``. Records the
    order of the captures (``order``), the pools made (``pools``) and what they cost (``bytes``, with
    ``cost(bs)`` per graph); ``prepare`` is the ``prepare`` a replay gets."""

    def __init__(self, engine, state: GraphState, cost=lambda bs: bs):
        self.engine, self.state, self.cost = engine, state, cost
        self.order: list[int] = []
        self.pools: list[SimPool] = []
        self.prepared: int | None = None

    def __call__(self, bs: int, pool) -> tuple[SimGraph, torch.Tensor]:
        if not (isinstance(bs, int) and bs in self.state.sizes):
            raise AssertionError(f"capture_one({bs!r}, ...): not one of the sizes to capture {self.state.sizes}")
        if pool is None:
            pool = SimPool()
            self.pools.append(pool)
        elif not isinstance(pool, SimPool):
            raise AssertionError(f"capture_one({bs}, {pool!r}): the pool is None or an earlier graph's .pool()")
        self.order.append(bs)
        pool.add(bs, self.cost(bs))
        graph = SimGraph(self, bs, GraphInputs(*(t[:bs] for t in self.state.static)), pool)
        return graph, graph.output

    @property
    def bytes(self) -> float:
        return sum(p.bytes for p in self.pools)

    def prepare(self, bs: int) -> None:
        self.prepared = bs


class SimGraphRunner:
    """The engine's ``GraphRunner`` on CPU, simulated graphs in place of CUDA ones: the plan captures them
    (``plan.capture``), decides which batches run in one (``plan.use_graph``) and replays them
    (``plan.replay``). Installed as an engine's ``graph_runner`` it runs a CPU engine through a plan;
    ``replays`` records ``(n, bs)`` per replayed batch."""

    def __init__(self, engine, plan: GraphPlan, sizes: list[int]):
        self.engine, self.plan, self.sizes = engine, plan, sizes
        scratch, dummy = engine.kv_pool.scratch_slot, engine.table.dummy_row
        engine.table.point_dummy_row_at(scratch)
        self.state = GraphState(list(sizes), static_buffers(sizes[-1], scratch, dummy), scratch, dummy)
        self.capture = SimCapture(engine, self.state)
        plan.capture(self.state, self.capture)
        self.replays: list[tuple[int, int]] = []
        self.eager_decodes: list[int] = []  # sizes of decode batches use_graph sent to eager mode

    def can_run(self, batch: Batch) -> bool:
        yes = self.plan.use_graph(batch.phase, batch.size, list(self.sizes))
        if batch.is_decode and not yes:
            self.eager_decodes.append(batch.size)
        return yes

    def replay(self, batch: Batch) -> torch.Tensor:
        n = batch.size
        if not batch.is_decode:
            raise AssertionError(
                f"a {batch.phase} batch ({batch.num_tokens} tokens for {n} requests) was sent to a graph: a graph "
                "replays one decode token per row; use_graph must say False for anything but decode"
            )
        seen = {}

        def prepare(bs: int) -> None:
            seen["bs"] = bs
            batch.padded_size = bs
            self.capture.prepare(bs)

        inputs = GraphInputs(batch.input_ids, batch.positions, batch.out_loc, batch.table_idx)
        out = self.plan.replay(self.state, inputs, prepare)
        self.replays.append((n, seen.get("bs", -1)))
        return out
