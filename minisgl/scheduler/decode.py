from __future__ import annotations

from collections.abc import Callable

from minisgl.core import Req


class DecodeManager:
    """The requests whose prompt is done: each decode batch extends all of them by one token."""

    def __init__(self):
        self.running: dict[Req, None] = {}  # insertion-ordered set
        # of those, requests whose verify pass (speculate.py) is not processed: their counters are provisional
        self.held: set[Req] = set()
        # called with every request removed (finished, aborted or retracted): per-request state kept
        # elsewhere (speculative decoding's, speculate.py) is dropped there
        self.on_remove: list[Callable[[Req], None]] = []

    def add(self, req: Req) -> None:
        self.running[req] = None

    def remove(self, req: Req) -> None:
        self.running.pop(req, None)
        self.held.discard(req)
        for fn in self.on_remove:
            fn(req)

    def schedule(self) -> list[Req]:
        return [r for r in self.running if r.can_decode and r not in self.held]
