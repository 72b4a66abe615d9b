"""Lab 06: a radix prefix cache.

You implement ``RadixCache``, a ``PrefixCache`` (read ``minisgl/kvcache/base.py`` first: it is the
interface the scheduler calls). Write it here: the engine's own radix cache is off limits (a lab
that derives from, calls or aliases it scores 0). The cache is a compressed trie over token ids;
each node's ``key`` is a run of tokens and its ``value`` the KV slots of exactly those tokens::

    root ─ [1 2 3 4] ─┬─ [5 6]          match_prefix([1 2 3 4 5 6 9]) -> length 6
                      └─ [7 8 9]        match_prefix([1 2 7])         -> length 3 (split [7 8 9])

Contract, beyond ``base.py`` (the grader compares every result with the engine's cache):

* **Pages.** With ``page_size > 1`` (any size, not only powers of two) only whole pages are
  cached: token lists are cut to ``aligned(len)``, keys and matched lengths are multiples of
  ``page_size``, and a node's children are indexed by their first *page* (``child_key``), not
  their first token.
* **Split on match.** When a match (in ``match_prefix`` or ``insert``) ends inside a node's key,
  split that node so the match ends exactly at a node: the upper part keeps the first ``n`` tokens
  and inherits the node's ``ref`` and ``last_access``. The returned handle is that node, so a lock
  protects only the matched tokens.
* **Locks.** ``lock(handle)`` adds one to ``ref`` of the handle's node and every ancestor below the
  root; ``unlock`` undoes it and raises ``RuntimeError`` when a ``ref`` would go below zero. A
  node with ``ref > 0`` is protected, one with ``ref == 0`` evictable; keep ``num_evictable`` and
  ``num_protected`` (slot counts) up to date as nodes move between the two (each node when its
  own ``ref`` goes 0 -> 1 or 1 -> 0).
* **LRU clock.** ``match_prefix`` and ``insert`` stamp every node on the path from the deepest
  node they reached up to the root with a fresh clock value (``touch``); ``insert`` then stamps
  the new leaf with another fresh value.
* **Ownership.** ``insert`` keeps its own copy of the slots it takes: the caller goes on using the
  tensor it passed (the engine reuses a request's page-table row), so a slice of it would change.
* **Eviction.** ``evict(n)`` removes unlocked leaves, oldest ``last_access`` first; a parent
  left with no children and ``ref == 0`` becomes a candidate too (ordered by its own
  ``last_access`` among the others). Stop as soon as at least ``n`` slots are freed and return the
  freed slots (int64). ``n <= 0`` frees nothing; ``n`` larger than ``num_evictable`` raises
  ``ValueError`` (``n == num_evictable`` frees everything).

Pitfalls the grader recognises (its messages name them):

* pages: a matched length that is not a whole number of pages (round the shared length down with
  ``aligned``); the unaligned tail of ``insert``'s tokens kept; a bit mask that rounds to a page
  only when ``page_size`` is a power of two;
* ownership: a slice (a view) of the caller's ``indices`` kept instead of a copy;
* splits: a match ending inside a node that does not split it (a lock would then protect the whole
  node); an upper part that does not inherit ``ref`` (a lock taken before the split then covers
  only the lower part, and its ``unlock`` finds a ``ref`` of 0);
* locks: only the handle's node locked (every ancestor must be pinned too); ``unlock`` that lets a
  ``ref`` go below zero instead of raising ``RuntimeError``;
* ``insert`` returning the number of new tokens (or the whole length) instead of the length of the
  prefix that was already cached (the caller frees exactly those duplicate slots);
* eviction: the most recently used leaf first instead of the least; a locked leaf evicted; a parent
  left with no children (and no lock) not becoming a candidate, so ``evict`` stops short or
  fails, or becoming one out of LRU order; ``n == num_evictable`` refused; nothing freed at all.

Grading: ``python -m autograder lab06`` runs fixed cases and random operation sequences (page
sizes 1 to 4; the caller overwrites the tensor it passed to ``insert``) against the engine's
cache, then runs the engine with ``cache_type=<your cache>`` at page sizes 1 and 4 and checks the
generated tokens and the cache hits equal the reference.
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
        # BEGIN SOLUTION hint="make Node(key[:n], value[:n]) the parent's child, and node (key[n:]) its only child"
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
        # BEGIN SOLUTION hint="follow children[child_key(ids, pos)] from the root; split() where a match stops mid-key"
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
        node, length, values = self.walk(token_ids)
        return MatchResult(length, torch.cat(values) if values else _EMPTY, node)

    # ---- reference counts --------------------------------------------------------------------
    def lock(self, handle: Any) -> None:
        # BEGIN SOLUTION hint="ref += 1 from the handle up to the root; a node going 0 -> 1 becomes protected"
        node = handle
        while node is not None and node is not self.root:
            if node.ref == 0:
                self.num_evictable -= len(node.value)
                self.num_protected += len(node.value)
            node.ref += 1
            node = node.parent
        # END SOLUTION

    def unlock(self, handle: Any) -> None:
        # BEGIN SOLUTION hint="the mirror of lock(): ref -= 1 up to the root; RuntimeError if a ref is already 0"
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
        # BEGIN SOLUTION hint="walk() the ids, hang a leaf with indices[pos:end] under the node reached, return pos"
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
        # BEGIN SOLUTION hint="remove unlocked leaves, oldest last_access first, until n slots are freed"
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
            if node.ref == 0:
                evictable += len(node.value)
            else:
                protected += len(node.value)
            slots.append(node.value)
        assert evictable == self.num_evictable, f"num_evictable is {self.num_evictable}, the tree holds {evictable}"
        assert protected == self.num_protected, f"num_protected is {self.num_protected}, the tree holds {protected}"
        if slots:
            every = torch.cat(slots)
            assert len(torch.unique(every)) == len(every), "a KV slot is held by two nodes"
