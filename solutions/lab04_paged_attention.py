"""Lab 04: attention over pages, in PyTorch.

You implement ``PagedAttentionBackend``, an ``AttentionBackend`` (read ``minisgl/attention/base.py``
first: it is the interface the engine calls). The engine creates it once with the KV pool and the
request table; per batch it calls ``prepare_metadata(batch)`` once, then ``forward`` in every layer.
Write it here: the engine's own backends and its paged decode kernels are off limits (a lab that
derives from, calls or aliases them scores 0).

A batch is ragged: request ``i`` (request-table row ``batch.reqs[i].table_idx``) extends positions
``[starts[i], ends[i])``; positions ``[0, starts[i])`` are its cached prefix, whose K/V are already
in the pool. Its tokens sit in the flat batch one request after the other::

    request   starts ends   flat tokens (position)     keys each token sees
    0         3      6      t0 (3) t1 (4) t2 (5)       0..3, 0..4, 0..5     a prefill after a cached prefix
    1         7      8      t3 (7)                     0..7                 a decode row

    page_table[row, position] -> KV slot (page * page_size + offset); k_slots(layer)[slot] -> [kv_heads, D]

Contract (the grader compares every result with the engine's ``TorchBackend``):

* ``key_mask(starts, ends)``: ``[num_tokens, max(ends)]`` bool, one row per token of the flat batch
  (requests in order) and one column per key position, ``True`` where that token may attend to that
  key. The token at position ``p`` of a request sees keys ``0..p`` of its own request (its cached
  prefix too, itself included), and never a key position ``>= ends[i]`` (padding: requests are
  padded to the longest). When every request extends one token (a decode batch) each query sits at
  ``ends[i] - 1`` and sees all of its request's keys. Example, the batch above: ``starts = [3, 7]``,
  ``ends = [6, 8]`` -> 4 rows of 8 columns, seeing keys ``0..3``, ``0..4``, ``0..5`` and ``0..7``
  (``[[1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1,
  1, 1, 1]]``).
* ``prepare_metadata(batch)``: set ``batch.attn_metadata`` to a fresh ``PagedMetadata`` for *this*
  batch (the engine calls it once per batch; another batch's has other rows and lengths):
  ``kv_slots`` ``[B, max(ends)]`` int64, where ``kv_slots[i, p]`` is the KV slot of position ``p`` of
  request ``i``, as its page-table row (``batch.reqs[i].table_idx``) says (entries at ``p >=
  ends[i]`` may hold anything); ``token_req`` ``[num_tokens]`` int64, the request of each token;
  ``mask``, the key mask above. All on the page table's device.
* ``paged_attention(q, k_slots, v_slots, md, scale)``: ``q`` ``[num_tokens, heads, D]``; ``k_slots``
  and ``v_slots`` one layer's pool, ``[num_slots, kv_heads, D]``, indexed by slot. Token ``j`` attends,
  through ``md``, to the keys its mask row allows, read from the slots of its request. Query head
  ``h`` reads KV head ``h // (heads // kv_heads)`` (grouped-query attention: consecutive query heads
  share a KV head). The weights are the softmax of ``scale`` times the query's dot product with each
  visible key (``scale`` as given); the output is their weighted sum of values, ``[num_tokens, heads
  * D]`` in ``q.dtype`` (each token's heads side by side). Example: ``q`` all zeros ``[1, 2, 1]``,
  ``k_slots`` all zeros ``[3, 1, 1]``, ``v_slots = [[[1]], [[2]], [[6]]]``, ``md.kv_slots = [[2,
  0]]``, ``md.token_req = [0]``, ``md.mask = [[True, True]]``, ``scale = 1`` -> ``[[3.5, 3.5]]``
  (both heads weigh slots 2 and 0 alike).
* ``forward(q, k, v, layer_id, batch)``: the new tokens' ``k`` and ``v`` of layer ``layer_id`` are in
  the pool at slots ``batch.out_loc`` (``self.pool``'s store) *before* the attention reads it: the
  batch's own tokens are keys too. Returns ``paged_attention``'s output with the backend's
  ``self.scale``.
* **Precision.** Scores, softmax and the weighted sum in float32, rounded once to ``q.dtype``:
  float32 results match ``TorchBackend`` within 1e-5; bfloat16 results are within one bfloat16 unit
  in the last place of the exact (float64) attention of the same inputs.
* Page sizes 1 and 16 (any page size: the page table already maps positions to slots), grouped-query
  attention, float32 and bfloat16, CPU (no CUDA graphs).

Pitfalls the grader recognises (its messages name them):

* the mask: positions counted from the first new token instead of from 0 (the cached prefix
  forgotten); a token that does not see itself; a decode row that sees only its new token, or that
  also sees the padding past its request's end (key ``ends[i]`` included); the decode shape (one
  query per request) taken when only some requests extend one token;
* the metadata: key positions used as slots (the page table not read), rows taken by the request's
  index in the batch instead of its table row, or one batch's metadata kept and reused for the next;
* the math: query head ``h`` reading KV head ``h mod kv_heads`` (round-robin instead of consecutive
  groups); a scale other than ``scale`` (``1/sqrt(D)``); the softmax in bfloat16, or ``q`` scaled in
  bfloat16 (exact only while the scale is a power of two);
* ``forward``: attending before storing the new K/V (the batch's tokens then read stale slots).

Grading: ``python -m autograder lab04`` (``--hint`` prints a hint per function) checks ``key_mask``
on fixed and random batches, the metadata, the attention math in float32 and bfloat16 (head_dim 16
and 32) against an exact oracle, the whole backend against ``TorchBackend`` on ragged batches (cached
prefixes, decode rows, extends on page boundaries, page sizes 1 and 16, grouped-query attention),
then runs the engine with ``attention_backend=<your backend>`` and checks its greedy tokens equal the
reference engine's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.attention.base import AttentionBackend
from minisgl.core import Batch


@dataclass
class PagedMetadata:
    kv_slots: torch.Tensor  # [B, max_len] int64: KV slot of each key position of each request
    token_req: torch.Tensor  # [num_tokens] int64: the request of each token of the flat batch
    mask: torch.Tensor  # [num_tokens, max_len] bool: True where the token may attend to the key


def token_requests(starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """``[num_tokens]`` int64: the index of the request each token of the flat batch belongs to."""
    return torch.repeat_interleave(torch.arange(len(starts)), ends - starts)


def token_positions(starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """``[num_tokens]`` int64: the position of each token in its request (``starts[i] .. ends[i]-1``)."""
    q_lens = ends - starts
    first = torch.cumsum(q_lens, 0) - q_lens  # index of each request's first token in the flat batch
    return torch.arange(int(q_lens.sum())) - torch.repeat_interleave(first - starts, q_lens)


def key_mask(starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """``[num_tokens, max(ends)]`` bool: which key positions each token may attend to (int64 CPU
    ``starts``/``ends``, one entry per request)."""
    # BEGIN SOLUTION what="the key mask of the ragged batch, decode batches included" hint="the key positions 0 .. max(ends) - 1 compared with each token's position (token_positions): key <= position; for an all-decode batch, key < ends[i] per request"
    max_len = int(ends.max())
    kpos = torch.arange(max_len)
    if bool(((ends - starts) == 1).all()):  # decode: one query per request, at position ends - 1
        return kpos[None, :] < ends[:, None]
    positions = token_positions(starts, ends)
    return kpos[None, :] <= positions[:, None]
    # END SOLUTION


def paged_attention(
    q: torch.Tensor, k_slots: torch.Tensor, v_slots: torch.Tensor, md: PagedMetadata, scale: float
) -> torch.Tensor:
    """``q`` ``[num_tokens, heads, D]``, ``k_slots``/``v_slots`` ``[num_slots, kv_heads, D]`` (the
    pool of one layer, indexed by slot). Returns ``[num_tokens, heads * D]`` in ``q.dtype``."""
    # BEGIN SOLUTION what="grouped-query attention of every token over the slots its request holds" hint="index md.kv_slots by md.token_req for each token's slots; gather K and V there with the KV head of each query head (h // group); scores in float32 times scale, -inf outside md.mask, softmax, weighted sum, one cast to q.dtype, reshape to [tokens, heads * D]"
    n, heads, dim = q.shape
    kv_heads = k_slots.shape[1]
    slots = md.kv_slots[md.token_req]  # [N, L]: the slots of the keys each token may see
    kv_head = torch.arange(heads, device=q.device) // (heads // kv_heads)  # GQA: h // group
    keys = k_slots[slots][:, :, kv_head].float()  # [N, L, H, D]
    values = v_slots[slots][:, :, kv_head].float()
    scores = torch.einsum("nhd,nlhd->nhl", q.float(), keys) * scale
    scores = scores.masked_fill(~md.mask[:, None, :], float("-inf"))
    probs = scores.softmax(dim=-1)
    out = torch.einsum("nhl,nlhd->nhd", probs, values)
    return out.to(q.dtype).reshape(n, heads * dim)
    # END SOLUTION


class PagedAttentionBackend(AttentionBackend):
    """Attention over paged KV in plain PyTorch: the engine's ``attention_backend="lab04"``."""

    name = "lab04"

    def prepare_metadata(self, batch: Batch) -> None:
        # BEGIN SOLUTION what="this batch's metadata: the slots of every request's keys, each token's request, the mask" hint="rows = each request's table_idx; kv_slots = the page table at those rows, columns up to max(ends), as int64; token_requests and key_mask of starts/ends; all moved to the page table's device"
        device = self.page_table.device
        starts = torch.tensor(batch.starts, dtype=torch.int64)
        ends = torch.tensor(batch.ends, dtype=torch.int64)
        rows = torch.tensor([req.table_idx for req in batch.reqs], dtype=torch.int64, device=device)
        kv_slots = self.page_table[rows, : int(ends.max())].to(torch.int64)
        token_req = token_requests(starts, ends).to(device)
        batch.attn_metadata = PagedMetadata(kv_slots, token_req, key_mask(starts, ends).to(device))
        # END SOLUTION

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch) -> torch.Tensor:
        # BEGIN SOLUTION what="store the new K/V, then attend over the layer's pool" hint="the pool's store method at batch.out_loc for this layer first; then paged_attention with the layer's k_slots and v_slots, the batch's metadata and self.scale"
        self.pool.store(layer_id, batch.out_loc, k, v)
        k_slots, v_slots = self.pool.k_slots(layer_id), self.pool.v_slots(layer_id)
        return paged_attention(q, k_slots, v_slots, batch.attn_metadata, self.scale)
        # END SOLUTION
