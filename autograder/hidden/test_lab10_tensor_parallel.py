"""Lab 10, hidden tests: what the visible tests check at tp=2, 3 and 4, at sizes they do not reach (tp=8, a
QKV bias sharded past tp=2, a fused size refused at tp=3, a vocabulary of 10 at tp=3), checked shard by
shard in this process (the layers read only ``get_tp_info()`` to build and load: each rank of a larger
group is played in turn, no process is started). Each builds a layer at tp=1 first, so a stub fails at
once."""

from __future__ import annotations

import torch

from autograder.adapters import lab10 as lab
from autograder.points import points
from autograder.test_lab10_tensor_parallel import as_rank, single_rank


@points(5)
def test_kv_heads_at_tp4():
    """8 heads, 2 KV heads at tp=4 and 16 heads, 2 KV heads at tp=8, with a bias: rank r holds its query heads
    and KV head r * 2 // tp (the one they attend with), in the weight and in the bias alike."""
    single_rank("QKVParallelLinear")
    g = torch.Generator().manual_seed(3)
    d = 4
    for heads, tp in ((8, 4), (16, 8)):
        q, k, v = (torch.randn(n * d, 16, generator=g) for n in (heads, 2, 2))
        biases = [torch.randn(w.shape[0], generator=g) for w in (q, k, v)]
        local_q = heads // tp
        for rank in range(tp):
            with as_rank(rank, tp):
                layer = lab.layer("QKVParallelLinear")(16, d, heads, 2, bias=True)
                for i, w in enumerate((q, k, v)):
                    layer.weight.weight_loader(layer.weight, w, i)
                    layer.bias.weight_loader(layer.bias, biases[i], i)
            head = rank * 2 // tp
            rows, kv = slice(rank * local_q * d, (rank + 1) * local_q * d), slice(head * d, (head + 1) * d)
            want = torch.cat([q[rows], k[kv], v[kv]])
            got = layer.weight.data
            if not (got.shape == want.shape and torch.equal(got, want)):
                same = got.shape == want.shape
                at = local_q * d
                held = [h for h in range(2) if same and torch.equal(got[at : at + d], k[h * d : (h + 1) * d])]
                raise AssertionError(
                    f"tp={tp}, {heads} heads, 2 KV heads: rank {rank} should hold KV head {head} (its query heads "
                    f"{rank * local_q}..{(rank + 1) * local_q - 1} attend with it); "
                    f"it holds {held or 'another slice'}. Rank r's KV head is r * num_kv_heads // tp (not "
                    "r % num_kv_heads: neighbouring ranks share one)"
                )
            want_bias = torch.cat([biases[0][rows], biases[1][kv], biases[2][kv]])
            got_bias = layer.bias.data
            assert got_bias.shape == want_bias.shape and torch.equal(got_bias, want_bias), (
                f"tp={tp}, {heads} heads, 2 KV heads: rank {rank}'s bias is not the rows of its query heads and of "
                f"KV head {head}: the bias is sharded like the weight's rows (the same loader, the same slices)"
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
