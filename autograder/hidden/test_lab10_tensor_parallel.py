"""Lab 10, hidden tests: sizes the visible tests do not reach, checked shard by shard in this process
(the layers read only ``get_tp_info()`` to build and load: each rank of a larger group is played in
turn, no process is started). Each builds a layer at tp=1 first, so a stub fails at once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from autograder.adapters import lab10 as lab
from autograder.points import points
from autograder.test_lab10_tensor_parallel import single_rank
from minisgl.distributed import TPInfo, get_tp_info, set_tp_info


@contextmanager
def as_rank(rank: int, size: int) -> Iterator[None]:
    saved = get_tp_info()
    set_tp_info(TPInfo(rank, size))
    try:
        yield
    finally:
        set_tp_info(saved)


@points(5)
def test_kv_heads_at_tp4():
    """8 heads, 2 KV heads at tp=4: rank r holds query heads 2r, 2r+1 and KV head r // 2 (the one they attend with)."""
    single_rank("QKVParallelLinear")
    g = torch.Generator().manual_seed(3)
    d = 4
    q, k, v = (torch.randn(n * d, 16, generator=g) for n in (8, 2, 2))
    for rank in range(4):
        with as_rank(rank, 4):
            layer = lab.layer("QKVParallelLinear")(16, d, 8, 2)
            for i, w in enumerate((q, k, v)):
                layer.weight.weight_loader(layer.weight, w, i)
        head = rank // 2
        kv = slice(head * d, (head + 1) * d)
        want = torch.cat([q[rank * 2 * d : (rank + 1) * 2 * d], k[kv], v[kv]])
        got = layer.weight.data
        if not (got.shape == want.shape and torch.equal(got, want)):
            same = got.shape == want.shape
            held = [h for h in range(2) if same and torch.equal(got[2 * d : 3 * d], k[h * d : (h + 1) * d])]
            raise AssertionError(
                f"tp=4, 2 KV heads: rank {rank} should hold KV head {head} (its query heads {2 * rank}, {2 * rank + 1} "
                f"attend with it); it holds {held or 'another slice'}. Rank r's KV head is r * num_kv_heads // tp "
                "(not r % num_kv_heads: neighbouring ranks share a KV head)"
            )


@points(5)
def test_sizes_that_do_not_divide():
    """At tp=3: a size that does not divide is refused (ValueError); a vocabulary of 10 is 4 + 4 + 2 rows (+ 2 zero)."""
    single_rank("MergedColumnParallelLinear")
    with as_rank(1, 3):
        try:
            lab.layer("MergedColumnParallelLinear")(16, [8, 8])
        except ValueError:
            pass
        else:
            raise AssertionError(
                "MergedColumnParallelLinear(16, [8, 8]) at tp=3 was built: 8 features do not split over 3 ranks, and "
                "rounding down drops features silently. Raise ValueError when a size does not divide"
            )
    table = torch.randn(10, 6, generator=torch.Generator().manual_seed(4))
    for rank in range(3):
        with as_rank(rank, 3):
            emb = lab.layer("VocabParallelEmbedding")(10, 6)
            emb.weight.weight_loader(emb.weight, table, None)
        want = torch.cat([table, torch.zeros(2, 6)])[rank * 4 : rank * 4 + 4]
        got = emb.weight.data
        assert got.shape == want.shape and torch.equal(got, want), (
            f"vocabulary 10 at tp=3: rank {rank} should hold rows {rank * 4}..{min(rank * 4 + 4, 10) - 1}"
            f"{' and 2 zero rows' if rank == 2 else ''} (shape [4, 6]); it holds shape {list(got.shape)} "
            "with other values. local_vocab = ceil(vocab / tp); the padding rows are zero"
        )
