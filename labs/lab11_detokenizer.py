"""Lab 11: incremental detokenization with stop strings.

You implement the two halves of turning a sequence's tokens into the text a client sees while it
streams: the ``Detokenizer`` and ``StopStrings`` interfaces (``from minisgl.tokenizer.detokenizer import
...``, as below; this docstring states their contracts). Write both classes here: the engine's own
implementations of these interfaces are off limits, and so is the ``tokenizers`` library's own
incremental decoder (``tokenizers.decoders.DecodeStream``): a lab that subclasses, aliases or calls them
is graded 0. The server runs them in two processes::

    scheduler --token ids--> detokenizer process --text pieces--> API server --SSE / JSON--> client
                             LabDetokenizer (one per request)      LabStopStrings (one per sequence)

**LabDetokenizer** (``push(ids) -> str``, ``flush() -> str``). Decoding each token on its own is
wrong twice: a byte-level BPE (SmolLM2's) splits a multi-byte character such as ``é`` or ``🎉``
over several tokens, whose bytes alone decode to U+FFFD; and a SentencePiece-style tokenizer drops
the leading space of the first token it decodes. So keep every id, and decode a *window*
``ids[prefix:]`` that starts at the tokens of the previous piece, once without the new tokens
(``ids[prefix:read]``) and once with them; the new text is what the second decode adds::

    ids:   t0 t1 t2 | t3 t4 | t5 (new)
                    prefix  read
    old = decode(ids[prefix:read]) = decode([t3, t4])
    new = decode(ids[prefix:])     = decode([t3, t4, t5])   ->   return new[len(old):]

* If ``new`` ends in U+FFFD (``"\\ufffd"``) the last character is not complete yet: return ``""``
  and keep the tokens (the next push decodes them again). Return ``""`` too when ``new`` is no
  longer than ``old`` (a skipped special token).
* After returning text, move the window: ``prefix = read`` and ``read = len(ids)``.
* ``flush()`` (the sequence ended) returns what is still held back, as decoded, U+FFFD included.
* ``tokenizer`` None: always ``""``. Decode with ``skip_special_tokens=self.skip``.

**LabStopStrings** (``feed(text) -> str``, ``flush() -> str``, ``stopped``). Pieces of text come in;
what may be sent goes out. Keep the text received but not sent in ``self.pending``; on each
``feed``, look at ``buf = pending + text``:

* If a stop string occurs in ``buf``, cut where the *earliest-starting* occurrence of any stop
  string begins (stops may overlap: with stops ``["cd", "bcd"]`` the text ``"abcde"`` is cut to
  ``"a"``), set ``stopped``, and return ``buf`` up to the cut. The stop string is never sent, nor
  anything after it; every later ``feed`` returns ``""``.
* Else hold back the *longest* tail of ``buf`` that is the start (a proper prefix) of some stop
  string, and return the rest: with the stop ``"</s>"``, ``"Hi </"`` sends ``"Hi "`` and keeps
  ``"</"``; ``"s>"`` then completes the stop. A stop string can span any number of pieces.
* ``flush()`` (the sequence ended without a stop) returns the held-back text; ``""`` once stopped.
* No stop strings: ``feed`` returns its input.

Pitfalls the grader recognises (its messages name them):

* sending a piece that ends in U+FFFD (an incomplete character), or decoding each token on its own
  (broken characters, lost spaces);
* sending text twice (returning the whole window, or not moving it);
* ``flush`` that drops what was held back (a sequence that ends mid-character, or whose last words
  looked like the start of a stop string, loses its end);
* no hold-back (``"</"`` leaks to the client before ``"s>"`` arrives), cutting after the stop string
  instead of before it, looking for the stop only in the new piece (a stop spanning pieces is
  missed), and the latest match instead of the earliest.

Grading: ``python -m autograder lab11`` runs both classes on tricky tokenizations (SmolLM2's
byte-level BPE, a tiny SentencePiece-style tokenizer) and random streams against the reference,
then starts ``python -m minisgl --detokenizer lab11_detokenizer:TEXT_STREAMS`` and compares what
the ``openai`` client gets (streaming and not, with stop strings) with the reference server's.
"""

from __future__ import annotations

from typing import Any

from minisgl.tokenizer.detokenizer import Detokenizer, StopStrings, TextStreams

REPLACEMENT = "\ufffd"  # what a decoder writes for bytes that are not (yet) a whole character


class LabDetokenizer(Detokenizer):
    """Incremental detokenization over a sliding window (the contract is the module docstring)."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True):
        super().__init__(tokenizer, skip_special_tokens)
        self.ids: list[int] = []
        self.prefix = 0  # the window starts here: the tokens of the last piece sent (spacing context)
        self.read = 0  # ids[:read] have had their text returned

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; return the text they complete ("" while the last character is incomplete)."""
        raise NotImplementedError("Lab 11: decode ids[prefix:read] and ids[prefix:]; return the growth unless it ends in U+FFFD")

    def flush(self) -> str:
        """The sequence ended: return the text still held back, as decoded (U+FFFD included)."""
        raise NotImplementedError("Lab 11: as push, but return the growth even when it ends in U+FFFD")


class LabStopStrings(StopStrings):
    """Stop strings on streamed text: hold back a possible start, cut at the earliest match."""

    def __init__(self, stops: list[str]):
        super().__init__(stops)
        self.pending = ""  # received, not sent: holds no stop string, and may be the start of one

    def feed(self, text: str) -> str:
        """Add a piece of text; return what may be sent now."""
        raise NotImplementedError("Lab 11: buf = pending + text: cut at its earliest stop, else hold back the longest stop start")

    def flush(self) -> str:
        """The sequence ended without a stop string: the text held back ("" once stopped)."""
        raise NotImplementedError("Lab 11: return the held-back text (and forget it); nothing once stopped")


# what the server runs: python -m minisgl --detokenizer lab11_detokenizer:TEXT_STREAMS
TEXT_STREAMS = TextStreams(LabDetokenizer, LabStopStrings)
