"""Lab 10: tensor-parallel layers.

You implement the five layers a decoder is split over ``tp`` ranks with, from ``minisgl.distributed``:
``get_tp_info()`` says who this rank is (``.rank``, ``.size``), ``all_reduce`` / ``all_gather`` are the
collectives, identities with one rank::

    x ──> qkv (column) ──> attention on local heads ──> o_proj (row) ──all_reduce──> y
    x ──> gate_up (column) ──> SwiGLU on local features ──> down (row) ──all_reduce──> y

    column-parallel W [out, in]:  rank r keeps rows    [r*out/tp, (r+1)*out/tp) of each fused shard
    row-parallel    W [out, in]:  rank r keeps columns [r*in/tp,  (r+1)*in/tp):  y = sum_r x_r W_r^T

The engine builds its decoder from ``LAB10_LAYERS`` (a ``minisgl.layers.TPLayers``, the seam) when the
grader runs ``LLM(..., tp_size=2, components={"tp_layers": ...})``, and loads the checkpoint through your
``weight_loader``s, so:

Contract:

* **Same constructors, parameter names and loaders as the engine's classes** (the signatures below;
  the engine's own classes, derived from, called or aliased, score 0). Each layer holds
  ``weight`` (and ``bias`` when asked), ``requires_grad=False``, and each parameter has a
  ``weight_loader(param, loaded, shard_id)`` that copies *this rank's* slice of the full checkpoint
  tensor ``loaded`` (a tensor or a lazy safetensors slice: index it, ``loaded[a:b]`` or
  ``loaded[:, a:b]``, before reading it).
* **Column-parallel** (``ColumnParallelLinear`` and its two kinds): ``y = x W_local^T (+ b_local)``,
  no communication. Shard ``i`` of a fused weight (``[gate | up]``, or ``[q | k | v]``) is loaded with
  ``shard_id = i`` into rows ``offsets[i] : offsets[i] + local_sizes[i]`` of the local weight.
  ``MergedColumnParallelLinear(in_features, out_sizes, bias)`` splits each size by ``tp`` (a size
  that does not divide raises ``ValueError``). ``QKVParallelLinear(hidden, head_dim, num_heads,
  num_kv_heads, bias)`` splits by *heads* and sets ``num_local_heads`` / ``num_local_kv_heads`` (the
  attention reads them). With ``tp > num_kv_heads`` each KV head is *replicated*: rank ``r`` holds one
  KV head, number ``r * num_kv_heads // tp`` (the one its query heads attend with).
* **Row-parallel** (``RowParallelLinear(in_features, out_features, bias)``): the weight's *columns*
  are split; ``forward`` gets this rank's slice of the input features and returns
  ``all_reduce(x_local W_local^T) + b`` on every rank: the bias is whole on every rank and added
  once, after the sum.
* **Vocab-parallel embedding** (``VocabParallelEmbedding(vocab_size, hidden)``): rank ``r`` holds
  rows ``[start, start + local_vocab)`` of the table, ``local_vocab = ceil(vocab / tp)`` (the last
  shard is padded with zero rows). ``forward(ids)`` looks up the ids it owns (shifted to local rows),
  gives zero rows for the others, and all-reduces: each id's row comes from exactly one rank.
* **LM head** (``ParallelLMHead(vocab_size, hidden, tie_to)``, given the embedding's sharding):
  local logits ``hidden @ W_local^T``, all-gathered along the vocabulary, cut to ``vocab_size``
  (the padding's columns dropped). With ``tie_to`` the weight *is* the embedding's.

Pitfalls the grader recognises (its messages name them):

* the bias added on every rank before the all-reduce (it ends up ``tp`` times in the sum);
* sharding by the wrong dimension: a row-parallel weight split by its rows instead of its columns;
* rank 0's slice loaded on every rank (the slice must start at ``rank * local_size``);
* a fused ``[gate | up]`` loaded into the wrong part of the local weight (every shard written at
  offset 0: ``up`` overwrites ``gate``);
* KV heads not replicated when ``tp > num_kv_heads`` (zero KV heads), or the replicated head looked
  up as ``rank * num_local_kv_heads`` (a slice past the checkpoint's KV heads);
* embedding ids not shifted to the local range, or out-of-range rows not zeroed (another rank's
  ids read this rank's row 0: rows counted twice);
* the all-reduce missing (a partial sum on each rank) or done twice (the sum counted ``tp`` times);
* the embedding's shard rounded down (``vocab // tp``: the last ids belong to nobody);
* the LM head's logits not gathered (``vocab / tp`` columns), or the padding not cut;
* a size that does not divide by ``tp`` accepted and silently rounded down (features dropped), or only
  the sum of the fused sizes (or the first of them) checked: each size is split on its own;
* the replicated KV head looked up as ``rank % num_kv_heads`` (at tp=4 with 2 KV heads, rank 1's query
  heads attend with KV head 0);
* the embedding's padding rows left as they were (they must be zero), or the first id of a rank's range
  treated as another rank's (``id - start >= 0``, not ``> 0``).

Grading: ``python -m autograder lab10`` builds each layer at ``tp=1`` in the grading process (it must
equal a plain matmul / lookup), plays the ranks of tp=2, 3 and 4 one by one in that process to check what
each rank builds and loads (``get_tp_info()`` is all a layer reads to build and load), then starts 2 ranks
over gloo (once for all layer checks) where each layer must give the single-rank result on every rank, then
the engine at ``tp_size=2`` with your layers must generate TP=1's tokens (a tiny Llama and a tiny Qwen3).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.distributed import all_gather, all_reduce, get_tp_info
from minisgl.layers import TPLayers


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


def _copy(dst: torch.Tensor, src: torch.Tensor, what: str) -> None:
    if tuple(src.shape) != tuple(dst.shape):
        raise ValueError(f"{what}: checkpoint slice {tuple(src.shape)} != parameter slice {tuple(dst.shape)}")
    dst.copy_(src)


class ColumnParallelLinear(nn.Module):
    """``y = x W_local^T (+ b_local)``. The output is made of fused shards; ``local_sizes[i]`` is this
    rank's rows of shard ``i``, which start at row ``offsets[i]`` of the local weight."""

    def __init__(self, in_features: int, local_sizes: list[int], bias: bool = False):
        super().__init__()
        self.local_sizes = list(local_sizes)
        self.offsets = [sum(local_sizes[:i]) for i in range(len(local_sizes))]
        self.weight = _param(sum(local_sizes), in_features)
        self.weight.weight_loader = self.load_shard
        self.bias = _param(sum(local_sizes)) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = self.load_shard

    def _slice(self, shard: int) -> slice:
        """The rows of the full checkpoint tensor of shard ``shard`` that this rank holds."""
        raise NotImplementedError("Lab 10: rank r holds rows [r*n, (r+1)*n) of the shard's own tensor, n = local_sizes[shard]")

    def load_shard(self, param: torch.Tensor, loaded: Any, shard: int | None = 0) -> None:
        """Copy this rank's rows of shard ``shard`` (``loaded`` is that shard's full tensor) into its place."""
        shard = 0 if shard is None else shard
        raise NotImplementedError("Lab 10: loaded[self._slice(shard)] -> rows offsets[shard] : offsets[shard] + local_sizes[shard]")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several projections of the same input (``[gate | up]``) fused into one column-parallel matmul."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool = False):
        raise NotImplementedError("Lab 10: every size split by tp (ValueError when one does not divide), then the base class")


class QKVParallelLinear(ColumnParallelLinear):
    """``[q | k | v]`` split by heads; past ``tp == num_kv_heads`` each rank holds one replicated KV head."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        raise NotImplementedError("Lab 10: num_local_heads and num_local_kv_heads (at least 1), then the base class with 3 sizes")

    def _slice(self, shard: int) -> slice:
        if shard == 0:  # the query heads: an even split of rows
            return super()._slice(0)
        raise NotImplementedError("Lab 10: K/V: this rank's first KV head is rank * num_kv_heads // tp")


def load_whole(param: torch.Tensor, loaded: Any, shard_id: Any = None) -> None:
    """Loader of a parameter every rank holds whole."""
    _copy(param.data, loaded[:], "replicated parameter")


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_local W_local^T) + b``: the input features are split over ranks."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        tp = get_tp_info()
        if in_features % tp.size:
            raise ValueError(f"cannot split input features of size {in_features} over tp={tp.size}")
        self.in_local = in_features // tp.size
        self.weight = _param(out_features, self.in_local)
        self.weight.weight_loader = self.load_weight
        self.bias = _param(out_features) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = load_whole

    def load_weight(self, param: torch.Tensor, loaded: Any, shard_id: Any = None) -> None:
        """This rank's columns of the full ``[out, in]`` weight."""
        raise NotImplementedError("Lab 10: columns [rank * in_local, (rank + 1) * in_local) of loaded")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[tokens, in_local]``, this rank's input features; returns the full ``[tokens, out]``."""
        raise NotImplementedError("Lab 10: the partial product, all_reduce'd once; the bias added after the sum")


class VocabParallelEmbedding(nn.Module):
    """Rank ``r`` holds rows ``[start, start + local_vocab)`` of the (padded) table."""

    def __init__(self, vocab_size: int, hidden: int):
        super().__init__()
        self.vocab_size = vocab_size
        raise NotImplementedError("Lab 10: local_vocab = ceil(vocab_size / tp) (every rank the same), start = rank * local_vocab")
        self.weight = _param(self.local_vocab, hidden)
        self.weight.weight_loader = self.load_weight

    def load_weight(self, param: torch.Tensor, loaded: Any, shard_id: Any = None) -> None:
        """This rank's rows of the full ``[vocab, hidden]`` table; rows past the vocabulary are zero."""
        raise NotImplementedError("Lab 10: rows start : min(start + local_vocab, vocab_size) of loaded; zero the padding rows")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``[tokens]`` ids of the full vocabulary -> ``[tokens, hidden]``, the same on every rank."""
        raise NotImplementedError("Lab 10: ids - start; ids outside [0, local_vocab) look up row 0, then zeroed; all_reduce")


class ParallelLMHead(VocabParallelEmbedding):
    """Logits over the whole vocabulary from this rank's rows of the table (tied: the embedding's)."""

    def __init__(self, vocab_size: int, hidden: int, tie_to: VocabParallelEmbedding | None = None):
        super().__init__(vocab_size, hidden)
        if tie_to is not None:
            self.weight = tie_to.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[rows, hidden]`` -> ``[rows, vocab_size]`` logits, the same on every rank."""
        raise NotImplementedError("Lab 10: local logits hidden @ weight.T, all_gather'ed along the last dim, cut to vocab_size")


# the seam: what the engine builds its decoder from when the grader picks this lab's layers
LAB10_LAYERS = TPLayers(
    qkv=QKVParallelLinear,
    merged_column=MergedColumnParallelLinear,
    row=RowParallelLinear,
    embedding=VocabParallelEmbedding,
    lm_head=ParallelLMHead,
)
