"""Broken variants of solutions/lab13_jit_kernel.py: one per pitfall its docstring names (each C++ edit
is a new source, so each mutant compiles once, ~2 s), a correct one written another way
(``EQUIVALENT``), and two that pass every visible test and fail a hidden one (``HIDDEN_MUTANTS``)."""

from mutants import Mutant

STEM = "lab13_jit_kernel"

# every fixed test of the compare -> the randomized test, which must fail with it
RANDOMIZED = {
    name: "random_arrays_match_python"
    for name in (
        "docstring_examples",
        "empty_arrays",
        "full_match",
        "mismatch_at_zero",
        "mismatch_at_the_last_element",
        "stops_at_the_shorter_array",
        "large_token_ids",
        "strided_views",
    )
}

CONTIGUOUS_LOOP = "    while (i < n && pa[i] == pb[i]) ++i;"
STRIDED_LOOP = "    while (i < n && pa[i * sa] == pb[i * sb]) ++i;"

MUTANTS = [
    Mutant(
        "stops_one_short",
        STEM,
        (
            (CONTIGUOUS_LOOP, "    while (i + 1 < n && pa[i] == pb[i]) ++i;"),
            (STRIDED_LOOP, "    while (i + 1 < n && pa[i * sa] == pb[i * sb]) ++i;"),
        ),
        must_fail=("full_match", "docstring_examples", "random_arrays_match_python", "engine_with_your_kernel"),
        hint="off by one at the end: the arrays agree on every element",
        why="the loop bound is n - 1: a full match comes out one short",
    ),
    Mutant(
        "counts_the_mismatch",
        STEM,
        (("  return i;\n}", "  return i < n ? i + 1 : i;\n}"),),
        must_fail=(
            "docstring_examples",
            "mismatch_at_zero",
            "mismatch_at_the_last_element",
            "random_arrays_match_python",
            "engine_with_your_kernel",
        ),
        hint="the count includes the first mismatching element",
        why="the first differing element is counted as shared",
    ),
    Mutant(
        "reads_past_the_shorter_array",
        STEM,
        (("const int64_t n = a.size(0) < b.size(0) ? a.size(0) : b.size(0);", "const int64_t n = a.size(0);"),),
        must_fail=("stops_at_the_shorter_array", "random_arrays_match_python"),
        hint="reading past the shorter array",
        why="the loop bound is a's length only: a shorter b is read past its end",
    ),
    Mutant(
        "int32_token_ids",
        STEM,
        (
            (
                CONTIGUOUS_LOOP,
                "    while (i < n && static_cast<int32_t>(pa[i]) == static_cast<int32_t>(pb[i])) ++i;",
            ),
            (
                STRIDED_LOOP,
                "    while (i < n && static_cast<int32_t>(pa[i * sa]) == static_cast<int32_t>(pb[i * sb])) ++i;",
            ),
        ),
        must_fail=("large_token_ids", "random_arrays_match_python"),
        hint="int32 token ids",
        why="ids are compared as int32: ids that differ only above bit 31 look equal",
    ),
    Mutant(
        "assumes_contiguous",
        STEM,
        ((STRIDED_LOOP, "    while (i < n && pa[i] == pb[i]) ++i;"),),
        must_fail=("strided_views", "random_arrays_match_python"),
        hint="strides: these tensors are not contiguous",
        why="strides ignored: x[::2] is read as x[:n]",
    ),
    Mutant(
        "full_match_returns_a_sentinel",
        STEM,
        (("  return i;\n}", "  return i == n ? -1 : i;  // -1: no mismatch found\n}"),),
        must_fail=(
            "full_match",
            "docstring_examples",
            "empty_arrays",
            "random_arrays_match_python",
            "engine_with_your_kernel",
        ),
        hint="looks like a 'not found' sentinel",
        why="no mismatch returns -1 (like a find) instead of the shorter length",
    ),
    Mutant(
        "no_dtype_check",
        STEM,
        (
            (
                '  if (a.dtype() != i64 || b.dtype() != i64) TVM_FFI_THROW(TypeError) << "prefix_len takes int64 '
                'tensors";\n',
                "",
            ),
        ),
        must_fail=("rejects_other_dtypes",),
        hint="dtype: check",
        why="an int32 or float tensor is read as int64: nonsense instead of an error",
    ),
    Mutant(
        "python_loop",
        STEM,
        (
            (
                "    return int(build().prefix_len(a, b))\n",
                "    build()\n    x, y = a.tolist(), b.tolist()\n    i = 0\n"
                "    while i < min(len(x), len(y)) and x[i] == y[i]:\n        i += 1\n    return i\n",
            ),
        ),
        must_fail=("faster_than_python",),
        hint="speed:",
        why="the compare runs in Python over .tolist(): correct, and no faster than the engine's Python",
    ),
    Mutant(
        "cpp_syntax_error",
        STEM,
        (("  return i;\n}", "  return i\n}"),),
        must_fail=(
            "docstring_examples",
            "empty_arrays",
            "full_match",
            "random_arrays_match_python",
            "engine_with_your_kernel",
        ),
        hint="your C++ source did not compile",
        why="a missing ';': every test fails with the compiler's first error, none crashes the grader",
    ),
]

EQUIVALENT = Mutant(
    "lab13_written_differently",
    STEM,
    (
        (  # the wrapper makes the inputs contiguous; the C++ side then needs one loop (std::mismatch)
            "  if (sa == 1 && sb == 1) {\n" + CONTIGUOUS_LOOP + "  // the common case: contiguous keys\n"
            "  } else {\n" + STRIDED_LOOP + "\n  }\n",
            "  i = std::mismatch(pa, pa + n, pb).first - pa;\n",
        ),
        ("#include <cstdint>\n", "#include <algorithm>\n#include <cstdint>\n"),
        (
            "    return int(build().prefix_len(a, b))\n",
            "    if a.dtype != torch.int64 or b.dtype != torch.int64:\n"
            '        raise TypeError("prefix_len takes int64 tensors")\n'
            "    return build().prefix_len(a.contiguous(), b.contiguous())\n",
        ),
    ),
    must_fail=(),
)

HIDDEN_MUTANTS = [
    Mutant(
        "one_stride_for_both",
        STEM,
        ((STRIDED_LOOP, "    while (i < n && pa[i * sa] == pb[i * sa]) ++i;"),),
        must_fail=("each_tensor_its_own_stride", "broadcast_tensor"),
        why="a's stride used for b too: right whenever both have the same layout, as in every visible test",
    ),
    Mutant(
        "fast_path_checks_only_a",
        STEM,
        (("  if (sa == 1 && sb == 1) {", "  if (sa == 1) {"),),
        must_fail=("each_tensor_its_own_stride",),
        why="the contiguous loop runs when a alone is contiguous: a strided b is then read as contiguous",
    ),
]
