"""``triton``: paged attention in the project's own Triton kernels (``minisgl/kernels/triton_attention.py``,
lesson 16): split-KV decode (flash-decoding) with a merge pass, and a tiled causal prefill over the cached
prefix. Both read K/V in place through the page table, so every page size works. On a GPU the kernels
are compiled; on the CPU they run under Triton's interpreter (``TRITON_INTERPRET=1``, slow: tests only).

The decode kernel is a seam: ``DECODE_KERNELS`` holds it by name (``default``: the engine's), and
:func:`use_decode_kernel` picks another for the backends made inside it (lab 16 swaps in its own).

How many splits a decode batch takes (``triton_attention.num_splits``) depends on its size and the
longest request: enough programs to fill the GPU's multiprocessors, few enough that each split reads
at least four key blocks. A captured batch plans for the engine's longest sequence instead, so the
choice depends on the captured size alone and every replay launches the same grid.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from minisgl.attention.base import AttentionBackend
from minisgl.core import Batch
from minisgl.kvcache.pool import KVPool
from minisgl.kvcache.table import ReqTable
from minisgl.registry import Registry

DecodeKernel = Callable[..., torch.Tensor]
"""``decode(q, k_slots, v_slots, page_table, rows, lens, scale, splits, out=None, partial=None)``: see
``minisgl.kernels.triton_attention.decode``."""

DECODE_KERNELS: Registry[DecodeKernel] = Registry(
    "Triton decode kernel", {"default": "minisgl.kernels.triton_attention:decode"}
)
_CHOSEN = ["default"]


@contextmanager
def use_decode_kernel(name: str) -> Iterator[None]:
    """``triton`` backends made inside the block decode with ``DECODE_KERNELS[name]``."""
    DECODE_KERNELS.get(name)  # an unknown name fails here, not at the first decode step
    _CHOSEN.append(name)
    try:
        yield
    finally:
        _CHOSEN.pop()


@dataclass
class DecodeMetadata:
    rows: torch.Tensor  # [B] the requests' page-table rows
    lens: torch.Tensor  # [B] int32 keys each request attends to
    splits: int
    partial: tuple[torch.Tensor, torch.Tensor] | None = None  # a captured batch's split buffers


@dataclass
class ExtendMetadata:
    blocks: tuple[torch.Tensor, torch.Tensor]  # per query block: its request, its first query in it
    reqs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # per request: row, first q row, start, count


class TritonBackend(AttentionBackend):
    name = "triton"
    supports_cuda_graph = True

    def __init__(self, pool: KVPool, table: ReqTable, num_heads: int, head_dim: int):
        super().__init__(pool, table, num_heads, head_dim)
        from minisgl.kernels import triton_attention

        self.device = self.page_table.device
        if self.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                "the triton attention backend runs on a CUDA GPU, or on the CPU under Triton's interpreter "
                "(TRITON_INTERPRET=1, slow); use --attention-backend torch"
            )
        if head_dim & (head_dim - 1) or head_dim < 16:
            raise ValueError(f"the triton attention kernels need a power-of-two head_dim >= 16, not {head_dim}")
        self.kernels = triton_attention
        self.decode = DECODE_KERNELS.get(_CHOSEN[-1])
        sms = torch.cuda.get_device_properties(self.device).multi_processor_count if self.device.type == "cuda" else 2
        self.programs = 2 * sms  # a decode grid this large keeps every multiprocessor busy
        self.graph: dict[str, torch.Tensor] = {}

    # ---- eager batches ------------------------------------------------------------------------------
    def prepare_metadata(self, batch: Batch) -> None:
        n = batch.size
        rows = batch.table_idx[:n]
        if batch.is_decode:
            lens = torch.tensor(batch.ends, dtype=torch.int32).to(self.device, non_blocking=True)
            splits = self.kernels.num_splits(n, self.num_kv_heads, max(batch.ends), self.programs)
            batch.attn_metadata = DecodeMetadata(rows, lens, splits)
            return
        counts = [e - s for s, e in zip(batch.starts, batch.ends)]
        firsts = [sum(counts[:i]) for i in range(n)]
        block_req, block_first = self.kernels.extend_blocks(counts)
        i32 = lambda xs: torch.tensor(xs, dtype=torch.int32).to(self.device, non_blocking=True)  # noqa: E731
        reqs = (rows.to(torch.int32), i32(firsts), i32(batch.starts), i32(counts))
        batch.attn_metadata = ExtendMetadata((i32(block_req), i32(block_first)), reqs)

    def forward(self, q, k, v, layer_id: int, batch: Batch) -> torch.Tensor:
        md = batch.attn_metadata
        self.pool.store(layer_id, batch.out_loc, k, v)
        q = self.pool.scale_queries(layer_id, q)  # a quantized pool's per-head scales; else q itself
        keys, values = self.pool.k_slots(layer_id), self.pool.v_slots(layer_id)
        if isinstance(md, DecodeMetadata):
            q = q.view(-1, self.num_heads, self.head_dim)
            out = self.decode(
                q, keys, values, self.page_table, md.rows, md.lens, self.scale, md.splits, None, md.partial
            )
        else:
            out = self.kernels.extend(q, keys, values, self.page_table, md.blocks, md.reqs, self.scale)
        return self.pool.scale_output(layer_id, out.reshape(-1, self.num_heads * self.head_dim))

    # ---- CUDA graphs (decode) -----------------------------------------------------------------------
    def _graph_splits(self, bs: int) -> int:
        return self.kernels.num_splits(bs, self.num_kv_heads, self.page_table.shape[1], self.programs)

    def init_cuda_graph(self, max_bs: int) -> None:
        most = max(bs * self._graph_splits(bs) for bs in range(1, max_bs + 1)) * self.num_heads
        self.graph = {
            "rows": torch.zeros(max_bs, dtype=torch.int32, device=self.device),
            "lens": torch.ones(max_bs, dtype=torch.int32, device=self.device),
            "part": torch.empty(most, self.head_dim, dtype=torch.float32, device=self.device),
            "lse": torch.empty(most, dtype=torch.float32, device=self.device),
        }

    def prepare_for_capture(self, batch: Batch) -> None:
        self.prepare_for_replay(batch)

    def prepare_for_replay(self, batch: Batch) -> None:
        """The real requests' rows and lengths into the captured buffers, the rest of the captured size
        padded with the table's spare row (one key, on the scratch page)."""
        bs, n, g = batch.padded_size, batch.size, self.graph
        g["rows"][:n].copy_(batch.table_idx[:n], non_blocking=True)
        g["rows"][n:bs].fill_(self.table.dummy_row)
        lens = torch.tensor(batch.ends[:n], dtype=torch.int32)
        g["lens"][:n].copy_(lens, non_blocking=True)
        g["lens"][n:bs].fill_(1)
        batch.attn_metadata = DecodeMetadata(
            g["rows"][:bs], g["lens"][:bs], self._graph_splits(bs), (g["part"], g["lse"])
        )
