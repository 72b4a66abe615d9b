"""N-gram drafting (prompt lookup): no second model. The last few tokens are looked up earlier in the
request's own text (prompt and outputs); what followed their latest earlier occurrence is the guess::

    tokens:  ... the quick brown fox jumps over ... | the quick brown
                 ^^^^^^^^^^^^^^^ match   ^^^^^^^^^^ proposed: "fox jumps over"

It pays where the output copies its context: code edits, quoting, lists repeated with changes,
summaries of a shared document. On free chat it rarely finds a match longer than a token or two.
"""

from __future__ import annotations

import numpy as np

from minisgl.core import Req
from minisgl.speculative.base import Drafter


def lookup(tokens: list[int] | np.ndarray, k: int, max_n: int = 4, min_n: int = 2) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the longest suffix of
    ``tokens`` of ``min_n..max_n`` tokens; ``[]`` when no such suffix occurs earlier.

    "Earlier" means the occurrence ends before the last token, so at least one token follows it."""
    arr = np.asarray(tokens, dtype=np.int64)
    n_tok = len(arr)
    for n in range(min(max_n, n_tok - 1), min_n - 1, -1):
        # windows starting at 0 .. n_tok - n - 1: each is followed by at least one token
        windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
        hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n  # the latest match: the most recent context is the best guess
            return arr[start : start + k].tolist()
    return []


class NgramDrafter(Drafter):
    """``lookup`` over the request's prompt and outputs, suffixes of 4 down to 2 tokens (a choice: a
    1-token suffix matches nearly always, and every wrong draft costs a verify position)."""

    max_n, min_n = 4, 2

    def propose(self, req: Req, k: int) -> list[int]:
        return lookup(req.input_ids + req.output_ids, k, self.max_n, self.min_n)
