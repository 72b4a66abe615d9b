"""Constrained decoding's seam: a ``GrammarBackend`` compiles a request's constraint (a JSON schema, a
regex, an EBNF grammar) once, and a ``Matcher`` per request says which tokens may come next.

The mask of a batch is a packed bitmask, one row per batch row, 32 tokens per ``int32`` word::

    bitmask[r, w] bit b  (b = 0 is the lowest bit)  <->  token 32 * w + b is allowed for row r
    shape [batch, ceil(vocab / 32)];  vocab is the model's (its LM head may be wider than the
    tokenizer: a token the tokenizer does not have is never allowed)

``apply_bitmask`` sets the logits of the disallowed tokens of the constrained rows to ``-inf``
before sampling; the other rows are not touched. Backends are registered in ``GRAMMAR_BACKENDS``
and chosen with ``components={"grammar": NAME}`` (lesson 14 builds one from a DFA; the engine's
own is xgrammar, ``minisgl/grammar/xgrammar_backend.py``; ``dfa`` is the regex-only backend of
``minisgl/grammar/dfa_backend.py``, lab 14's reference).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from minisgl.registry import Registry

KINDS = ("json_schema", "regex", "ebnf")  # what a request may ask for (SamplingParams' fields)


class GrammarError(ValueError):
    """A constraint that cannot be compiled; the message says what is wrong with it."""


class Matcher(ABC):
    """One request's position in its grammar.

    Contract: ``fill_bitmask(bitmask, row)`` writes row ``row`` of a packed bitmask (layout above)
    with the tokens allowed next, a stop token (EOS) only where the grammar may end here. A token
    from that set is then passed to ``accept_token``, which returns False (and changes nothing) for
    a token outside it. Once a stop token was accepted, ``is_terminated`` is True and nothing more
    may be asked of the matcher."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool: ...

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None: ...

    @abstractmethod
    def is_terminated(self) -> bool: ...


class GrammarBackend(ABC):
    """Compiles constraints for one tokenizer (lesson 14's seam, registered in ``GRAMMAR_BACKENDS``).

    Built once per engine, off the scheduler's loop (in a thread of ``compiler.py``), with the model's HF
    tokenizer, the model's vocabulary size (the logits' width) and the token ids that end a request.
    The engine calls ``compile`` twice for a new constraint (``compiler.py``): once in a forked child of
    the scheduler's process, which it can stop, then in the compile thread; ``matcher`` in the loop."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: list[int]):
        self.tokenizer, self.vocab_size, self.stop_ids = tokenizer, vocab_size, list(stop_ids)

    @classmethod
    def build(cls, model_path: Any, vocab_size: int, stop_ids: list[int]) -> GrammarBackend:
        """The backend of a model folder (what the engine calls): by default ``cls`` with its tokenizer."""
        return cls(tokenizer_of(model_path), vocab_size, stop_ids)

    @abstractmethod
    def compile(self, kind: str, text: str) -> Any:
        """The compiled form of a constraint (``kind`` in ``KINDS``); raises ``GrammarError`` naming
        the problem for one that cannot be compiled (or a kind this backend does not do)."""

    @abstractmethod
    def matcher(self, compiled: Any) -> Matcher:
        """A fresh matcher at the start of ``compiled``."""

    @classmethod  # noqa: B027 (an optional hook)
    def check(cls, kind: str, text: str) -> None:
        """Raise ``GrammarError`` for a constraint whose syntax is wrong; fast (it runs before the request
        waits for a compile). The default checks nothing (``compile`` will)."""

    def nbytes(self, compiled: Any) -> int:
        """Memory ``compiled`` holds, for the engine's cache of compiled constraints (0: unknown, then
        the constraint's text counts)."""
        return 0


def tokenizer_of(model_path: Any) -> Any:
    from minisgl.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    if tokenizer is None:
        raise GrammarError("this model has no tokenizer; constrained decoding needs one")
    return tokenizer


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def pack_bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """A ``[vocab]`` bool tensor as one packed bitmask row ``[ceil(vocab / 32)]`` int32."""
    n = allowed.shape[-1]
    bits = torch.zeros(bitmask_words(n) * 32, dtype=torch.int64)
    bits[:n] = allowed.to(torch.int64)
    words = (bits.view(-1, 32) << torch.arange(32)).sum(dim=1)
    return (words - ((words >> 31) & 1) * (1 << 32)).to(torch.int32)  # two's complement into int32


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """``logits[r, t] = -inf`` for each row ``r`` in ``rows`` and each token ``t`` its bitmask row
    disallows (``bitmask`` on the logits' device, one row per logits row). Other rows are untouched."""
    if not rows:
        return
    try:
        import xgrammar as xgr

        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[-1], indices=rows)
        return
    except ImportError:  # the plain torch version (any device)
        pass
    vocab, idx = logits.shape[-1], torch.tensor(rows, device=logits.device)
    shifts = torch.arange(32, device=logits.device, dtype=torch.int32)
    allowed = ((bitmask[idx][:, :, None] >> shifts) & 1).flatten(1)[:, :vocab].bool()
    logits[idx] = logits[idx].masked_fill(~allowed, float("-inf"))


# name -> a GrammarBackend class; the engine's own is imported on first use (xgrammar is a heavy import)
GRAMMAR_BACKENDS: Registry[type[GrammarBackend]] = Registry(
    "grammar backend",
    {"default": "minisgl.grammar.xgrammar_backend:XGrammarBackend", "dfa": "minisgl.grammar.dfa_backend:DFABackend"},
    aliases={"xgrammar": "default"},
)
