"""Broken variants of solutions/lab13_jit_kernel.py (paged decode attention in C++): one per pitfall its
docstring names and one of each kind of hole (``mutants.KINDS``; each C++ edit is a new source, so each
mutant compiles once, a few seconds), a correct one written another way (``EQUIVALENT``), and two that
only the hidden tests catch (``HIDDEN_MUTANTS``)."""

from mutants import Mutant

STEM = "lab13_jit_kernel"

# every fixed test of the kernel's math -> the randomized test, which must fail with it
RANDOMIZED = {
    name: "random_batches_match_torch"
    for name in (
        "docstring_example",
        "padding_is_not_attended",
        "grouped_query_heads",
        "each_request_its_own_slots",
        "large_scores",
        "strided_q",
        "boundary_lengths",
        "bfloat16",
    )
}

LENS_CHECK = "    if (lp[b] < 1 || lp[b] > Lmax) TVM_FFI_THROW(ValueError)"
SLOT_CHECK = "      if (sp[b * Lmax + j] < 0 || sp[b * Lmax + j] >= S) TVM_FFI_THROW(ValueError)"
WRAPPER = "    build().paged_decode(q, k_pool, v_pool, slots, lens, out, scale)\n"

MUTANTS = [
    Mutant(
        "attends_to_the_padding",
        STEM,
        (("    const int64_t L = first<int32_t>(lens)[b];", "    const int64_t L = Lmax;"),),
        must_fail=("padding_is_not_attended", "random_batches_match_torch", "engine_with_your_kernel"),
        hint="padding: your kernel attended over all",
        why="every slot of the row is attended, the padding past lens[b] too",
    ),
    Mutant(
        "kv_head_modulo",
        STEM,
        (("const int64_t g = h / (H / Hkv);", "const int64_t g = h % Hkv;"),),
        must_fail=("grouped_query_heads", "random_batches_match_torch", "engine_with_your_kernel"),
        hint="you used h % Hkv",
        why="query head h reads KV head h % Hkv: the heads of one group are spread over the KV heads",
    ),
    Mutant(
        "softmax_without_the_maximum",
        STEM,
        (("std::exp(s[j] - m)", "std::exp(s[j])"),),
        must_fail=("large_scores", "random_batches_match_torch"),
        hint="subtract each row's maximum",
        why="exp of the raw scores: a score past 89 overflows to inf, and inf / inf is NaN",
    ),
    Mutant(
        "out_written_at_q_strides",
        STEM,
        (
            (
                "      T* o = first<T>(out) + (b * H + h) * D;\n"
                "      for (int64_t d = 0; d < D; ++d) put(o + d, acc[d] / sum);\n",
                "      T* o = first<T>(out) + b * q.stride(0) + h * q.stride(1);\n"
                "      for (int64_t d = 0; d < D; ++d) put(o + d * q.stride(2), acc[d] / sum);\n",
            ),
        ),
        must_fail=("strided_q", "random_batches_match_torch"),
        hint="values outside out",
        why="out written at q's strides: with q a view of wider qkv rows the writes run past out's end (once a "
        "bare SIGABRT, 'double free or corruption'), with a head-major q they land in the wrong places",
    ),
    Mutant(
        "q_read_as_contiguous",
        STEM,
        (("first<T>(q) + b * q.stride(0) + h * q.stride(1);", "first<T>(q) + (b * H + h) * D;"),),
        must_fail=("strided_q", "random_batches_match_torch"),
        hint="q's strides",
        why="q read as a contiguous [B, H, D]: a view into fused qkv rows, or head-major, reads the wrong elements",
    ),
    Mutant(
        "one_slot_row_for_all",
        STEM,
        (
            ("const T* kr = kp + (sp[b * Lmax + j] * Hkv + g) * D;", "const T* kr = kp + (sp[j] * Hkv + g) * D;"),
            ("const T* vr = vp + (sp[b * Lmax + j] * Hkv + g) * D;", "const T* vr = vp + (sp[j] * Hkv + g) * D;"),
        ),
        must_fail=("each_request_its_own_slots", "random_batches_match_torch", "engine_with_your_kernel"),
        hint="one slot row for all",
        why="every request reads row 0 of slots",
    ),
    Mutant(
        "torch_in_the_wrapper",
        STEM,
        (
            (
                WRAPPER,
                "    keys, values = k_pool[slots], v_pool[slots]  # [B, L, Hkv, D]: the gather\n"
                "    B, H, D = q.shape\n"
                "    qg = q.reshape(B, k_pool.shape[1], H // k_pool.shape[1], D).float()\n"
                '    s = torch.einsum("bgxd,blgd->bgxl", qg, keys.float()) * scale\n'
                "    s = s.masked_fill(torch.arange(slots.shape[1]) >= lens[:, None, None, None], float('-inf'))\n"
                '    o = torch.einsum("bgxl,blgd->bgxd", s.softmax(-1), values.float())\n'
                "    out.copy_(o.reshape(B, H, D))\n",
            ),
        ),
        # its indexing raises on the out-of-range slots of the bounds test; the speed test compares with
        # scaled_dot_product_attention on the gathered rows, which this einsum does not beat
        must_fail=("lengths_and_slots_at_their_bounds", "faster_than_torch"),
        hint="IndexError",
        why="the wrapper computes the attention with torch (indexing the pool with slots it never checked)",
    ),
    Mutant(
        "cpp_syntax_error",
        STEM,
        (
            (
                "  attend<uint16_t>(q, k, v, slots, lens, out, static_cast<float>(scale));\n}",
                "  attend<uint16_t>(q, k, v, slots, lens, out, static_cast<float>(scale))\n}",
            ),
        ),
        must_fail=("docstring_example", "bfloat16", "random_batches_match_torch", "engine_with_your_kernel"),
        hint="your C++ source did not compile",
        why="a missing ';': every test fails with the compiler's first error, none crashes the grader",
    ),
    Mutant(
        "lens_bound_exclusive",
        STEM,
        ((LENS_CHECK, "    if (lp[b] < 1 || lp[b] >= Lmax) TVM_FFI_THROW(ValueError)"),),
        must_fail=("lengths_and_slots_at_their_bounds",),
        hint="1 <= lens[b] <= Lmax",
        why="lens[b] == Lmax refused where the contract allows it (a row filled to Lmax)",
        kind="boundary",
    ),
    Mutant(
        "dtype_of_v_unchecked",
        STEM,
        (
            (
                "if (k.dtype() != dt || v.dtype() != dt || out.dtype() != dt)",
                "if (k.dtype() != dt || out.dtype() != dt)",
            ),
        ),
        must_fail=("rejects_wrong_dtypes",),
        hint="each of k, v and out is checked on its own",
        why="v's dtype is not checked: a bfloat16 v is read as float32",
        kind="one_argument",
    ),
    Mutant(
        "last_slot_of_each_row_checked",
        STEM,
        (
            (
                "    for (int64_t j = 0; j < lp[b]; ++j)\n" + SLOT_CHECK,
                "    for (int64_t j = lp[b] - 1; j < lp[b]; ++j)\n" + SLOT_CHECK,
            ),
        ),
        must_fail=("lengths_and_slots_at_their_bounds",),
        hint="each slot j < lens[b] is in [0, S)",
        why="only the last slot a request reads is checked where each must be: a bad slot inside the row passes",
        kind="each_part",
    ),
    Mutant(
        "lengths_checked_while_attending",
        STEM,
        (
            (LENS_CHECK, "    if (false) TVM_FFI_THROW(ValueError)"),
            (
                "    const int64_t L = first<int32_t>(lens)[b];\n",
                "    const int64_t L = first<int32_t>(lens)[b];\n"
                '    if (L < 1 || L > Lmax) TVM_FFI_THROW(ValueError) << "lens[" << b << "] not in [1, Lmax]";\n',
            ),
        ),
        must_fail=("checks_before_writing",),
        hint="Check every length and slot first",
        why="lens[b] is checked in the attention loop: the earlier requests' outputs are written before it raises",
        kind="order",
    ),
    Mutant(
        "q_head_stride_assumed_visibly",
        STEM,
        (("first<T>(q) + b * q.stride(0) + h * q.stride(1);", "first<T>(q) + b * q.stride(0) + h * D;"),),
        must_fail=("strided_q", "random_batches_match_torch"),
        hint="with head h at h * D",
        why="heads assumed adjacent inside a request's row (right for the engine's qkv rows, wrong head-major)",
        kind="visible_on_cpu",
    ),
    Mutant(
        "the_engines_kernel",
        STEM,
        (
            (
                WRAPPER,
                "    from minisgl.kernels.paged_attention import paged_decode_attention_cpp\n\n"
                "    return paged_decode_attention_cpp(q, k_pool, v_pool, slots, lens, scale)\n",
            ),
        ),
        must_fail=("docstring_example", "random_batches_match_torch"),
        hint="the engine's own",
        why="the wrapper calls the engine's C++ kernel",
        kind="engine_reference",
    ),
    Mutant(
        "the_engines_source_compiled",
        STEM,
        (
            (
                "        _BUILT[source] = tvm_ffi.cpp.load_inline(\n"
                '            NAME, cpp_sources=source, functions=["paged_decode"], extra_cflags=CFLAGS\n'
                "        )\n",
                "        from pathlib import Path\n\n"
                "        import minisgl.kernels\n\n"
                '        csrc = Path(minisgl.kernels.__file__).parent / "csrc"\n'
                '        glue = "void paged_decode(TensorView q, TensorView k, TensorView v, "\n'
                '        glue += "TensorView s, TensorView l, "\n'
                '        glue += "TensorView o, double sc) { paged_decode_attention(q, k, v, s, l, o, sc, 1); }"\n'
                "        _BUILT[source] = tvm_ffi.cpp.load_inline(\n"
                "            NAME + '_engine',\n"
                "            cpp_sources=(csrc / 'paged_decode.cc').read_text() + glue,\n"
                '            functions=["paged_decode"],\n'
                "            extra_cflags=CFLAGS,\n"
                "            extra_include_paths=[str(csrc)],\n"
                "        )\n",
            ),
        ),
        must_fail=("docstring_example", "random_batches_match_torch"),
        hint="your build compiles or loads the engine's own C++",
        why="build() compiles the engine's paged_decode.cc (and a line of glue) instead of cpp_source()",
        kind="engine_reference",
    ),
]

EQUIVALENT = Mutant(
    "lab13_written_differently",
    STEM,
    (
        (  # the normalisation folded into the weights; q made contiguous in Python (a copy of q only)
            "sum += (s[j] = std::exp(s[j] - m));",
            "sum += (s[j] = std::exp(s[j] - m));\n      for (int64_t j = 0; j < L; ++j) s[j] /= sum;",
        ),
        ("put(o + d, acc[d] / sum);", "put(o + d, acc[d]);"),
        (WRAPPER, "    build().paged_decode(q.contiguous(), k_pool, v_pool, slots, lens, out, scale)\n"),
        ("    out = torch.empty(q.shape, dtype=q.dtype)\n", "    out = q.new_empty(q.shape)\n"),
    ),
    must_fail=(),
)

HIDDEN_MUTANTS = [
    Mutant(
        "head_dim_in_blocks_of_16",
        STEM,
        (
            (
                "        for (int64_t d = 0; d < D; ++d) dot += qf[d] * to_f(kr[d]);",
                "        for (int64_t d = 0; d < D / 16 * 16; ++d) dot += qf[d] * to_f(kr[d]);",
            ),
            (
                "        for (int64_t d = 0; d < D; ++d) acc[d] += w * to_f(vr[d]);",
                "        for (int64_t d = 0; d < D / 16 * 16; ++d) acc[d] += w * to_f(vr[d]);",
            ),
        ),
        must_fail=("head_dims_80_and_128",),
        why="the head dimension handled in blocks of 16 with the remainder dropped: every visible head_dim is "
        "16, 32 or 64",
    ),
    Mutant(
        "q_last_stride_assumed",
        STEM,
        (("qf[d] = to_f(qh[d * q.stride(2)]) * scale;", "qf[d] = to_f(qh[d]) * scale;"),),
        must_fail=("q_any_strides",),
        why="q's elements assumed adjacent inside a head (stride(2) == 1), as in every visible layout",
    ),
]
