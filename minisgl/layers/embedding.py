"""Vocabulary-parallel embedding and LM head: rank ``r`` owns rows ``[r*V/tp, (r+1)*V/tp)`` of the
(padded) vocabulary. The embedding zeroes the ids it does not own and all-reduces; the LM head
computes its slice of the logits and all-gathers them."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.distributed import all_gather, all_reduce, get_tp_info
from minisgl.kernels.small_linear import linear


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden: int):
        super().__init__()
        tp = get_tp_info()
        self.vocab_size = vocab_size
        self.local_vocab = -(-vocab_size // tp.size)  # padded up so that every rank holds the same rows
        self.start = tp.rank * self.local_vocab
        self.weight = nn.Parameter(torch.empty(self.local_vocab, hidden), requires_grad=False)
        self.weight.weight_loader = self.load_weight

    def load_weight(self, param: torch.Tensor, loaded: Any, shard_id: Any = None) -> None:
        end = min(self.start + self.local_vocab, self.vocab_size)
        rows = loaded[self.start : end]
        param.data.zero_()
        param.data[: end - self.start].copy_(rows)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if get_tp_info().size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        outside = (local < 0) | (local >= self.local_vocab)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return all_reduce(out.masked_fill(outside.unsqueeze(-1), 0))


class ParallelLMHead(VocabParallelEmbedding):
    """Logits over the full vocabulary, in the weights' dtype, for the rows of ``hidden`` it is given.
    With tied embeddings the weight *is* the embedding's parameter. They stay in that dtype: a bf16 to
    float32 copy of a batch of 256 x 151,936 logits writes 155 MB per step, and the sampler's kernels
    read bf16 and compute in float32 (the exact same values)."""

    def __init__(self, vocab_size: int, hidden: int, tie_to: VocabParallelEmbedding | None = None):
        super().__init__(vocab_size, hidden)
        if tie_to is not None:
            self.weight = tie_to.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = linear(hidden, self.weight)
        if get_tp_info().size > 1:
            logits = all_gather(logits, dim=-1)
        return logits[:, : self.vocab_size]
