"""Radix prefix cache (RadixAttention): a compressed trie over token ids whose edges carry the KV
slot indices of those tokens.

    root ─ [You are a helpful assistant.] ─┬─ [ What is 2+2?]
                                           └─ [ Tell me a joke.] ─ [ Another one.]

A node's ``ref`` counts the locks on it or on any descendant (a lock pins the whole path), so an
unlocked node has only unlocked descendants and leaves can be evicted bottom-up in LRU order.
With ``page_size > 1`` keys are whole pages: children are indexed by their first page.
"""

from __future__ import annotations

import heapq
from typing import Any

import torch

from minisgl.kvcache.base import MatchResult, PrefixCache

_EMPTY = torch.empty(0, dtype=torch.int64)


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix; compares 64-token slices in C before going one by one."""
    n, i = min(len(a), len(b)), 0
    while i < n and a[i : i + 64] == b[i : i + 64]:
        i += 64
    i = min(i, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i


class RadixNode:
    __slots__ = ("key", "value", "children", "parent", "ref", "last_access")

    def __init__(self, key: list[int], value: torch.Tensor, parent: RadixNode | None):
        self.key, self.value, self.parent = key, value, parent
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.ref = 0
        self.last_access = 0

    def __lt__(self, other: RadixNode) -> bool:
        # heap tie-break; by content, not address: tensor-parallel ranks must evict the same nodes
        return self.key < other.key


class RadixPrefixCache(PrefixCache):
    # the key compare, swappable: a subclass may set its own (lab 13 puts a C++ kernel here)
    prefix_len = staticmethod(common_prefix_len)

    def __init__(self, page_size: int = 1):
        super().__init__(page_size)
        self.root = RadixNode([], _EMPTY, None)
        self._evictable = 0
        self._protected = 0
        self._clock = 0

    # ---- lookup -------------------------------------------------------------------------
    def _edge(self, ids: list[int], pos: int) -> tuple[int, ...]:
        return tuple(ids[pos : pos + self.page_size])

    def _walk(self, ids: list[int]) -> tuple[RadixNode, int, list[torch.Tensor]]:
        """Follow ``ids`` (page-aligned) down the tree, splitting the last node if the match ends
        inside it; return the deepest node matched, the matched length and the slots on the way."""
        end, node, pos, values = self.aligned(len(ids)), self.root, 0, []
        while pos < end:
            child = node.children.get(self._edge(ids, pos))
            if child is None:
                break
            n = self.aligned(self.prefix_len(child.key, ids[pos:end]))
            if n < len(child.key):
                child = self._split(child, n)
            values.append(child.value)
            node, pos = child, pos + n
        self._touch(node)
        return node, pos, values

    def _split(self, node: RadixNode, n: int) -> RadixNode:
        """Cut ``node`` after ``n`` tokens; the new upper half inherits its locks and age."""
        mid = RadixNode(node.key[:n], node.value[:n], node.parent)
        mid.ref, mid.last_access = node.ref, node.last_access
        node.parent.children[self._edge(mid.key, 0)] = mid
        node.key, node.value, node.parent = node.key[n:], node.value[n:], mid
        mid.children[self._edge(node.key, 0)] = node
        return mid

    def _touch(self, node: RadixNode) -> None:
        self._clock += 1
        while node is not None:
            node.last_access = self._clock
            node = node.parent

    def match_prefix(self, token_ids: list[int]) -> MatchResult:
        node, length, values = self._walk(token_ids)
        return MatchResult(length, torch.cat(values) if values else _EMPTY, node)

    # ---- reference counts ---------------------------------------------------------------
    def lock(self, handle: Any) -> None:
        node = handle
        while node is not None and node is not self.root:
            if node.ref == 0:
                self._evictable -= len(node.value)
                self._protected += len(node.value)
            node.ref += 1
            node = node.parent

    def unlock(self, handle: Any) -> None:
        node = handle
        while node is not None and node is not self.root:
            if node.ref <= 0:
                raise RuntimeError("unlock() of a radix node that is not locked")
            node.ref -= 1
            if node.ref == 0:
                self._protected -= len(node.value)
                self._evictable += len(node.value)
            node = node.parent

    # ---- insert / evict -----------------------------------------------------------------
    def insert(self, token_ids: list[int], indices: torch.Tensor) -> int:
        end = self.aligned(len(token_ids))
        node, pos, _ = self._walk(token_ids)
        if pos < end:
            leaf = RadixNode(list(token_ids[pos:end]), indices[pos:end].clone(), node)
            node.children[self._edge(leaf.key, 0)] = leaf
            self._evictable += end - pos
            self._touch(leaf)
        return pos

    def evict(self, n: int) -> torch.Tensor:
        if n <= 0:
            return _EMPTY
        if n > self._evictable:
            raise ValueError(f"cannot evict {n} slots: only {self._evictable} are evictable")
        heap = [(nd.last_access, nd) for nd in self._nodes() if not nd.children and nd.ref == 0]
        heapq.heapify(heap)
        freed, count = [], 0
        while count < n:
            _, leaf = heapq.heappop(heap)
            freed.append(leaf.value)
            count += len(leaf.value)
            self._evictable -= len(leaf.value)
            parent = leaf.parent
            del parent.children[self._edge(leaf.key, 0)]
            if parent is not self.root and not parent.children and parent.ref == 0:
                heapq.heappush(heap, (parent.last_access, parent))
        return torch.cat(freed)

    # ---- sizes and checks ---------------------------------------------------------------
    @property
    def evictable_size(self) -> int:
        return self._evictable

    @property
    def protected_size(self) -> int:
        return self._protected

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def check_integrity(self) -> None:
        evictable = protected = 0
        slots = []
        for node in self._nodes():
            assert len(node.key) == len(node.value) > 0, "node key and value lengths differ"
            assert len(node.key) % self.page_size == 0, "node not page-aligned"
            assert node.parent.children.get(self._edge(node.key, 0)) is node, "broken parent link"
            assert node.ref >= 0, "negative reference count"
            assert node.parent is self.root or node.parent.ref >= node.ref, "child locked more than parent"
            if node.ref == 0:
                evictable += len(node.value)
            else:
                protected += len(node.value)
            slots.append(node.value)
        assert evictable == self._evictable, f"evictable size {self._evictable} != tree's {evictable}"
        assert protected == self._protected, f"protected size {self._protected} != tree's {protected}"
        if slots:
            allslots = torch.cat(slots)
            assert len(torch.unique(allslots)) == len(allslots), "a KV slot is owned twice"

    def all_slots(self) -> torch.Tensor:
        values = [n.value for n in self._nodes()]
        return torch.cat(values) if values else _EMPTY
