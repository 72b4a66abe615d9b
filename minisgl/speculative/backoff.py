"""Back-off for speculative decoding: a request whose drafts keep being rejected stops drafting for a while.

Why: a verify step that accepts none of a request's drafts outputs the one token a decode step would
have, at a higher price: ``k + 1`` decode rows instead of one, and the host's lookup and verdict (on the
CPU about 1.4 decode steps at batch 1, measured in lesson 15; on an H200 about 1.9, more at larger
batches: ``docs/speculative-decoding.md``, "Speculative decoding"). On free chat the n-gram drafter finds short
matches that are nearly never right.

The policy, per request: after a verify step that accepted none of its drafts (a *failure*), the request
does not draft for its next ``wait`` decode steps: 2 after one failure, doubling with each failure in a
row, at most ``max_wait``; a verify step that accepts a draft resets it. When the wait is over the
request drafts again (a probe): the text may have turned repetitive. A waiting request decodes plainly
(under the overlap loop it runs one step behind like any non-speculative request) and its drafter is
not even asked, so a costly drafter (a draft model) is skipped too.

Which steps draft never changes the tokens (a verify step's output is the plain engine's: exactly for
greedy rows, in distribution for sampled ones), so this is free to be a heuristic. It is deterministic
in the request's tokens, so tensor-parallel ranks agree on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from minisgl.core import Req

FIRST_WAIT = 2  # decode steps skipped after the first failure; each further failure in a row doubles it


@dataclass
class BackoffState:
    fails: int = 0  # verify steps in a row that accepted none of the request's drafts (>= 1 while tracked)
    wait: int = 0  # decode steps left in which the request does not draft


class Backoff:
    """Per-request back-off state. Invariant: only requests in a failure streak have an entry, and an
    entry is dropped when its request leaves the running set (``release``): nothing outlives a request."""

    def __init__(self, max_wait: int):
        self.max_wait = max_wait  # 0: never wait (back-off off)
        self.state: dict[Req, BackoffState] = {}

    def should_draft(self, req: Req) -> bool:
        """Called once per decode step ``req`` takes part in (a speculative request): may it draft now?
        A ``False`` counts one step of its wait."""
        s = self.state.get(req)
        if s is None or s.wait == 0:
            return True
        s.wait -= 1
        return False

    def observe(self, req: Req, accepted: int) -> None:
        """The outcome of ``req``'s verify step that proposed at least one draft."""
        if accepted > 0 or self.max_wait <= 0:
            self.state.pop(req, None)
            return
        s = self.state.setdefault(req, BackoffState())
        s.fails += 1
        s.wait = min(FIRST_WAIT << min(s.fails - 1, 30), self.max_wait)

    def release(self, req: Req) -> None:
        self.state.pop(req, None)
