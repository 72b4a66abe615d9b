"""Broken variants of solutions/lab10_tensor_parallel.py: one per pitfall its docstring names, a correct
one written another way (``EQUIVALENT``), and two that only the hidden tests catch (``HIDDEN_MUTANTS``:
a fused size that does not divide by tp silently rounded down, and the replicated KV head picked as
``rank % num_kv_heads``, which agrees with ``rank * num_kv_heads // tp`` at tp=2 with 1 or 2 KV heads,
the only cases the visible tests and the tiny models reach)."""

from mutants import Mutant

STEM = "lab10_tensor_parallel"

RANDOMIZED: dict[str, str] = {}  # no randomized tests: every check is on fixed tensors

_ROW_FORWARD = (
    "        partial = F.linear(x, self.weight)\n"
    "        y = all_reduce(partial)\n"
    "        if self.bias is not None:\n"
    "            y = y + self.bias\n"
    "        return y\n"
)

MUTANTS = [
    Mutant(
        "bias_on_every_rank",
        STEM,
        ((_ROW_FORWARD, "        return all_reduce(F.linear(x, self.weight, self.bias))\n"),),
        must_fail=("row_parallel_bias_once",),
        hint="bias added on every rank",
        why="each rank adds the bias to its partial product: the all-reduce sums it tp times",
    ),
    Mutant(
        "row_split_by_rows",
        STEM,
        (
            (
                "loaded[:, first : first + self.in_local]",
                "loaded[first : first + self.in_local]",
            ),
        ),
        must_fail=("row_parallel_on_2_ranks", "row_parallel_bias_once", "engine_tp2_llama"),
        hint="split by its columns",
        why="a row-parallel weight sharded by the wrong dimension (its rows, the output features)",
    ),
    Mutant(
        "rank0_slice_everywhere",
        STEM,
        (("        first = get_tp_info().rank * n\n", "        first = 0\n"),),
        must_fail=("merged_column_on_2_ranks", "qkv_split_by_heads", "engine_tp2_qwen3"),
        hint="rank 0's rows on every rank",
        why="every rank loads rank 0's slice of each column-parallel weight",
    ),
    Mutant(
        "fused_shards_at_offset_0",
        STEM,
        (("        at = self.offsets[shard]\n", "        at = 0\n"),),
        must_fail=("single_rank_layers", "merged_column_on_2_ranks"),
        hint="written at offset 0",
        why="up (shard 1) is copied over gate's rows of the fused [gate | up] weight",
    ),
    Mutant(
        "kv_heads_not_replicated",
        STEM,
        (
            (
                "self.num_local_kv_heads = max(1, num_kv_heads // tp.size)",
                "self.num_local_kv_heads = num_kv_heads // tp.size",
            ),
        ),
        must_fail=("qkv_replicates_kv_heads",),
        hint="KV heads not replicated",
        why="with tp > num_kv_heads a rank gets 0 KV heads",
    ),
    Mutant(
        "kv_head_past_the_checkpoint",
        STEM,
        (
            (
                "        head = tp.rank * self.num_kv_heads // tp.size\n",
                "        head = tp.rank * self.num_local_kv_heads\n",
            ),
        ),
        must_fail=("qkv_replicates_kv_heads",),
        hint="past the checkpoint's KV heads",
        why="the replicated KV head counted as rank * local heads: rank 1 of 2 reads KV head 1 of 1",
    ),
    Mutant(
        "ids_not_shifted",
        STEM,
        (("        local = ids - self.start\n", "        local = ids\n"),),
        must_fail=("vocab_parallel_embedding", "engine_tp2_llama"),
        hint="ids not shifted to the local range",
        why="rank 1 looks its ids up as if it held the first rows of the vocabulary",
    ),
    Mutant(
        "rows_not_zeroed",
        STEM,
        (("        rows = rows * mine.unsqueeze(-1).to(rows.dtype)\n", ""),),
        must_fail=("vocab_parallel_embedding",),
        hint="rows not zeroed",
        why="an id another rank owns reads this rank's row 0, which the all-reduce adds to its row",
    ),
    Mutant(
        "row_without_all_reduce",
        STEM,
        (("        y = all_reduce(partial)\n", "        y = partial\n"),),
        must_fail=("row_parallel_on_2_ranks", "row_parallel_bias_once"),
        hint="only its partial product",
        why="each rank returns its partial product: the sum over ranks never happens",
    ),
    Mutant(
        "row_all_reduce_twice",
        STEM,
        (("        y = all_reduce(partial)\n", "        y = all_reduce(all_reduce(partial))\n"),),
        must_fail=("row_parallel_on_2_ranks",),
        hint="the all-reduce done twice",
        why="the summed result is summed again: tp times the answer",
    ),
    Mutant(
        "embedding_without_all_reduce",
        STEM,
        (("        return all_reduce(rows)\n", "        return rows\n"),),
        must_fail=("vocab_parallel_embedding",),
        hint="only its own ids' rows",
        why="each rank keeps the rows of its own ids and zeros for the rest",
    ),
    Mutant(
        "vocab_rounded_down",
        STEM,
        (
            (
                "self.local_vocab = (vocab_size + tp.size - 1) // tp.size",
                "self.local_vocab = vocab_size // tp.size",
            ),
        ),
        must_fail=("vocab_parallel_embedding", "lm_head_gathers_logits"),
        hint="the shard rounded down",
        why="with 11 ids over 2 ranks id 10 belongs to nobody",
    ),
    Mutant(
        "logits_not_gathered",
        STEM,
        (
            (
                "        return all_gather(local, dim=-1)[:, : self.vocab_size]\n",
                "        return local[:, : self.vocab_size]\n",
            ),
        ),
        must_fail=("lm_head_gathers_logits",),
        hint="the logits not gathered",
        why="each rank returns the logits of its own slice of the vocabulary",
    ),
    Mutant(
        "padding_not_cut",
        STEM,
        (
            (
                "        return all_gather(local, dim=-1)[:, : self.vocab_size]\n",
                "        return all_gather(local, dim=-1)\n",
            ),
        ),
        must_fail=("lm_head_gathers_logits",),
        hint="the padding not cut",
        why="the padded vocabulary's extra logits reach the sampler",
    ),
]

# the same layers written another way: masked_fill for the mask, math.ceil, narrow() for the rows
EQUIVALENT = Mutant(
    "equivalent",
    STEM,
    (
        (
            "        mine = (local >= 0) & (local < self.local_vocab)\n"
            "        rows = F.embedding(torch.where(mine, local, torch.zeros_like(local)), self.weight)\n"
            "        rows = rows * mine.unsqueeze(-1).to(rows.dtype)\n",
            "        outside = (local < 0) | (local >= self.local_vocab)\n"
            "        rows = F.embedding(local.masked_fill(outside, 0), self.weight)\n"
            "        rows = rows.masked_fill(outside[:, None], 0.0)\n",
        ),
        (
            "self.local_vocab = (vocab_size + tp.size - 1) // tp.size",
            "self.local_vocab = __import__('math').ceil(vocab_size / tp.size)",
        ),
        (
            '        _copy(param.data[at : at + self.local_sizes[shard]], rows, f"shard {shard}")\n',
            '        _copy(param.data.narrow(0, at, self.local_sizes[shard]), rows, f"shard {shard}")\n',
        ),
        (
            _ROW_FORWARD,
            "        y = all_reduce(x @ self.weight.T)\n        return y if self.bias is None else y + self.bias\n",
        ),
    ),
    must_fail=(),
)

HIDDEN_MUTANTS = [
    Mutant(
        "sizes_rounded_down",
        STEM,
        (
            (
                "        for n in out_sizes:\n"
                "            if n % tp.size:\n"
                '                raise ValueError(f"cannot split output features of size {n} over tp={tp.size}")\n',
                "",
            ),
        ),
        must_fail=("sizes_that_do_not_divide",),
        why="8 features over 3 ranks become 2 each: 2 features silently dropped",
    ),
    Mutant(
        "kv_head_rank_mod",
        STEM,
        (
            (
                "        head = tp.rank * self.num_kv_heads // tp.size\n",
                "        head = tp.rank % self.num_kv_heads\n",
            ),
        ),
        must_fail=("kv_heads_at_tp4",),
        why="at tp=4 with 2 KV heads rank 1 takes KV head 1, but its query heads 2, 3 attend with head 0",
    ),
]
