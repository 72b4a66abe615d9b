"""Broken variants of solutions/lab06_radix_cache.py: one per pitfall its docstring names, one per class
of hole of ``mutants.KINDS``, and a correct one written another way (``EQUIVALENT``)."""

from mutants import Mutant

STEM = "lab06_radix_cache"

NOT_APPLICABLE = {
    "one_argument": "the contract's only input checks each look at one argument: evict(n) checks n against "
    "num_evictable and unlock(handle) the refs on the handle's path; no check combines several arguments",
}

# every fixed unit test -> the randomized test, which must fail with it
RANDOMIZED = {
    name: "random_operations_match_reference"
    for name in (
        "empty_cache",
        "insert_then_match",
        "insert_returns_cached_prefix",
        "match_splits_node",
        "split_keeps_locks",
        "page_alignment",
        "lock_unlock_refcounts",
        "evict_lru_order",
        "evict_respects_locks",
        "evict_frees_parents",
    )
}

MUTANTS = [
    Mutant(
        "never_evicts",
        STEM,
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
        hint="freed nothing",
        why="evict() frees nothing, so the engine runs out of KV memory",
    ),
    Mutant(
        "evicts_locked_nodes",
        STEM,
        (
            ("if not node.children and node.ref == 0]", "if not node.children]"),
            (
                "if parent is not self.root and not parent.children and parent.ref == 0:",
                "if parent is not self.root and not parent.children:",
            ),
        ),
        must_fail=("evict_respects_locks", "random_operations_match_reference"),
        hint="a locked node (ref > 0) must never be evicted",
        why="eviction ignores locks: a running request's prefix can be freed under it",
    ),
    Mutant(
        "evicts_most_recent",
        STEM,
        (
            (
                "leaf = min(candidates, key=lambda node: node.last_access)",
                "leaf = max(candidates, key=lambda node: node.last_access)",
            ),
        ),
        must_fail=("evict_lru_order", "random_operations_match_reference", "engine_shares_prefixes[1]"),
        hint="evict the oldest last_access first",
        why="MRU instead of LRU: the prefix just used is the first to go",
    ),
    Mutant(
        "evict_forgets_parents",
        STEM,
        (
            (
                "            if parent is not self.root and not parent.children and parent.ref == 0:\n"
                "                candidates.append(parent)\n",
                "",
            ),
        ),
        must_fail=("evict_frees_parents", "random_operations_match_reference"),
        hint="it becomes a candidate too",
        why="a parent left without children is never evicted, so evict() runs out of candidates",
    ),
    Mutant(
        "split_drops_lock",
        STEM,
        (("upper.ref, upper.last_access = node.ref, node.last_access", "upper.last_access = node.last_access"),),
        must_fail=("split_keeps_locks", "random_operations_match_reference"),
        hint="must inherit its ref",
        why="the upper half of a split locked node starts unlocked: evictable while in use, and unlock underflows",
    ),
    Mutant(
        "match_never_splits",
        STEM,
        (
            (
                "            if n < len(child.key):\n                child = self.split(child, n)\n"
                "            values.append(child.value)\n",
                "            if n < len(child.key):\n                values.append(child.value[:n])\n"
                "                node, pos = child, pos + n\n                break\n"
                "            values.append(child.value)\n",
            ),
        ),
        must_fail=("match_splits_node", "random_operations_match_reference"),
        hint="split the node",
        why="a partial match returns the whole node as its handle: a lock protects tokens nobody matched",
    ),
    Mutant(
        "lock_only_the_handle",
        STEM,
        (
            (
                "            node.ref += 1\n            node = node.parent\n",
                "            node.ref += 1\n            node = None\n",
            ),
        ),
        must_fail=("lock_unlock_refcounts", "random_operations_match_reference"),
        hint="a lock pins the matched node and every ancestor",
        why="lock() pins the matched node but not its ancestors, which stay evictable",
    ),
    Mutant(
        "unlock_never_raises",
        STEM,
        (
            (
                "            if node.ref == 0:\n"
                '                raise RuntimeError("unlock() without a matching lock()")\n',
                "",
            ),
        ),
        must_fail=("lock_unlock_refcounts", "random_operations_match_reference"),
        hint="must raise RuntimeError",
        why="unlocking too often drives ref below zero silently",
    ),
    Mutant(
        "insert_returns_new_tokens",
        STEM,
        (
            (
                "            self.touch(leaf)\n        return pos\n",
                "            self.touch(leaf)\n        return end - pos\n",
            ),
        ),
        must_fail=("insert_then_match", "insert_returns_cached_prefix", "random_operations_match_reference"),
        hint="insert returns the length of the prefix that was already cached",
        why="insert returns how many tokens it added, not how many were cached already",
    ),
    Mutant(
        "match_not_page_aligned",
        STEM,
        (
            (
                "n = self.aligned(shared_len(child.key, token_ids[pos:end]))",
                "n = shared_len(child.key, token_ids[pos:end])",
            ),
        ),
        must_fail=("page_alignment", "random_operations_match_reference"),
        hint="is not a whole number of pages",
        why="a match may end inside a page, so keys stop being whole pages",
    ),
    Mutant(
        "insert_keeps_partial_page",
        STEM,
        (
            (
                "        end = self.aligned(len(token_ids))\n        node, pos, _ = self.walk(token_ids)\n",
                "        end = len(token_ids)\n        node, pos, _ = self.walk(token_ids)\n",
            ),
        ),
        must_fail=("page_alignment", "random_operations_match_reference"),
        hint="is not a whole number of pages",
        why="insert keeps the unaligned tail of the tokens as a partial page",
    ),
]

MUTANTS += [
    Mutant(
        "evict_refuses_exactly_evictable",
        STEM,
        (("        if n > self.num_evictable:\n", "        if n >= self.num_evictable:\n"),),
        must_fail=("evict_respects_locks", "match_splits_node", "random_operations_match_reference"),
        hint="n == evictable_size is allowed",
        why=">= for >: evict(n) with n exactly num_evictable raises ValueError instead of freeing everything",
        kind="boundary",
    ),
    Mutant(
        "lock_moves_by_the_handle",
        STEM,
        (
            (
                "        node = handle\n        while node is not None and node is not self.root:\n"
                "            if node.ref == 0:\n                self.num_evictable -= len(node.value)\n",
                "        node = handle\n        fresh = handle is not None and handle.ref == 0\n"
                "        while node is not None and node is not self.root:\n"
                "            if fresh:\n                self.num_evictable -= len(node.value)\n",
            ),
        ),
        must_fail=("lock_unlock_refcounts", "random_operations_match_reference"),
        hint="only [5 6] moves",
        why="lock() moves the whole path to protected when the handle's ref goes 0 -> 1, instead of each node "
        "whose own ref does: an ancestor already locked is counted twice",
        kind="each_part",
    ),
    Mutant(
        "evict_queue_sorted_once",
        STEM,
        (
            (
                "        candidates = [node for node in self.nodes() if not node.children and node.ref == 0]\n",
                "        candidates = sorted(\n"
                "            [node for node in self.nodes() if not node.children and node.ref == 0],\n"
                "            key=lambda node: node.last_access,\n"
                "        )\n",
            ),
            (
                "            leaf = min(candidates, key=lambda node: node.last_access)\n"
                "            candidates.remove(leaf)\n",
                "            leaf = candidates.pop(0)\n",
            ),
        ),
        must_fail=("evict_frees_parents", "random_operations_match_reference"),
        hint="ordered by its last_access like every other candidate",
        why="the leaves are sorted once and a parent that becomes a candidate joins the end of the queue, "
        "out of LRU order",
        kind="order",
    ),
    Mutant(
        "derives_from_the_engine_cache",
        STEM,
        (
            (
                "class RadixCache(PrefixCache):\n",
                "from minisgl.kvcache.radix import RadixPrefixCache  # noqa: E402\n\n\n"
                "class RadixCache(RadixPrefixCache):\n",
            ),
        ),
        must_fail=("empty_cache", "insert_then_match", "random_operations_match_reference"),
        hint="the engine's own",
        why="the lab class derives from the engine's RadixPrefixCache (its own methods unchanged)",
        kind="engine_reference",
    ),
    Mutant(
        "evict_delegates_to_the_engine",
        STEM,
        (
            (
                "        if n <= 0:\n            return _EMPTY\n        if n > self.num_evictable:",
                "        from minisgl.kvcache.radix import RadixPrefixCache\n\n"
                "        return RadixPrefixCache.evict(self, n)\n"
                "        if n > self.num_evictable:",
            ),
        ),
        must_fail=("empty_cache", "evict_lru_order", "random_operations_match_reference"),
        hint="the engine's own",
        why="evict() calls the engine's RadixPrefixCache.evict",
        kind="engine_reference",
    ),
    Mutant(
        "insert_keeps_a_view_of_the_caller",
        STEM,
        (("indices[pos:end].clone()", "indices[pos:end]"),),
        must_fail=("insert_returns_cached_prefix", "random_operations_match_reference"),
        hint="kept a view of the caller's tensor",
        why="the cache keeps a slice of the caller's page-table row, which the engine reuses (once caught only by "
        "the hidden insert_keeps_its_own_copy)",
        kind="visible_on_cpu",
    ),
    Mutant(
        "pages_by_bit_mask",
        STEM,
        (
            (
                "        end = self.aligned(len(token_ids))\n        node, pos, _ = self.walk(token_ids)",
                "        end = len(token_ids) & ~(self.page_size - 1)\n        node, pos, _ = self.walk(token_ids)",
            ),
        ),
        must_fail=("page_alignment", "random_operations_match_reference"),
        hint="only when page_size is a power of two",
        why="a bit mask rounds down to a page only when page_size is a power of two (once caught only by the "
        "hidden random test at page sizes 3 and 8)",
        kind="visible_on_cpu",
    ),
]

MUTANTS += [
    Mutant(
        "unlock_checks_the_handle_first",
        STEM,
        (
            (
                "        node = handle\n        while node is not None and node is not self.root:\n"
                "            if node.ref == 0:\n                raise RuntimeError",
                "        if handle.ref == 0:\n"
                '            raise RuntimeError("unlock() of a handle that is not locked")\n'
                "        node = handle\n        while node is not None and node is not self.root:\n"
                "            if node.ref == 0:\n                raise RuntimeError",
            ),
        ),
        must_fail=("lock_unlock_refcounts", "random_operations_match_reference"),
        hint="the root is never counted",
        why="unlock() refuses a handle whose ref is 0 before it walks: the root (an empty match's handle, never "
        "counted) cannot be unlocked, and the engine unlocks one for every request with no cached prefix",
    ),
    Mutant(
        "insert_leaf_not_stamped",
        STEM,
        (
            (
                "            self.num_evictable += end - pos\n            self.touch(leaf)\n",
                "            self.num_evictable += end - pos\n",
            ),
        ),
        must_fail=("evict_lru_order", "random_operations_match_reference"),
        hint="a new leaf is the most recent",
        why="a leaf insert adds keeps last_access 0: the newest entry looks like the oldest and is evicted first",
    ),
    Mutant(
        "evict_returns_a_list",
        STEM,
        (("        return torch.cat(freed)\n", "        return torch.cat(freed).tolist()\n"),),
        must_fail=("evict_lru_order", "random_operations_match_reference"),
        hint="int64 tensor",
        why="evict returns a Python list: the allocator the engine hands it to takes a tensor",
    ),
    Mutant(
        "evict_zero_not_special",
        STEM,
        (("        if n <= 0:\n            return _EMPTY\n", "        if n < 0:\n            return _EMPTY\n"),),
        must_fail=("empty_cache", "random_operations_match_reference"),
        hint="evict(0) must free nothing",
        why="< for <=: evict(0) runs the eviction loop, which frees nothing and then fails to return it",
        kind="boundary",
    ),
    Mutant(
        "children_by_first_token",
        STEM,
        (
            ("        return tuple(ids[pos : pos + self.page_size])\n", "        return tuple(ids[pos : pos + 1])\n"),
            (
                "            n = self.aligned(shared_len(child.key, token_ids[pos:end]))\n",
                "            n = self.aligned(shared_len(child.key, token_ids[pos:end]))\n"
                "            if n == 0:  # the first token agrees, not the whole first page\n"
                "                break\n",
            ),
        ),
        must_fail=("page_alignment", "random_operations_match_reference"),
        hint="children are indexed by their first page, not their first token",
        why="siblings told apart by their first token: with pages of several tokens a sibling that shares only "
        "its first token replaces the other",
    ),
]

# correct, written the other ways a student may: it must keep every point
EQUIVALENT = Mutant(
    "lab06_written_differently",
    STEM,
    (
        (  # a recursive lock, a heap for eviction
            "        node = handle\n        while node is not None and node is not self.root:\n"
            "            if node.ref == 0:\n                self.num_evictable -= len(node.value)\n"
            "                self.num_protected += len(node.value)\n            node.ref += 1\n"
            "            node = node.parent\n",
            "        if handle is None or handle is self.root:\n            return\n"
            "        if handle.ref == 0:\n            self.num_evictable -= len(handle.value)\n"
            "            self.num_protected += len(handle.value)\n        handle.ref += 1\n"
            "        self.lock(handle.parent)\n",
        ),
        (
            "        candidates = [node for node in self.nodes() if not node.children and node.ref == 0]\n",
            "        import heapq\n\n"
            "        heap = [(nd.last_access, id(nd), nd) for nd in self.nodes() if not nd.children and nd.ref == 0]\n"
            "        heapq.heapify(heap)\n",
        ),
        (
            "            leaf = min(candidates, key=lambda node: node.last_access)\n"
            "            candidates.remove(leaf)\n",
            "            _, _, leaf = heapq.heappop(heap)\n",
        ),
        (
            "                candidates.append(parent)\n",
            "                heapq.heappush(heap, (parent.last_access, id(parent), parent))\n",
        ),
    ),
    must_fail=(),
)
