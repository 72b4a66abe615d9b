"""What a captured decode graph computes, run eagerly on CPU (lab 09's tests and lesson 09).

A CUDA graph of ``bs`` rows replays the model's decode forward over rows ``[0, bs)`` of the static
buffers, whatever they hold. ``decode_forward`` runs exactly that forward, eagerly, with the torch
attention backend: every row writes its K/V at its ``out_loc`` and attends to the slots of its
``table_idx`` row up to its position. So a padding mistake shows on a CPU as it would on a GPU: a
padding row that writes a real request's slot changes that request's KV.

* ``Bench``: a small engine's pieces (model, KV pool, request table, torch backend) and a decode
  state: ``n`` running requests with random contexts on random slots (slot 0 among them), random KV
  everywhere, and static buffers as an earlier, larger batch left them (its slots are real ones).
* ``EagerGraphRunner``: the engine's ``GraphRunner.replay`` without the graph: a plan's bucket and
  padding into static buffers, then ``decode_forward`` over the bucket. Installed as an engine's
  ``graph_runner`` it runs every decode batch of a CPU engine through a plan.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from minisgl.attention.context import forward_context
from minisgl.core import Batch
from minisgl.engine.graph import GraphInputs, GraphPlan

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


class EagerGraphRunner:
    """``GraphRunner.replay`` on CPU: ``plan.bucket`` and ``plan.pad`` into static buffers, then the
    decode forward over the bucket's rows (what its graph would replay). ``replays`` records
    ``(n, bs)`` per decode batch."""

    def __init__(self, engine, plan: GraphPlan, sizes: list[int]):
        self.engine, self.plan, self.sizes, self.max_bs = engine, plan, sizes, sizes[-1]
        self.scratch, self.dummy_row = engine.kv_pool.scratch_slot, engine.table.dummy_row
        engine.table.point_dummy_row_at(self.scratch)
        self.static = static_buffers(self.max_bs, self.scratch, self.dummy_row)
        self.replays: list[tuple[int, int]] = []

    def can_run(self, batch: Batch) -> bool:
        return batch.is_decode and batch.size <= self.max_bs

    def replay(self, batch: Batch) -> torch.Tensor:
        n = batch.size
        bs = self.plan.bucket(n, self.sizes)
        self.replays.append((n, bs))
        if not (isinstance(bs, int) and n <= bs <= self.max_bs and bs in self.sizes):
            raise AssertionError(f"bucket({n}, {self.sizes}) returned {bs!r}: not a captured size >= {n}")
        inputs = GraphInputs(batch.input_ids, batch.positions, batch.out_loc, batch.table_idx)
        self.plan.pad(self.static, inputs, bs, self.scratch, self.dummy_row)
        batch.padded_size = bs
        return decode_forward(self.engine, GraphInputs(*(t[:bs] for t in self.static)))[:n]
