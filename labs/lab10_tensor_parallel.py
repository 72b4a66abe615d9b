"""Lab 10: tensor-parallel layers.

You implement the five layers a decoder is split over ``tp`` ranks with, from ``minisgl.distributed``:
``get_tp_info`` (no arguments) says who this rank is (``.rank``, ``.size``), ``all_reduce`` /
``all_gather`` are the collectives, identities with one rank::

    x ──> qkv (column) ──> attention on local heads ──> o_proj (row) ──all_reduce──> y
    x ──> gate_up (column) ──> SwiGLU on local features ──> down (row) ──all_reduce──> y

    column-parallel W [out, in]:  each rank keeps an equal run of the rows of each fused shard
    row-parallel    W [out, in]:  each rank keeps an equal run of the columns; y = the sum over ranks

The engine builds its decoder from ``LAB10_LAYERS`` (a ``minisgl.layers.TPLayers``, the seam) when the
grader runs ``LLM(..., tp_size=2, components={"tp_layers": ...})``, and loads the checkpoint through your
``weight_loader``s. What must hold:

* **The engine's constructors, parameter names and loaders** (the signatures below; the engine's own
  classes, derived from, called or aliased, score 0). Each layer holds ``weight`` (and ``bias`` when
  asked), ``requires_grad=False``, and each parameter has a ``weight_loader(param, loaded, shard_id)``
  that copies *this rank's* part of the full checkpoint tensor ``loaded`` (a tensor or a lazy
  safetensors slice: index it before reading it). Ranks split everything in rank order: rank ``r`` of
  ``tp`` holds the ``r``-th of ``tp`` equal runs.
* **Column-parallel** (``ColumnParallelLinear`` and its two kinds): ``y = x W_local^T (+ b_local)``,
  no communication; rank ``r``'s output features are its runs of each shard, shard after shard. Shard
  ``i`` of a fused weight (``[gate | up]``, or ``[q | k | v]``), loaded with ``shard_id = i``, goes to the
  rows ``offsets[i]`` to ``offsets[i] + local_sizes[i]`` of the local weight (``local_sizes[i]``: this
  rank's rows of shard ``i``). ``MergedColumnParallelLinear(in_features, out_sizes, bias)``: each size
  is split over the ranks on its own; one that does not divide by ``tp`` raises ``ValueError``.
  Example: ``out_sizes = [6, 4]`` at ``tp = 2``: ``local_sizes`` ``[3, 2]``; rank 1 holds rows 3-5 of
  the first shard and rows 2-3 of the second. ``QKVParallelLinear(hidden, head_dim, num_heads,
  num_kv_heads, bias)`` splits by *heads* (``ValueError`` when the query heads do not divide) and sets
  ``num_local_heads`` / ``num_local_kv_heads`` (the attention reads them). When there are fewer KV heads
  than ranks each rank holds one KV head, the one its own query heads attend with (query heads are
  grouped over the KV heads in order): at ``tp = 4`` with 8 query and 2 KV heads, ranks 0 and 1 hold KV
  head 0 and ranks 2 and 3 KV head 1.
* **Row-parallel** (``RowParallelLinear(in_features, out_features, bias)``): the weight's *columns*
  are split (``in_features`` that does not divide by ``tp`` raises ``ValueError``); ``forward`` gets this rank's run of the input features and returns the full product, the
  same on every rank: the partial products summed over the ranks, plus the bias, which every rank holds
  whole and which is in the result once.
* **Vocab-parallel embedding** (``VocabParallelEmbedding(vocab_size, hidden)``): every rank holds the
  same number of rows, ``local_vocab``, the fewest that cover the vocabulary, rank ``r`` the run from
  ``start = r * local_vocab``; rows past the vocabulary (the last rank's padding) are zero. Example:
  vocabulary 10 at ``tp = 4``: 3 rows each, rank 3 holds id 9 and two zero rows. ``forward(ids)`` gives
  every id's row on every rank: each rank contributes the rows of the ids in its run and zeros for the
  others, and the ranks' contributions are summed (all-reduce), so each row comes from exactly one rank.
* **LM head** (``ParallelLMHead(vocab_size, hidden, tie_to)``, sharded like the embedding): logits over
  the whole vocabulary, ``[rows, vocab_size]``, the same on every rank: each rank's local logits gathered
  along the vocabulary in rank order, the padding's columns dropped. With ``tie_to`` the weight *is* the
  embedding's (the same tensor).

Pitfalls the grader recognises (its messages name them):

* the bias added on every rank before the all-reduce (it ends up ``tp`` times in the sum);
* sharding by the wrong dimension: a row-parallel weight split by its rows instead of its columns;
* rank 0's part loaded on every rank;
* a fused ``[gate | up]`` loaded into the wrong part of the local weight (``up`` written over ``gate``);
* KV heads not replicated when ``tp > num_kv_heads`` (zero KV heads), a replicated KV head past the
  checkpoint's KV heads, or the wrong one (at tp=4 with 2 KV heads, rank 1's query heads given KV head 1);
* embedding ids not shifted to the local range, or other ranks' ids not given zero rows (rows counted
  twice); the first id of a rank's run treated as another rank's;
* the all-reduce missing (a partial sum on each rank) or done twice (the sum counted ``tp`` times);
* the embedding's run rounded down (the last ids belong to nobody), or its padding rows left as they were;
* the LM head's logits not gathered (``vocab / tp`` columns), or the padding not cut;
* a size that does not divide by ``tp`` accepted and silently rounded down (features or heads dropped),
  or only the sum of the fused sizes (or the first of them) checked: each size is split on its own.

Grading: ``python -m autograder lab10`` builds each layer at ``tp=1`` in the grading process (it must
equal a plain matmul / lookup), plays the ranks of tp=2, 3 and 4 one by one in that process to check what
each rank builds and loads (what ``get_tp_info`` returns is all a layer reads to build and load), then
starts 2 ranks over gloo (once for all layer checks) where each layer must give the single-rank result on
every rank, then the engine at ``tp_size=2`` with your layers must generate TP=1's tokens (a tiny Llama and
a tiny Qwen3).
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
        if bias:
            self.bias.weight_loader = self.load_shard

    def _slice(self, shard: int) -> slice:
        """The rows of the full checkpoint tensor of shard ``shard`` that this rank holds."""
        raise NotImplementedError("Lab 10: the rows of a shard this rank holds (a hint: python -m autograder lab10 --hint)")

    def load_shard(self, param: torch.Tensor, loaded: Any, shard: int | None = 0) -> None:
        """Copy this rank's rows of shard ``shard`` (``loaded`` is that shard's full tensor) into its place."""
        shard = 0 if shard is None else shard
        raise NotImplementedError("Lab 10: this rank's rows of a shard, copied into their place (a hint: python -m autograder lab10 --hint)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several projections of the same input (``[gate | up]``) fused into one column-parallel matmul."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool = False):
        raise NotImplementedError("Lab 10: each fused size split over the ranks (a hint: python -m autograder lab10 --hint)")


class QKVParallelLinear(ColumnParallelLinear):
    """``[q | k | v]`` split by heads; past ``tp == num_kv_heads`` each rank holds one replicated KV head."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        raise NotImplementedError("Lab 10: the local query and KV heads, and the three shards (a hint: python -m autograder lab10 --hint)")

    def _slice(self, shard: int) -> slice:
        if shard == 0:  # the query heads: an even split of rows
            return super()._slice(0)
        raise NotImplementedError("Lab 10: the rows of the KV head(s) this rank holds (a hint: python -m autograder lab10 --hint)")


def load_whole(param: torch.Tensor, loaded: Any, shard_id: Any = None) -> None:
    """Loader of a parameter every rank holds whole."""
    _copy(param.data, loaded[:], "replicated parameter")


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_local W_local^T) + b``: the input features are split over ranks."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        raise NotImplementedError("Lab 10: this rank's number of input features (a hint: python -m autograder lab10 --hint)")
        self.weight = _param(out_features, self.in_local)
        self.weight.weight_loader = self.load_weight
        self.bias = _param(out_features) if bias else None
        if bias:
            self.bias.weight_loader = load_whole

    def load_weight(self, param: torch.Tensor, loaded: Any, shard_id: Any = None) -> None:
        """This rank's columns of the full ``[out, in]`` weight."""
        raise NotImplementedError("Lab 10: this rank's columns of the weight (a hint: python -m autograder lab10 --hint)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[tokens, in_local]``, this rank's input features; returns the full ``[tokens, out]``."""
        raise NotImplementedError("Lab 10: the full product on every rank (a hint: python -m autograder lab10 --hint)")


class VocabParallelEmbedding(nn.Module):
    """Rank ``r`` holds rows ``[start, start + local_vocab)`` of the (padded) table."""

    def __init__(self, vocab_size: int, hidden: int):
        super().__init__()
        self.vocab_size = vocab_size
        raise NotImplementedError("Lab 10: this rank's run of the vocabulary (a hint: python -m autograder lab10 --hint)")
        self.weight = _param(self.local_vocab, hidden)
        self.weight.weight_loader = self.load_weight

    def load_weight(self, param: torch.Tensor, loaded: Any, shard_id: Any = None) -> None:
        """This rank's rows of the full ``[vocab, hidden]`` table; rows past the vocabulary are zero."""
        raise NotImplementedError("Lab 10: this rank's rows of the table, padding zeroed (a hint: python -m autograder lab10 --hint)")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``[tokens]`` ids of the full vocabulary -> ``[tokens, hidden]``, the same on every rank."""
        raise NotImplementedError("Lab 10: every id's row on every rank (a hint: python -m autograder lab10 --hint)")


class ParallelLMHead(VocabParallelEmbedding):
    """Logits over the whole vocabulary from this rank's rows of the table (tied: the embedding's)."""

    def __init__(self, vocab_size: int, hidden: int, tie_to: VocabParallelEmbedding | None = None):
        super().__init__(vocab_size, hidden)
        if tie_to is not None:
            self.weight = tie_to.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[rows, hidden]`` -> ``[rows, vocab_size]`` logits, the same on every rank."""
        raise NotImplementedError("Lab 10: logits over the whole vocabulary on every rank (a hint: python -m autograder lab10 --hint)")


# the seam: what the engine builds its decoder from when the grader picks this lab's layers
LAB10_LAYERS = TPLayers(
    qkv=QKVParallelLinear,
    merged_column=MergedColumnParallelLinear,
    row=RowParallelLinear,
    embedding=VocabParallelEmbedding,
    lm_head=ParallelLMHead,
)
