"""Broken variants for the hidden tests (``autograder/hidden/``): graded with the hidden tests only
(``test_autograder.py``), each must fail the hidden tests named in ``must_fail``. All but
``split_forgets_locks`` passed every visible test when they were written: they show what the
hidden tests add."""

from mutants import Mutant

HIDDEN_MUTANTS = [
    Mutant(
        "rms_norm_weight_in_float32",
        "lab01_decoder",
        (("    return weight * h.to(x.dtype)\n", "    return (weight.float() * h).to(x.dtype)\n"),),
        must_fail=("rms_norm_bit_exact_in_half_precision",),
        why="the weight multiply happens before the cast back: half-precision results round differently",
    ),
    Mutant(
        "attention_ignores_scale",
        "lab01_decoder",
        (("keys) * scale  # [H, T, S]", "keys) * q.shape[-1] ** -0.5  # [H, T, S]"),),
        must_fail=("gqa_attention_uses_its_scale",),
        why="1/sqrt(head_dim) instead of the scale argument (the same value in every visible test)",
    ),
    Mutant(
        "attention_naive_softmax",
        "lab01_decoder",
        (("scores.softmax(dim=-1)", "(scores.exp() / scores.exp().sum(-1, keepdim=True))"),),
        must_fail=("gqa_attention_long_sequence_large_scores",),
        why="exp() without subtracting the row max overflows on scores above ~88",
    ),
    Mutant(
        "insert_keeps_a_view",
        "lab06_radix_cache",
        (("indices[pos:end].clone()", "indices[pos:end]"),),
        must_fail=("insert_keeps_its_own_copy",),
        why="the cache keeps a slice of the caller's page-table row, which the engine reuses",
    ),
    Mutant(
        "pages_assumed_power_of_two",
        "lab06_radix_cache",
        (
            (
                "        end = self.aligned(len(token_ids))\n        node, pos, _ = self.walk(token_ids)",
                "        end = len(token_ids) & ~(self.page_size - 1)\n        node, pos, _ = self.walk(token_ids)",
            ),
        ),
        must_fail=("random_operations_at_page_sizes_3_and_8",),
        why="a bit mask rounds down to a page only when page_size is a power of two",
    ),
    Mutant(
        "split_forgets_locks",
        "lab06_radix_cache",
        (("upper.ref, upper.last_access = node.ref, node.last_access", "upper.last_access = node.last_access"),),
        must_fail=("interleaved_locks_and_evictions[4]", "interleaved_locks_and_evictions[8]"),
        why="a node split under a lock loses its upper half's reference count (the visible random test may "
        "catch it too)",
    ),
]
