from __future__ import annotations

from typing import Any

import torch

from minisgl.kvcache.base import MatchResult, PrefixCache


class NaivePrefixCache(PrefixCache):
    """Caches nothing: every request prefills its whole prompt. The ablation baseline."""

    shares_prefixes = False

    def match_prefix(self, token_ids: list[int]) -> MatchResult:
        return MatchResult(0, torch.empty(0, dtype=torch.int64), None)

    def lock(self, handle: Any) -> None:
        pass

    def unlock(self, handle: Any) -> None:
        pass

    def insert(self, token_ids: list[int], indices: torch.Tensor) -> int:
        return self.aligned(len(token_ids))

    def evict(self, n: int) -> torch.Tensor:
        if n > 0:
            raise ValueError(f"cannot evict {n} slots: the naive cache holds none")
        return torch.empty(0, dtype=torch.int64)

    @property
    def evictable_size(self) -> int:
        return 0

    @property
    def protected_size(self) -> int:
        return 0

    def check_integrity(self) -> None:
        pass
