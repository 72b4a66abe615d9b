"""Broken variants of solutions/lab06_radix_cache.py."""

from mutants import Mutant

MUTANTS = [
    Mutant(
        "never_evicts",
        "lab06_radix_cache",
        (
            (
                "        if n <= 0:\n            return _EMPTY\n        if n > self.num_evictable:",
                "        if True:\n            return _EMPTY\n        if n > self.num_evictable:",
            ),
        ),
        must_fail=(
            "evict_lru_order",
            "evict_respects_locks",
            "random_operations_match_reference",
            "engine_shares_prefixes[1]",
        ),
        why="evict() frees nothing, so the engine runs out of KV memory",
    ),
    Mutant(
        "evicts_locked_nodes",
        "lab06_radix_cache",
        (
            ("if not node.children and node.ref == 0]", "if not node.children]"),
            (
                "if parent is not self.root and not parent.children and parent.ref == 0:",
                "if parent is not self.root and not parent.children:",
            ),
        ),
        must_fail=("evict_respects_locks", "random_operations_match_reference"),
        why="eviction ignores locks: a running request's prefix can be freed under it",
    ),
    Mutant(
        "evicts_most_recent",
        "lab06_radix_cache",
        (
            (
                "leaf = min(candidates, key=lambda node: node.last_access)",
                "leaf = max(candidates, key=lambda node: node.last_access)",
            ),
        ),
        must_fail=("evict_lru_order", "random_operations_match_reference", "engine_shares_prefixes[1]"),
        why="MRU instead of LRU: the prefix just used is the first to go",
    ),
]
