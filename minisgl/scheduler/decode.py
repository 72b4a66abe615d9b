from __future__ import annotations

from minisgl.core import Req


class DecodeManager:
    """The requests whose prompt is done: each decode batch extends all of them by one token."""

    def __init__(self):
        self.running: dict[Req, None] = {}  # insertion-ordered set
        # of those, requests a feature's own pass has in flight (a verify pass, minisgl/feature.py): their
        # counters are provisional until it is processed, so no batch plans them
        self.held: set[Req] = set()

    def add(self, req: Req) -> None:
        self.running[req] = None

    def remove(self, req: Req) -> None:
        self.running.pop(req, None)
        self.held.discard(req)

    def schedule(self) -> list[Req]:
        return [r for r in self.running if r.can_decode and r not in self.held]
