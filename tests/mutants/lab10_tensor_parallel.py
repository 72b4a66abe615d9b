"""Broken variants of solutions/lab10_tensor_parallel.py: one per pitfall its docstring names, one of each kind
of ``mutants.KINDS``, a correct one written another way (``EQUIVALENT``), and two that the hidden tests catch
(``HIDDEN_MUTANTS``: a fused size that does not divide by tp silently rounded down, and the replicated KV
head picked as ``rank % num_kv_heads``, which agrees with ``rank * num_kv_heads // tp`` at tp=2 with 1 or 2
KV heads, the only cases the 2-rank tests and the tiny models reach). Both once lost only hidden points; the
visible tests now play the ranks of tp=3 and tp=4 in-process and catch them too."""

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

_SIZES_CHECK = (
    "        for n in out_sizes:\n"
    "            if n % tp.size:\n"
    '                raise ValueError(f"cannot split output features of size {n} over tp={tp.size}")\n'
)
_KV_HEAD = "        head = tp.rank * self.num_kv_heads // tp.size\n"

MUTANTS = [
    Mutant(
        "bias_on_every_rank",
        STEM,
        ((_ROW_FORWARD, "        return all_reduce(F.linear(x, self.weight, self.bias))\n"),),
        must_fail=("row_parallel_bias_once",),
        hint="bias added on every rank",
        why="the bias added before the all-reduce, not after: the sum counts it tp times",
        kind="order",
    ),
    Mutant(
        "first_id_of_the_range_dropped",
        STEM,
        (
            (
                "        mine = (local >= 0) & (local < self.local_vocab)\n",
                "        mine = (local > 0) & (local < self.local_vocab)\n",
            ),
        ),
        must_fail=("single_rank_layers", "vocab_parallel_embedding"),
        hint=">= 0, not > 0",
        why="local > 0 for >= 0: the id at the start of each rank's range (id == start) is nobody's",
        kind="boundary",
    ),
    Mutant(
        "sizes_checked_by_their_sum",
        STEM,
        (
            (
                _SIZES_CHECK,
                "        if sum(out_sizes) % tp.size:\n"
                '            raise ValueError(f"cannot split output features of size {out_sizes} over tp={tp.size}")\n',
            ),
        ),
        must_fail=("merged_column_refuses_a_size_that_does_not_divide",),
        hint="their sum",
        why="the sum of the fused sizes checked, not each: [7, 5] at tp=2 builds with 3 + 2 rows, features dropped",
        kind="each_part",
    ),
    Mutant(
        "only_the_first_size_checked",
        STEM,
        (
            (
                "        for n in out_sizes:\n            if n % tp.size:\n",
                "        for n in out_sizes[:1]:\n            if n % tp.size:\n",
            ),
        ),
        must_fail=("merged_column_refuses_a_size_that_does_not_divide",),
        hint="the first size",
        why="only gate's size checked: [6, 5] at tp=2 builds, up's odd size rounded down",
        kind="one_argument",
    ),
    Mutant(
        "alias_of_the_engine",
        STEM,
        (
            (
                "# the seam: what the engine builds its decoder from when the grader picks this lab's layers\n",
                "from minisgl.layers.linear import RowParallelLinear  # noqa: E402, F811\n\n"
                "# the seam: what the engine builds its decoder from when the grader picks this lab's layers\n",
            ),
        ),
        must_fail=("single_rank_layers", "row_parallel_on_2_ranks"),
        hint="the engine's own",
        why="the lab's RowParallelLinear rebound to the engine's",
        kind="engine_reference",
    ),
    Mutant(
        "derives_from_the_engine",
        STEM,
        (
            (
                "from minisgl.layers import TPLayers\n",
                "from minisgl.layers import TPLayers\n"
                "from minisgl.layers.embedding import VocabParallelEmbedding as _Engine\n",
            ),
            ("class VocabParallelEmbedding(nn.Module):\n", "class VocabParallelEmbedding(_Engine):\n"),
        ),
        must_fail=("single_rank_layers", "vocab_parallel_embedding"),
        hint="the engine's own",
        why="the lab's embedding (and the LM head on it) derives from the engine's VocabParallelEmbedding",
        kind="engine_reference",
    ),
    Mutant(
        "kv_head_by_rank_mod",
        STEM,
        ((_KV_HEAD, "        head = tp.rank % self.num_kv_heads\n"),),
        must_fail=("qkv_kv_heads_on_each_rank", "kv_heads_at_tp4"),
        hint="not r % num_kv_heads",
        why="at tp=4 with 2 KV heads rank 1 takes KV head 1, but its query heads 2, 3 attend with head 0 (once "
        "only the hidden tests played tp=4)",
        kind="visible_on_cpu",
    ),
    Mutant(
        "padding_rows_not_zeroed",
        STEM,
        (("        param.data.zero_()\n", ""),),
        must_fail=("embedding_shards_on_each_rank",),
        hint="padding rows left as they were",
        why="the last shard's rows past the vocabulary keep torch.empty's garbage (harmless in a forward, against "
        "the contract: once only a hidden test compared the shard)",
        kind="visible_on_cpu",
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
        must_fail=("qkv_kv_heads_on_each_rank", "qkv_replicates_kv_heads"),
        hint="KV heads not replicated",
        why="with tp > num_kv_heads a rank gets 0 KV heads",
    ),
    Mutant(
        "kv_head_past_the_checkpoint",
        STEM,
        (
            (
                _KV_HEAD,
                "        head = tp.rank * self.num_local_kv_heads\n",
            ),
        ),
        must_fail=("qkv_kv_heads_on_each_rank", "qkv_replicates_kv_heads"),
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
    Mutant(
        "qkv_heads_rounded_down",
        STEM,
        (
            (
                "        if num_heads % tp.size:\n"
                '            raise ValueError(f"cannot split {num_heads} attention heads over tp={tp.size}")\n',
                "",
            ),
        ),
        must_fail=("heads_and_input_features_that_do_not_divide",),
        hint="raise ValueError when a size does not divide",
        why="query heads that do not divide by tp are rounded down: the last heads belong to no rank",
    ),
    Mutant(
        "row_features_rounded_down",
        STEM,
        (
            (
                "        if in_features % tp.size:\n"
                "            raise ValueError("
                'f"cannot split input features of size {in_features} over tp={tp.size}")\n',
                "",
            ),
        ),
        must_fail=("heads_and_input_features_that_do_not_divide",),
        hint="raise ValueError when a size does not divide",
        why="input features that do not divide by tp are rounded down: the last features are never multiplied",
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
        ((_SIZES_CHECK, ""),),
        must_fail=("sizes_that_do_not_divide",),
        why="8 features over 3 ranks become 2 each: 2 features silently dropped",
    ),
    Mutant(
        "kv_head_rank_mod",
        STEM,
        ((_KV_HEAD, "        head = tp.rank % self.num_kv_heads\n"),),
        must_fail=("kv_heads_at_tp4",),
        why="at tp=4 with 2 KV heads rank 1 takes KV head 1, but its query heads 2, 3 attend with head 0",
    ),
]
