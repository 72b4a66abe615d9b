"""Constrained decoding: a request's output follows a JSON schema, a regex or an EBNF grammar.

``base.py`` is the seam (``GrammarBackend`` compiles, a ``Matcher`` per request fills its row of the
batch's token bitmask), ``xgrammar_backend.py`` the engine's backend, ``manager.py`` the scheduler's
side (one matcher per request, the mask made while the forward pass runs), ``limits.py`` what a
constraint may be, ``compiler.py`` compiling off the loop so that no client can hold it.
"""

from minisgl.grammar.base import (
    GRAMMAR_BACKENDS,
    KINDS,
    GrammarBackend,
    GrammarError,
    Matcher,
    apply_bitmask,
    bitmask_words,
    pack_bitmask,
)

__all__ = [
    "GRAMMAR_BACKENDS",
    "KINDS",
    "GrammarBackend",
    "GrammarError",
    "Matcher",
    "apply_bitmask",
    "bitmask_words",
    "pack_bitmask",
]
