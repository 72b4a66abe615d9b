"""Broken variants of solutions/lab13_jit_kernel.py: one per pitfall its docstring names and one of each
kind of hole (``mutants.KINDS``; each C++ edit is a new source, so each mutant compiles once, ~2 s), a
correct one written another way (``EQUIVALENT``), and two that the hidden tests catch
(``HIDDEN_MUTANTS``). Both passed every visible test when they were written; visible tests catch them
now too (``fast_path_checks_only_a_visibly``, ``one_stride_for_both_visibly``)."""

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

_NDIM = '  if (a.ndim() != 1 || b.ndim() != 1) TVM_FFI_THROW(ValueError) << "prefix_len takes two 1-D tensors";\n'
_DTYPE = '  if (a.dtype() != i64 || b.dtype() != i64) TVM_FFI_THROW(TypeError) << "prefix_len takes int64 tensors";\n'

MUTANTS += [
    Mutant(
        "loop_bound_inclusive",
        STEM,
        (
            (CONTIGUOUS_LOOP, "    while (i <= n && pa[i] == pb[i]) ++i;"),
            (STRIDED_LOOP, "    while (i <= n && pa[i * sa] == pb[i * sb]) ++i;"),
        ),
        must_fail=("stops_at_the_shorter_array", "random_arrays_match_python"),
        hint="reading past the shorter array",
        why="i <= n where the contract says i <= min(len) for the answer, i < n for the elements read: the "
        "element past the shorter array is compared too",
        kind="boundary",
    ),
    Mutant(
        "ndim_zero_accepted",
        STEM,
        ((_NDIM, _NDIM.replace("a.ndim() != 1 || b.ndim() != 1", "a.ndim() > 1 || b.ndim() > 1")),),
        must_fail=("rejects_other_shapes",),
        hint="a 0-D tensor has no size(0)",
        why="ndim > 1 rejected where the contract says ndim == 1: a 0-D tensor reaches size(0), which raises "
        "IndexError",
        kind="boundary",
    ),
    Mutant(
        "dtype_checked_on_a_only",
        STEM,
        ((_DTYPE, _DTYPE.replace("a.dtype() != i64 || b.dtype() != i64", "a.dtype() != i64")),),
        must_fail=("rejects_other_dtypes",),
        hint="each tensor is checked on its own",
        why="the dtype check looks at a only: an int32 b is read as int64",
        kind="one_argument",
    ),
    Mutant(
        "fast_path_checks_only_a_visibly",
        STEM,
        (("  if (sa == 1 && sb == 1) {", "  if (sa == 1) {"),),
        must_fail=("strided_views", "random_arrays_match_python"),
        hint="each tensor has its own layout",
        why="the contiguous loop runs when a alone is contiguous (the stride check looks at one argument): a "
        "strided b is read as contiguous (once a hidden-test-only bug)",
        kind="one_argument",
    ),
    Mutant(
        "dtype_checked_by_bits_only",
        STEM,
        (
            (
                _DTYPE,
                '  if (a.dtype().bits != 64 || b.dtype().bits != 64) TVM_FFI_THROW(TypeError) << "64-bit ids only";\n',
            ),
        ),
        must_fail=("rejects_other_dtypes",),
        hint="compare the whole DLDataType",
        why="the dtype's size checked where each of its parts (type code, bits, lanes) must hold: float64 passes",
        kind="each_part",
    ),
    Mutant(
        "empty_shortcut_before_the_checks",
        STEM,
        ((_NDIM, "  if (a.size(0) == 0 || b.size(0) == 0) return 0;  // nothing to compare\n" + _NDIM),),
        must_fail=("rejects_other_dtypes",),
        hint="check the inputs first",
        why="a shortcut for empty arrays runs before the input checks the contract puts first: an empty int32 "
        "tensor returns 0",
        kind="order",
    ),
    Mutant(
        "one_stride_for_both_visibly",
        STEM,
        ((STRIDED_LOOP, "    while (i < n && pa[i * sa] == pb[i * sa]) ++i;"),),
        must_fail=("strided_views", "random_arrays_match_python"),
        hint="each tensor has its own stride(0)",
        why="once a hidden-test-only bug: a's stride is used for b too, right whenever both share one layout",
        kind="visible_on_cpu",
    ),
    Mutant(
        "prefix_len_of_the_engine",
        STEM,
        (
            (
                "    return int(build().prefix_len(a, b))\n",
                "    from minisgl.kvcache.radix import common_prefix_len\n\n"
                "    return common_prefix_len(a.tolist(), b.tolist())\n",
            ),
        ),
        must_fail=("docstring_examples", "random_arrays_match_python"),
        hint="the engine's own",
        why="prefix_len is the engine's Python compare on lists (correct, and no kernel)",
        kind="engine_reference",
    ),
    Mutant(
        "prefix_len_is_the_radix_caches",
        STEM,
        (
            (
                "def prefix_len(a: torch.Tensor, b: torch.Tensor) -> int:\n",
                "from minisgl.kvcache.radix import RadixPrefixCache  # noqa: E402\n\n"
                "prefix_len = RadixPrefixCache.prefix_len\n\n\ndef _unused(a: torch.Tensor, b: torch.Tensor) -> int:\n",
            ),
        ),
        must_fail=("docstring_examples", "random_arrays_match_python"),
        hint="the engine's own",
        why="prefix_len is the radix cache's own key compare, taken from the class",
        kind="engine_reference",
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
