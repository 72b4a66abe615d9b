"""Speculative decoding: a drafter guesses a request's next tokens, one target pass over the paged KV
cache checks them all, and the scheduler rolls the rejected ones back.

``base.py`` is the seam (``Drafter``, ``Verifier`` and their registries), ``ngram.py`` the prompt-lookup
drafter, ``draft_model.py`` the draft-model drafter (``STANDALONE``), ``verify.py`` the engine's verifier;
``feature.py`` the scheduler's side (a ``Feature``: which requests draft, the verify batch, the rollback),
and ``backoff.py`` its back-off.
"""

from minisgl.speculative.base import DRAFTERS, VERIFIERS, Drafter, Rollback, Verdict, Verifier

__all__ = ["DRAFTERS", "VERIFIERS", "Drafter", "Rollback", "Verdict", "Verifier"]
