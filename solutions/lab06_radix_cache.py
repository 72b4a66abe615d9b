"""Lab 06: a radix prefix cache.

You implement ``RadixCache``, a ``PrefixCache`` (``minisgl/kvcache/base.py`` is the interface the scheduler
calls: read it first). Write it here: the engine's own radix cache is off limits (a lab that derives from,
calls or aliases it scores 0). The cache is a compressed trie over token ids: each node's ``key`` is a run of
tokens and its ``value`` the KV slots of exactly those tokens (int64, as long as the key)::

    root ─ [1 2 3 4] ─┬─ [5 6]          match_prefix([1 2 3 4 5 6 9]) -> length 6, slots of [1..6]
                      └─ [7 8 9]        match_prefix([1 2 7])         -> length 3: [7 8 9] splits

The helpers below the class line (``Node``, ``shared_len``, ``child_key``, ``touch``, ``nodes``,
``check_integrity``) are given; the methods that raise ``NotImplementedError`` are yours, in the design you
choose for them (``split`` and ``walk`` are the pieces the given signatures suggest).

Contract, beyond ``base.py`` (the grader compares every result with the engine's cache):

* **Pages.** With ``page_size > 1`` (any size, not only a power of two) only whole pages are cached: token
  lists count only up to ``aligned(len)``, keys and matched lengths are whole pages, and the children of a
  node are told apart by their first *page* (``child_key``), not their first token.
* **Match.** ``match_prefix(ids)`` returns the longest cached prefix of ``ids`` (whole pages): its length,
  the slots on the path (an empty int64 tensor when nothing matched) and a handle for ``lock``. When the
  match ends inside a node's key, that node is split so that the match ends exactly at a node, and the
  handle is that node: a lock then protects only the matched tokens. The upper part of a split keeps the
  locks of the node it came from (every lock on the node covered both parts). ``insert`` splits the same way.
* **Insert.** ``insert(ids, indices)`` returns the length of the prefix that was already cached (the caller
  frees those duplicate slots); the new tokens' slots become the cache's, as a copy: the caller goes on
  using the tensor it passed (the engine reuses a request's page-table row).
* **Locks.** ``lock(handle)`` protects the handle's node and every ancestor; locks are counted, and
  ``unlock`` undoes one. Unlocking a node that no lock holds raises ``RuntimeError``. The root (the handle
  of an empty match) is never counted: locking and unlocking it change nothing and never raise.
  ``evictable_size`` and ``protected_size`` count the slots of unlocked and locked nodes; they are kept up
  to date as each node changes side.
* **LRU clock.** ``match_prefix`` and ``insert`` make every node on the path they walked the most recently
  used (``touch``), and a node ``insert`` adds is more recent still.
* **Eviction.** ``evict(n)`` frees unlocked leaves, least recently used first; a parent left with no
  children and no lock becomes a leaf like any other (ordered by its own last use). It stops as soon as at
  least ``n`` slots are freed and returns them (int64). ``n <= 0`` frees nothing; ``n`` larger than
  ``evictable_size`` raises ``ValueError`` (``n`` equal to it frees everything evictable).

Worked examples (each is a visible test):

* One token per page: ``insert([1..6], slots 0..5)`` returns 0; then ``insert([1, 2, 3, 7, 8], slots 20..24)``
  returns 3 (``[1 2 3]`` was cached: the caller frees 20..22) and the cache keeps 23 and 24;
  ``match_prefix([1, 2, 3, 7, 8])`` -> length 5, slots ``[0, 1, 2, 23, 24]``; sizes (evictable,
  protected) = (8, 0).
* Split under a lock: 8 tokens cached; ``match_prefix([1, 2, 3, 4, 99])`` -> length 4; locking it gives
  sizes (4, 4), and ``evict(4)`` frees slots 4..7, the unlocked lower half.
* Locks count: lock ``[1..6]`` then ``[1..4]`` -> (0, 6); unlock ``[1..6]`` -> (2, 4); unlock ``[1..4]``
  -> (6, 0); one more unlock of ``[1..4]`` -> ``RuntimeError``. Locking the handle of an empty match
  changes nothing.
* LRU: ``[2 2 2]`` inserted, then ``[1 1 1]``, then ``[3 3 3]``, then ``match_prefix([2 2 2])`` ->
  ``evict(3)`` three times frees ``[1 1 1]``'s slots, then ``[3 3 3]``'s, then ``[2 2 2]``'s.
* Parents: ``[1..4]`` and ``[1..6]`` cached -> ``evict(6)`` frees the leaf ``[5 6]`` and then its parent
  ``[1..4]``, before a newer ``[7 7 7]``.
* Pages of 4: ``insert`` of 10 tokens keeps 8; a query that shares 7 tokens matches 4. Pages of 3: 10 tokens
  keep 9.

Pitfalls the grader recognises by their effect (its messages name them):

* pages: a matched or kept length that is not a whole number of pages; a partial last page kept; a bit mask
  that rounds to a page only when ``page_size`` is a power of two; siblings told apart by their first token;
* ownership: the cached slots change when the caller reuses its tensor (a view kept, not a copy);
* splits: a lock that protects a whole node although the match ended inside it; a lock taken before a split
  that then covers only the lower part (its ``unlock`` finds nothing to undo);
* locks: an ancestor left unprotected; an unlock too many that passes silently; an empty match that cannot
  be unlocked; a node counted twice when a second lock reaches it;
* ``insert`` returning the number of new tokens (or the whole length) instead of the cached prefix;
* eviction: the most recently used leaf first; a just-inserted leaf taken for the oldest; a locked leaf
  evicted; a parent left with no children never evicted, or evicted out of LRU order; ``n`` equal to
  ``evictable_size`` refused; nothing freed at all; the freed slots not an int64 tensor.

Grading: ``python -m autograder lab06`` runs fixed cases and random operation sequences (page sizes 1 to 4;
the caller overwrites the tensor it passed to ``insert``) against the engine's cache, then runs the engine
with ``cache_type=<your cache>`` at page sizes 1 and 4 and checks the generated tokens and the cache hits
equal the reference.
"""

from __future__ import annotations

from typing import Any

import torch

from minisgl.kvcache.base import MatchResult, PrefixCache

_EMPTY = torch.empty(0, dtype=torch.int64)


class Node:
    """One edge of the tree: ``key`` (token ids) and ``value`` (their slots, int64, same length)."""

    __slots__ = ("key", "value", "children", "parent", "ref", "last_access")

    def __init__(self, key: list[int], value: torch.Tensor, parent: Node | None):
        self.key, self.value, self.parent = key, value, parent
        self.children: dict[tuple[int, ...], Node] = {}  # first page of the child's key -> child
        self.ref = 0  # locks on this node or on any descendant
        self.last_access = 0


def shared_len(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class RadixCache(PrefixCache):
    def __init__(self, page_size: int = 1):
        super().__init__(page_size)
        self.root = Node([], _EMPTY, None)
        self.num_evictable = 0  # slots in nodes with ref == 0
        self.num_protected = 0  # slots in nodes with ref > 0
        self.clock = 0

    # ---- helpers you may use ---------------------------------------------------------------
    def child_key(self, ids: list[int], pos: int) -> tuple[int, ...]:
        """The index of a child whose key starts at ``ids[pos]``: its first page."""
        return tuple(ids[pos : pos + self.page_size])

    def touch(self, node: Node) -> None:
        """Stamp ``node`` and its ancestors with a fresh clock value (most recently used)."""
        self.clock += 1
        while node is not None:
            node.last_access = self.clock
            node = node.parent

    # ---- lookup ------------------------------------------------------------------------------
    def split(self, node: Node, n: int) -> Node:
        """Cut ``node`` after its first ``n`` tokens (``0 < n < len(node.key)``, a multiple of
        ``page_size``). Insert a new node for the first part between ``node`` and its parent and
        return it; ``node`` keeps the rest. The new node inherits ``ref`` and ``last_access``."""
        # BEGIN SOLUTION what="the split of a node after its first n tokens" hint="a new node with the first n tokens and slots takes node's place under the parent (with its ref); node keeps the rest and hangs below it"
        upper = Node(node.key[:n], node.value[:n], node.parent)
        upper.ref, upper.last_access = node.ref, node.last_access
        node.parent.children[self.child_key(upper.key, 0)] = upper
        node.key, node.value, node.parent = node.key[n:], node.value[n:], upper
        upper.children[self.child_key(node.key, 0)] = node
        return upper
        # END SOLUTION

    def walk(self, token_ids: list[int]) -> tuple[Node, int, list[torch.Tensor]]:
        """Follow ``token_ids[:aligned(len)]`` down from the root, splitting the last node when the
        match ends inside it. Return the deepest node reached (the root if nothing matched), the
        matched length and the ``value`` of every node on the way; ``touch`` the deepest node."""
        # BEGIN SOLUTION what="the walk down the tree along the token ids" hint="from the root, take the child filed under the next page; count the whole pages its key shares with the ids; split where a match stops inside a key; touch the deepest node"
        end = self.aligned(len(token_ids))
        node, pos, values = self.root, 0, []
        while pos < end:
            child = node.children.get(self.child_key(token_ids, pos))
            if child is None:
                break
            n = self.aligned(shared_len(child.key, token_ids[pos:end]))
            if n < len(child.key):
                child = self.split(child, n)
            values.append(child.value)
            node, pos = child, pos + n
        self.touch(node)
        return node, pos, values
        # END SOLUTION

    def match_prefix(self, token_ids: list[int]) -> MatchResult:
        # BEGIN SOLUTION what="the longest cached prefix of token_ids: its length, its slots and its handle" hint="walk the ids; the slots are the values of the nodes on the path, concatenated (an empty int64 tensor when nothing matched); the handle is the deepest node"
        node, length, values = self.walk(token_ids)
        return MatchResult(length, torch.cat(values) if values else _EMPTY, node)
        # END SOLUTION

    # ---- reference counts --------------------------------------------------------------------
    def lock(self, handle: Any) -> None:
        # BEGIN SOLUTION what="a lock on the handle's path" hint="count one more lock on every node from the handle up to (not including) the root; a node whose count leaves zero moves its slots from evictable to protected"
        node = handle
        while node is not None and node is not self.root:
            if node.ref == 0:
                self.num_evictable -= len(node.value)
                self.num_protected += len(node.value)
            node.ref += 1
            node = node.parent
        # END SOLUTION

    def unlock(self, handle: Any) -> None:
        # BEGIN SOLUTION what="giving one lock on the handle's path back" hint="the mirror of lock: one lock less on every node up to the root; raise RuntimeError at a node with no lock left; a node whose count reaches zero moves back to evictable"
        node = handle
        while node is not None and node is not self.root:
            if node.ref == 0:
                raise RuntimeError("unlock() without a matching lock()")
            node.ref -= 1
            if node.ref == 0:
                self.num_protected -= len(node.value)
                self.num_evictable += len(node.value)
            node = node.parent
        # END SOLUTION

    # ---- insert / evict ----------------------------------------------------------------------
    def insert(self, token_ids: list[int], indices: torch.Tensor) -> int:
        # BEGIN SOLUTION what="insert: keep the new whole pages, return the length already cached" hint="walk the ids; hang a new leaf with a copy of the new slots under the node reached; count its slots as evictable and make it the most recent; return where the walk stopped"
        end = self.aligned(len(token_ids))
        node, pos, _ = self.walk(token_ids)
        if pos < end:
            leaf = Node(list(token_ids[pos:end]), indices[pos:end].clone(), node)
            node.children[self.child_key(leaf.key, 0)] = leaf
            self.num_evictable += end - pos
            self.touch(leaf)
        return pos
        # END SOLUTION

    def evict(self, n: int) -> torch.Tensor:
        # BEGIN SOLUTION what="eviction of unlocked leaves, least recently used first" hint="collect the unlocked leaves; repeatedly remove the one with the oldest last_access until n slots are freed, adding a parent that is left childless and unlocked to the candidates"
        if n <= 0:
            return _EMPTY
        if n > self.num_evictable:
            raise ValueError(f"cannot evict {n} slots: only {self.num_evictable} are evictable")
        candidates = [node for node in self.nodes() if not node.children and node.ref == 0]
        freed: list[torch.Tensor] = []
        count = 0
        while count < n:
            leaf = min(candidates, key=lambda node: node.last_access)
            candidates.remove(leaf)
            freed.append(leaf.value)
            count += len(leaf.value)
            self.num_evictable -= len(leaf.value)
            parent = leaf.parent
            del parent.children[self.child_key(leaf.key, 0)]
            if parent is not self.root and not parent.children and parent.ref == 0:
                candidates.append(parent)
        return torch.cat(freed)
        # END SOLUTION

    # ---- sizes and checks --------------------------------------------------------------------
    @property
    def evictable_size(self) -> int:
        return self.num_evictable

    @property
    def protected_size(self) -> int:
        return self.num_protected

    def nodes(self):
        """Every node except the root."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def check_integrity(self) -> None:
        """Recount the tree and compare with the counters (the engine calls this in debug mode)."""
        evictable = protected = 0
        slots = []
        for node in self.nodes():
            assert len(node.key) == len(node.value) > 0, f"node key/value lengths {len(node.key)}/{len(node.value)}"
            assert len(node.key) % self.page_size == 0, "a node key is not a whole number of pages"
            assert node.parent.children.get(self.child_key(node.key, 0)) is node, "a node's parent does not index it"
            assert node.ref >= 0, "negative reference count"
            assert node.parent is self.root or node.parent.ref >= node.ref, "a child is locked more than its parent"
            if node.ref:
                protected += len(node.value)
            else:
                evictable += len(node.value)
            slots.append(node.value)
        assert evictable == self.num_evictable, f"num_evictable is {self.num_evictable}, the tree holds {evictable}"
        assert protected == self.num_protected, f"num_protected is {self.num_protected}, the tree holds {protected}"
        if slots:
            every = torch.cat(slots)
            assert len(torch.unique(every)) == len(every), "a KV slot is held by two nodes"
