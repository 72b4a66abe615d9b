"""FlashInfer backends (CUDA only): paged attention that reads K/V pages in place.

``fi``  : prefill with FlashInfer's FA2 kernels, decode with its tensor-core decode (fast for GQA)
``fa3`` : the same, with FlashAttention-3 prefill kernels (Hopper)

FlashInfer describes each request's KV as a list of pages (CSR layout)::

    kv_indptr  [B+1]   request i's pages are kv_indices[kv_indptr[i] : kv_indptr[i+1]]
    kv_indices [sum]   page ids, read from the page table: page_table[row, 0::page_size] // page_size
    last_len   [B]     valid tokens in each request's last page (1..page_size)

``plan()`` turns that into a kernel schedule once per batch; ``run()`` is then called per layer. The
index arrays are built on the device from the page table (no host round trip of the pages);
only the per-request lengths travel from the host, which plan() needs there anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from minisgl.attention.base import AttentionBackend
from minisgl.core import Batch
from minisgl.env import ENV
from minisgl.kvcache.pool import KVPool
from minisgl.kvcache.table import ReqTable

WORKSPACE_BYTES = 128 << 20
_WORKSPACES: dict[torch.device, torch.Tensor] = {}


def unsplit_graph_plan(wrapper, batch_size: int) -> None:
    """Make a CUDA-graph decode plan made with ``disable_split_kv=True`` launch one block per request.

    FlashInfer 0.6's planner pads such a plan's grid to its split-KV size but, without split-KV,
    writes no mask for the padding blocks: they read scheduler entries no plan wrote and can fault
    (flashinfer-ai/flashinfer#4002). A decode request is one query tile (the planner sizes the tile,
    16 to 128 rows, to hold the query heads of one KV head), so the exact grid is the batch size,
    the same at every replay of the graph; ``plan_info[0]`` (``padded_batch_size``) is that grid.
    """
    info = wrapper._plan_info
    fields = list(info)
    if fields[0] < batch_size:
        raise RuntimeError(f"FlashInfer planned {fields[0]} blocks for {batch_size} requests")
    fields[0] = batch_size
    wrapper._plan_info = type(info)(fields)  # FlashInfer's own container type (a tvm-ffi Array)


def _workspace(device: torch.device) -> torch.Tensor:
    """One float workspace per device, shared by all wrappers: they never run concurrently."""
    if device not in _WORKSPACES:
        _WORKSPACES[device] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _WORKSPACES[device]


@dataclass
class FlashInferMetadata:
    wrapper: Any  # the planned prefill or decode wrapper for this batch


class FlashInferBackend(AttentionBackend):
    name = "fi"
    supports_cuda_graph = True
    prefill_kernel = "fa2"

    def __init__(self, pool: KVPool, table: ReqTable, num_heads: int, head_dim: int):
        super().__init__(pool, table, num_heads, head_dim)
        import flashinfer

        if self.page_table.device.type != "cuda":
            raise ValueError(f"the {self.name} attention backend needs a CUDA device; use --attention-backend torch")
        if pool.compute_dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(
                f"FlashInfer attention runs in float16/bfloat16, not {pool.compute_dtype}: pass --dtype bfloat16 "
                "or use --attention-backend torch"
            )
        self.fi = flashinfer
        self.device = self.page_table.device
        ws = _workspace(self.device)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=self.prefill_kernel)
        # the tensor-core decode kernel, even with 2 query heads per KV head: faster on real, ragged batches
        # (measured in docs/gpu.md; uniform lengths mislead). MINISGL_FI_TENSOR_CORES=0 overrides.
        self.tensor_cores = ENV.fi_tensor_cores
        self.decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            ws, "NHD", use_tensor_cores=self.tensor_cores, backend="fa2"
        )
        self.graph_wrappers: dict[int, Any] = {}
        # captured decode batches of at least this many requests (MINISGL_FI_NO_SPLIT_MIN_BS, 32) skip
        # split-KV: a CUDA-graph plan always runs split-KV's merge pass, yet from a few dozen requests up
        # there are enough (request, KV head) blocks to fill the GPU without splitting any request's KV
        self.no_split_min_bs = ENV.fi_no_split_min_bs
        # plan() copies its schedule from one pinned host buffer; with overlap scheduling the next
        # plan() may start before that copy ran, so it first waits for the previous one (~never blocks)
        self._plan_copied: torch.cuda.Event | None = None

    # ---- indices -------------------------------------------------------------------------
    def _kv_layout(self, rows: torch.Tensor, ends: list[int]):
        """``(kv_indptr (host), kv_indices (device), last_page_len (host))`` for requests in page-table
        ``rows`` (device) whose sequences are ``ends`` tokens long."""
        p = self.pool.page_size
        seq = np.asarray(ends, dtype=np.int32)
        npages = (seq + p - 1) // p
        indptr = np.zeros(len(ends) + 1, dtype=np.int32)
        np.cumsum(npages, out=indptr[1:])
        total = int(indptr[-1])
        indptr, last_len = torch.from_numpy(indptr), torch.from_numpy(seq - (npages - 1) * p)
        indptr_d = indptr.to(self.device, dtype=torch.int64, non_blocking=True)
        # CSR expansion without a host loop: entry j belongs to the request whose page range holds it
        j = torch.arange(total, device=self.device)
        req = torch.searchsorted(indptr_d[1:], j, right=True)
        pos = (j - indptr_d[req]) * p
        indices = torch.div(self.page_table[rows[req], pos], p, rounding_mode="floor")
        return indptr, indices, last_len

    def _plan(
        self, wrapper, qo_indptr: torch.Tensor | None, rows: torch.Tensor, ends: list[int], no_split: bool = False
    ) -> None:
        if self._plan_copied is not None:
            self._plan_copied.synchronize()
        kv_indptr, kv_indices, last_len = self._kv_layout(rows, ends)
        common = dict(q_data_type=self.pool.compute_dtype, kv_data_type=self.pool.dtype, sm_scale=self.scale)
        heads = (self.num_heads, self.num_kv_heads, self.head_dim, self.pool.page_size)
        layout = (kv_indptr, kv_indices, last_len, *heads)
        if qo_indptr is None and no_split:  # a captured decode batch
            wrapper.plan(*layout, **common, disable_split_kv=True)
            unsplit_graph_plan(wrapper, len(ends))
        elif qo_indptr is None:  # decode
            wrapper.plan(*layout, **common)
        else:
            wrapper.plan(qo_indptr, *layout, causal=True, **common)
        self._plan_copied = torch.cuda.Event()
        self._plan_copied.record()

    # ---- eager batches -------------------------------------------------------------------
    def prepare_metadata(self, batch: Batch) -> None:
        rows = batch.table_idx[: batch.size]
        if batch.is_decode:
            self._plan(self.decode_wrapper, None, rows, batch.ends)
            batch.attn_metadata = FlashInferMetadata(self.decode_wrapper)
        else:
            qo_indptr = np.zeros(batch.size + 1, dtype=np.int32)
            np.cumsum(np.asarray(batch.ends) - np.asarray(batch.starts), out=qo_indptr[1:])
            qo_indptr = torch.from_numpy(qo_indptr)
            self._plan(self.prefill_wrapper, qo_indptr, rows, batch.ends)
            batch.attn_metadata = FlashInferMetadata(self.prefill_wrapper)

    def forward(self, q, k, v, layer_id: int, batch: Batch) -> torch.Tensor:
        self.pool.store(layer_id, batch.out_loc, k, v)
        kv = (self.pool.k_cache(layer_id), self.pool.v_cache(layer_id))
        # an FP8 pool's per-head scales (KVPool): on the queries before, on the output after
        out = batch.attn_metadata.wrapper.run(self.pool.scale_queries(layer_id, q), kv)
        return self.pool.scale_output(layer_id, out.view(-1, self.num_heads * self.head_dim))

    # ---- CUDA graphs (decode) ------------------------------------------------------------
    def init_cuda_graph(self, max_bs: int) -> None:
        max_pages = max_bs * (self.page_table.shape[1] // self.pool.page_size)
        self._g_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self._g_indices = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
        self._g_last = torch.ones(max_bs, dtype=torch.int32, device=self.device)

    def _graph_wrapper(self, bs: int):
        if bs not in self.graph_wrappers:
            self.graph_wrappers[bs] = self.fi.BatchDecodeWithPagedKVCacheWrapper(
                _workspace(self.device),
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=self.tensor_cores,
                backend="fa2",
                paged_kv_indptr_buffer=self._g_indptr[: bs + 1],
                paged_kv_indices_buffer=self._g_indices,
                paged_kv_last_page_len_buffer=self._g_last[:bs],
            )
        return self.graph_wrappers[bs]

    def prepare_for_capture(self, batch: Batch) -> None:
        self.prepare_for_replay(batch)

    def prepare_for_replay(self, batch: Batch) -> None:
        """Plan the graph's wrapper for the real requests padded with dummy ones (the spare
        page-table row, one token on the scratch page) up to the captured size."""
        bs, n = batch.padded_size, batch.size
        rows = batch.table_idx[:n]
        if bs > n:
            pad = torch.full((bs - n,), self.table.dummy_row, dtype=rows.dtype, device=self.device)
            rows = torch.cat([rows, pad])
        wrapper = self._graph_wrapper(bs)
        # the choice depends on the captured size alone, so capture and replays plan alike
        no_split = self.tensor_cores and bs >= self.no_split_min_bs
        self._plan(wrapper, None, rows, list(batch.ends[:n]) + [1] * (bs - n), no_split)
        batch.attn_metadata = FlashInferMetadata(wrapper)


class FA3Backend(FlashInferBackend):
    """FlashAttention-3 prefill (Hopper's TMA + warp-specialised kernels) through FlashInfer."""

    name = "fa3"
    prefill_kernel = "fa3"

    def __init__(self, pool: KVPool, table: ReqTable, num_heads: int, head_dim: int):
        device = table.page_table.device
        if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] < 9:
            raise ValueError("the fa3 backend needs a Hopper GPU (sm90); use --attention-backend fi")
        if pool.quantized:
            raise ValueError("the fa3 backend does not read an FP8 KV cache (bf16 queries); use --attention-backend fi")
        super().__init__(pool, table, num_heads, head_dim)
