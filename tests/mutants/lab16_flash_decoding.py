"""Broken variants of solutions/lab16_flash_decoding.py (flash-decoding in Triton): one per pitfall its
docstring names and one of each kind of hole (``mutants.KINDS``), a correct one written another way
(``EQUIVALENT``: one program per query head, no ``tl.dot``, base-2 exponentials inside, parts of whole key
blocks, a merge that walks the parts one by one), and the ones only the hidden tests catch."""

from mutants import Mutant

STEM = "lab16_flash_decoding"

# every fixed test of the kernels' math -> the randomized test, which must fail with it
RANDOMIZED = {
    name: "random_batches_match_torch"
    for name in (
        "docstring_examples",
        "merge_weighs_parts_by_their_lse",
        "merge_leaves_empty_parts_out",
        "merge_with_large_lse",
        "partial_buffers",
        "grouped_query_heads",
        "scattered_pages_and_table_rows",
        "ragged_lengths_and_part_counts",
        "large_scores",
        "rising_scores",
        "past_the_length_is_not_attended",
        "bfloat16",
        "strided_q_and_a_given_out",
    )
}

LENS_CHECK = (
    "    if tuple(rows.shape) != (bsz,) or tuple(lens.shape) != (bsz,):\n"
    '        raise ValueError(f"rows {tuple(rows.shape)} and lens {tuple(lens.shape)} must be [{bsz}]")\n'
)
ONE_PART = (
    '    if splits {} 1:\n        raise ValueError(f"splits must be at least 1, not {{splits}}")\n'
    + "    if out is not None:"
)
LAUNCH_END = "    if splits > 1:\n        merge(part, lse, out, splits)\n    return out\n"

MUTANTS = [
    Mutant(
        "attends_the_whole_row",
        STEM,
        (("    n_keys = tl.load(lens_ptr + req)\n", "    n_keys = table_stride + 0 * tl.load(lens_ptr + req)\n"),),
        must_fail=("past_the_length_is_not_attended", "random_batches_match_torch", "engine_with_your_kernel"),
        hint="past the length",
        why="every position of the page-table row is attended (its width, not lens[b])",
    ),
    Mutant(
        "one_table_row_for_all",
        STEM,
        (
            (
                "table_row = table_ptr + tl.load(rows_ptr + req).to(tl.int64) * table_stride",
                "table_row = table_ptr + req.to(tl.int64) * table_stride",
            ),
        ),
        must_fail=("scattered_pages_and_table_rows", "random_batches_match_torch"),
        hint="one page-table row for all",
        why="request b reads row b of the page table instead of rows[b]",
    ),
    Mutant(
        "kv_head_modulo",
        STEM,
        (("    heads = kv * GROUP + g_off\n", "    heads = g_off * (HEADS // GROUP) + kv\n"),),
        must_fail=("grouped_query_heads", "random_batches_match_torch", "engine_with_your_kernel"),
        hint="you used h % KV",
        why="KV head g serves query heads g, g + KV, ... (h % KV) instead of the group g * H/KV ...",
    ),
    Mutant(
        "softmax_without_the_maximum",
        STEM,
        (
            (
                "        new_max = tl.maximum(run_max, tl.max(scores, axis=1))\n",
                "        new_max = tl.maximum(run_max, 0.0 * tl.max(scores, axis=1))\n",
            ),
        ),
        must_fail=("large_scores", "random_batches_match_torch"),
        hint="the softmax without its running maximum",
        why="exp of the raw scores (the running maximum stays 0): a score past 89 overflows to inf",
    ),
    Mutant(
        "accumulator_not_rescaled",
        STEM,
        (
            (
                "        acc = acc * factor[:, None] + dot(weights.to(vals.dtype), vals, EXACT)\n",
                "        acc = acc + dot(weights.to(vals.dtype), vals, EXACT)\n",
            ),
        ),
        must_fail=("rising_scores", "random_batches_match_torch"),
        hint="rescaled whenever the running maximum grows",
        why="the accumulated values keep the old maximum's scale when a later block raises it",
    ),
    Mutant(
        "parts_drop_the_remainder",
        STEM,
        (("    share = tl.cdiv(n_keys, SPLITS)\n", "    share = n_keys // SPLITS\n"),),
        must_fail=("ragged_lengths_and_part_counts", "partial_buffers", "random_batches_match_torch"),
        hint="none dropped where",
        why="each part takes length // splits keys: the last length % splits keys belong to no part",
    ),
    Mutant(
        "parts_read_past_their_end",
        STEM,
        (("    stop = tl.minimum(first + share, n_keys)\n", "    stop = n_keys\n"),),
        must_fail=("ragged_lengths_and_part_counts", "partial_buffers", "random_batches_match_torch"),
        hint="none read past its own end",
        why="each part runs to the request's last key: keys after its own range are counted twice",
    ),
    Mutant(
        "empty_part_writes_no_lse",
        STEM,
        (
            (
                'tl.where(some, run_max + tl.log(run_sum), float("-inf")), mask=real)',
                "run_max + tl.log(run_sum), mask=real & some)",
            ),
        ),
        must_fail=("partial_buffers", "random_batches_match_torch"),
        hint="an empty part must write lse = -inf",
        why="a part with no keys writes nothing into lse (a buffer that was not -inf there misleads the merge)",
    ),
    Mutant(
        "merge_lets_empty_parts_in",
        STEM,
        (
            (
                "dims[None, :], mask=used[:, None], other=0.0)",
                "dims[None, :], mask=(i < SPLITS)[:, None], other=0.0)",
            ),
        ),
        must_fail=("merge_leaves_empty_parts_out", "random_batches_match_torch"),
        hint="your merge let it into the sum",
        why="the merge loads every part's row, NaN of an empty part included (weight 0 times NaN is NaN)",
    ),
    Mutant(
        "merge_without_the_maximum",
        STEM,
        (
            (
                "weight = tl.where(used, tl.exp(sums - tl.max(sums, axis=0)), 0.0)",
                "weight = tl.where(used, tl.exp(sums), 0.0)",
            ),
        ),
        must_fail=("merge_with_large_lse", "random_batches_match_torch"),
        hint="the merge without the maximum",
        why="each part weighed by exp(lse): overflows past lse 88, underflows below -103",
    ),
    Mutant(
        "lse_in_base_two",
        STEM,
        (
            (
                'tl.where(some, run_max + tl.log(run_sum), float("-inf"))',
                'tl.where(some, (run_max + tl.log(run_sum)) * 1.4426950408889634, float("-inf"))',
            ),
            (
                "weight = tl.where(used, tl.exp(sums - tl.max(sums, axis=0)), 0.0)",
                "weight = tl.where(used, tl.exp2(sums - tl.max(sums, axis=0)), 0.0)",
            ),
        ),
        must_fail=("partial_buffers", "merge_weighs_parts_by_their_lse", "random_batches_match_torch"),
        hint="the log-sum-exp in base 2",
        why="lse written in base 2 and merged in base 2: decode's output is right, the partial contract is not",
    ),
    Mutant(
        "q_read_as_contiguous",
        STEM,
        (
            (
                "q_ptr + req * q_stride_b + heads[:, None] * q_stride_h + dims[None, :]",
                "q_ptr + (req * HEADS + heads[:, None]) * HEAD_DIM + dims[None, :]",
            ),
        ),
        must_fail=("strided_q_and_a_given_out", "random_batches_match_torch"),
        hint="q's strides",
        why="q read as a contiguous [B, H, D]: the engine's view into the fused qkv rows reads the wrong elements",
    ),
    Mutant(
        "given_out_not_written",
        STEM,
        (
            (
                "    if out is None:\n        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)\n",
                "    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)\n",
            ),
        ),
        must_fail=("strided_q_and_a_given_out", "partial_buffers", "random_batches_match_torch"),
        hint="write the given out in place",
        why="a new tensor every call: the out the caller passed stays as it was",
    ),
    Mutant(
        "one_part_through_the_buffers",
        STEM,
        (
            ("    if SPLITS == 1:\n        dst = out_ptr", "    if SPLITS == 0:\n        dst = out_ptr"),
            ("    if splits > 1 and partial is None:\n", "    if partial is None:\n"),
            ("    part, lse = partial if splits > 1 else (out, out)\n", "    part, lse = partial\n"),
            (LAUNCH_END, "    merge(part, lse, out, splits)\n    return out\n"),
        ),
        must_fail=("partial_buffers", "random_batches_match_torch"),
        hint="with splits == 1 nothing but out is written",
        why="one part also goes through the partial buffers and the merge: right, and it writes buffers it must not",
    ),
    Mutant(
        "merge_checks_nothing",
        STEM,
        (
            (
                "    if out.dim() != 3 or out.stride(2) != 1:\n"
                '        raise ValueError(f"out must be [B, H, D] with stride(2) == 1, got {tuple(out.shape)}")\n'
                "    if splits < 1:\n"
                '        raise ValueError(f"splits must be at least 1, not {splits}")\n'
                "    bsz, heads, dim = out.shape\n"
                "    check_partial((part, lse), bsz * heads * splits, dim)\n",
                "    bsz, heads, dim = out.shape\n",
            ),
        ),
        must_fail=("rejects_wrong_inputs",),
        hint="merge checks its own arguments",
        why="merge launches on whatever it is given (decode checked its buffers, but merge is called on its own too)",
    ),
    Mutant(
        "key_mask_lets_its_bound_in",
        STEM,
        (("        inside = j < stop\n", "        inside = j <= stop\n"),),
        must_fail=("past_the_length_is_not_attended", "random_batches_match_torch", "engine_with_your_kernel"),
        hint="one key past the last",
        why="each part also reads the key at its end bound: the next part's first key, or position lens[b]",
        kind="boundary",
    ),
    Mutant(
        "one_part_refused",
        STEM,
        (
            (
                ONE_PART.format("<"),
                ONE_PART.format("<="),
            ),
        ),
        must_fail=("checks_at_their_bounds",),
        hint="one part is valid",
        why="splits = 1 refused: the check's bound flipped (<= for <)",
        kind="boundary",
    ),
    Mutant(
        "dtype_of_v_unchecked",
        STEM,
        (("        if t.dtype != q.dtype:\n", '        if name == "k_slots" and t.dtype != q.dtype:\n'),),
        must_fail=("rejects_wrong_inputs",),
        hint="each of k_slots and v_slots is checked on its own",
        why="only k_slots' dtype is compared with q's: a bfloat16 v_slots is read as float32",
        kind="one_argument",
    ),
    Mutant(
        "out_checked_by_its_size",
        STEM,
        (
            (
                "        if out.shape != q.shape or out.stride(2) != 1:\n",
                "        if out.numel() != q.numel() or out.stride(2) != 1:\n",
            ),
        ),
        must_fail=("rejects_wrong_inputs",),
        hint="each dimension",
        why="out compared with q by its number of elements: an out of shape [B, D, H] passes",
        kind="each_part",
    ),
    Mutant(
        "lengths_checked_after_the_launch",
        STEM,
        (
            (LENS_CHECK, ""),
            (
                LAUNCH_END,
                "    if splits > 1:\n        merge(part, lse, out, splits)\n" + LENS_CHECK + "    return out\n",
            ),
        ),
        must_fail=("a_refused_call_writes_nothing",),
        hint="the order of the checks",
        why="rows and lens are checked after the kernels ran: a refused call has already written out",
        kind="order",
    ),
    Mutant(
        "q_head_stride_assumed",
        STEM,
        (
            (
                "q_ptr + req * q_stride_b + heads[:, None] * q_stride_h + dims[None, :]",
                "q_ptr + req * q_stride_b + heads[:, None] * HEAD_DIM + dims[None, :]",
            ),
        ),
        must_fail=("strided_q_and_a_given_out", "random_batches_match_torch"),
        hint="with head h at h * D",
        why="heads assumed adjacent in a request's row (right for the engine's qkv rows, wrong head-major)",
        kind="visible_on_cpu",
    ),
    Mutant(
        "the_engines_decode",
        STEM,
        (
            (
                "    check_decode(q, k_slots, v_slots, page_table, rows, lens, splits, out, partial)\n",
                "    from minisgl.kernels import triton_attention\n\n"
                "    args = (q, k_slots, v_slots, page_table, rows, lens, scale, splits, out, partial)\n"
                "    return triton_attention.decode(*args)\n",
            ),
        ),
        must_fail=("docstring_examples", "random_batches_match_torch"),
        hint="the engine's own",
        why="decode calls the engine's triton_attention.decode",
        kind="engine_reference",
    ),
]

SPLIT_BODY_START = "    req = tl.program_id(0)\n    kv = tl.program_id(1)\n    piece = tl.program_id(2)\n"
SPLIT_BODY_END = (
    '        tl.store(lse_ptr + entry, tl.where(some, run_max + tl.log(run_sum), float("-inf")), mask=real)\n'
)
_EQUIVALENT_SPLIT = """    # a program per request, QUERY head and part (no packing); base-2 exponentials; whole blocks
    req = tl.program_id(0)
    h = tl.program_id(1)
    piece = tl.program_id(2)
    kv = h // GROUP
    n_keys = tl.load(lens_ptr + req)
    row_base = table_ptr + tl.load(rows_ptr + req).to(tl.int64) * table_stride
    per = tl.cdiv(tl.cdiv(n_keys, SPLITS), BLOCK_N) * BLOCK_N
    lo = piece * per
    hi = tl.minimum(lo + per, n_keys)
    d = tl.arange(0, HEAD_DIM)
    qv = tl.load(q_ptr + req * q_stride_b + h * q_stride_h + d).to(tl.float32) * (scale * 1.4426950408889634)
    m2 = float("-inf")
    total = 0.0
    o = tl.zeros((HEAD_DIM,), tl.float32)
    for s0 in range(lo, hi, BLOCK_N):
        pos = s0 + tl.arange(0, BLOCK_N)
        ok = pos < hi
        slot = tl.load(row_base + pos, mask=ok, other=0).to(tl.int64)
        off = slot[:, None] * slot_stride + kv * HEAD_DIM + d[None, :]
        kb = tl.load(k_ptr + off, mask=ok[:, None], other=0.0).to(tl.float32)
        s2 = tl.where(ok, tl.sum(kb * qv[None, :], axis=1), float("-inf"))
        m_new = tl.maximum(m2, tl.max(s2, axis=0))
        p = tl.exp2(s2 - m_new)
        c = tl.exp2(m2 - m_new)
        vb = tl.load(v_ptr + off, mask=ok[:, None], other=0.0).to(tl.float32)
        o = o * c + tl.sum(p[:, None] * vb, axis=0)
        total = total * c + tl.sum(p, axis=0)
        m2 = m_new
    if SPLITS == 1:
        tl.store(out_ptr + req * out_stride_b + h * out_stride_h + d, (o / total).to(out_ptr.dtype.element_ty))
    else:
        at = (req * HEADS + h) * SPLITS + piece
        if total > 0:
            tl.store(part_ptr + at * HEAD_DIM + d, o / total)
            tl.store(lse_ptr + at, (m2 + tl.log2(total)) * 0.6931471805599453)
        else:
            tl.store(lse_ptr + at, float("-inf"))
"""
MERGE_BODY_START = (
    "    req = tl.program_id(0)\n    head = tl.program_id(1)\n    first = (req * HEADS + head) * SPLITS\n"
)
MERGE_BODY_END = (
    "    tl.store(out_ptr + req * out_stride_b + head * out_stride_h + dims, merged.to(out_ptr.dtype.element_ty))\n"
)
_EQUIVALENT_MERGE = """    # the parts one by one, as two online-softmax states are combined
    b = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, HEAD_DIM)
    top = float("-inf")
    den = 0.0
    num = tl.zeros((HEAD_DIM,), tl.float32)
    for i in range(SPLITS):
        at = (b * HEADS + h) * SPLITS + i
        li = tl.load(lse_ptr + at)
        if li > float("-inf"):
            new_top = tl.maximum(top, li)
            num = num * tl.exp(top - new_top) + tl.exp(li - new_top) * tl.load(part_ptr + at * HEAD_DIM + d)
            den = den * tl.exp(top - new_top) + tl.exp(li - new_top)
            top = new_top
    tl.store(out_ptr + b * out_stride_b + h * out_stride_h + d, (num / den).to(out_ptr.dtype.element_ty))
"""


def _region(start: str, end: str) -> str:
    """The text of the solution from ``start`` to the end of ``end`` (both exact, once)."""
    from mutants import SOLUTIONS

    text = (SOLUTIONS / f"{STEM}.py").read_text()
    i = text.index(start)
    return text[i : text.index(end, i) + len(end)]


EQUIVALENT = Mutant(
    "lab16_written_differently",
    STEM,
    (
        (_region(SPLIT_BODY_START, SPLIT_BODY_END), _EQUIVALENT_SPLIT),
        (_region(MERGE_BODY_START, MERGE_BODY_END), _EQUIVALENT_MERGE),
        ("    split_kernel[(bsz, kv_heads, splits)](\n", "    split_kernel[(bsz, heads, splits)](\n"),
        (
            "    if out is None:\n        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)\n",
            "    out = q.new_empty(q.shape) if out is None else out\n",
        ),
    ),
    must_fail=(),
)

HIDDEN_MUTANTS = [
    Mutant(
        "group_tile_not_padded",
        STEM,
        (("BLOCK_H=max(16, triton.next_power_of_2(group))", "BLOCK_H=group"),),
        must_fail=("groups_of_three_at_head_dim_64",),
        why="the group's query heads as a tile of exactly GROUP rows: tl.arange needs a power of two (9 over 3 fails)",
    ),
    Mutant(
        "merge_reads_at_most_16_parts",
        STEM,
        (("BLOCK_S=max(2, triton.next_power_of_2(splits))", "BLOCK_S=16"),),
        must_fail=("float16_many_parts_and_long_rows",),
        why="the merge's tile of parts fixed at 16: a request cut into 20 parts loses 4 of them",
    ),
    Mutant(
        "float16_refused",
        STEM,
        (("DTYPES = (torch.float32, torch.bfloat16, torch.float16)", "DTYPES = (torch.float32, torch.bfloat16)"),),
        must_fail=("float16_many_parts_and_long_rows",),
        why="float16 refused: the contract allows it, and every visible test is float32 or bfloat16",
    ),
]
