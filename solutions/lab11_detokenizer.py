"""Lab 11: incremental detokenization with stop strings.

You implement the two halves of turning a sequence's tokens into the text a client sees while it
streams: the ``Detokenizer`` and ``StopStrings`` interfaces (``from minisgl.tokenizer.detokenizer import
...``, as below; this docstring states their contracts). Write both classes here: the engine's own
implementations of these interfaces are off limits, and so is the ``tokenizers`` library's own
incremental decoder (``tokenizers.decoders.DecodeStream``): a lab that subclasses, aliases or calls them
is graded 0. The server runs them in two processes::

    scheduler --token ids--> detokenizer process --text pieces--> API server --SSE / JSON--> client
                             LabDetokenizer (one per request)      LabStopStrings (one per sequence)

**LabDetokenizer** (``push(ids) -> str``, ``flush() -> str``): the tokens of one sequence arrive a few
at a time; each call returns the text they add, and ``flush()`` (the sequence ended) returns whatever is
still held back. Call ``full`` the decode of *all* the sequence's ids at once
(``tokenizer.decode(ids, skip_special_tokens=skip)``). Then:

* **Exact.** The pieces of every ``push`` and the ``flush``, joined, are ``full``.
* **Final.** What has been sent is always the beginning of ``full``: a piece is never taken back or
  changed by later tokens. Two things make that hard. A byte-level BPE (SmolLM2's) splits a
  multi-byte character such as ``é`` or ``🎉`` over several tokens, whose bytes alone decode to
  U+FFFD (``REPLACEMENT``); and a SentencePiece-style tokenizer drops the leading space of the first
  token a decode starts with, so a token decoded without the tokens before it loses its space.
* **Prompt.** Text is sent by the push that completes it: once the ids pushed so far decode to text
  that does not end in U+FFFD, all of it has been sent. Only a character still waiting for its
  other bytes is held back (a push that adds no text, such as a skipped special token, returns ``""``
  and changes nothing for the tokens after it).
* ``flush()`` returns the held-back rest as decoded, U+FFFD included (a sequence that ends in the
  middle of a character); after it nothing is held.
* ``tokenizer`` None (a model served without one): every call returns ``""``.

Example, tokens ``t1 = b"Hi"``, ``t2 = b" \xf0\x9f"`` (the first half of 🎉), ``t3 = b"\x8e\x89"``
(its second half): ``push([t1])`` -> ``"Hi"``; ``push([t2])`` -> ``""`` (the decode ends in U+FFFD);
``push([t3])`` -> ``" 🎉"``; ``flush()`` -> ``""``. Had the sequence ended after ``t2``, ``flush()``
-> ``" \ufffd"``. With SentencePiece pieces ``"▁Hello"``, ``"▁world"`` pushed one at a time:
``"Hello"``, then ``" world"`` (its space kept), never ``"world"``.

**LabStopStrings** (``feed(text) -> str``, ``flush() -> str``, ``stopped``): pieces of text come in
(``feed``); what may be sent to the client goes out. Call ``text`` everything fed so far.

* **The cut.** The client gets ``text`` up to where the *earliest-starting* occurrence of any stop
  string begins (stops may overlap: with stops ``["cd", "bcd"]``, ``"abcde"`` is cut to ``"a"``), and
  nothing of the stop string or after it. The feed that completes a stop string sets ``stopped``;
  from then on ``feed`` and ``flush`` return ``""``. A stop string may span any number of pieces.
* **Hold back no more than needed.** After each feed, everything has been sent except the tail of
  ``text`` that could still become the start of a stop string, whatever comes next (the longest
  such tail, over all stop strings).
* ``flush()`` (the sequence ended without a stop string) returns the text held back.
* No stop strings: ``feed`` returns its input.

Example, the stop ``"</s>"``: ``feed("Hi </")`` -> ``"Hi "`` (``"</"`` may begin ``"</s>"``);
``feed("b>")`` -> ``"</b>"`` (it did not); ``feed(" ok </")`` -> ``" ok "``; ``feed("s> more")`` -> ``""``
and ``stopped``; ``flush()`` -> ``""``.

Pitfalls the grader recognises (its messages name them):

* a piece that ends in U+FFFD (an incomplete character sent), or each token decoded on its own
  (broken characters, lost spaces);
* text sent twice; text held back although its characters are complete;
* a push that adds no text (a skipped special token) changing what the next token decodes to (its
  space lost);
* ``skip_special_tokens=False`` ignored (special tokens are then text like any other);
* ``flush`` that drops what was held back (a sequence that ends mid-character, or whose last words
  looked like the start of a stop string, loses its end);
* no hold-back (``"</"`` leaks to the client before ``"s>"`` arrives), the hold-back of one stop
  string only, cutting after the stop string instead of before it, a stop string that spans pieces
  missed, a stop string inside a piece missed because a possible start was held back first, the
  latest match instead of the earliest, and text sent after the stop.

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
        # BEGIN SOLUTION what="the text the new tokens complete, held back while a character is incomplete" hint="keep every id; decode a window that starts at the tokens of the last piece sent, once without the new tokens and once with them; send the growth unless it ends in U+FFFD or is empty, then move the window"
        self.ids += list(token_ids)
        if self.tokenizer is None or self.read == len(self.ids):
            return ""
        old = self.decode(self.ids[self.prefix : self.read])
        new = self.decode(self.ids[self.prefix :])
        if new.endswith(REPLACEMENT) or len(new) <= len(old):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return new[len(old) :]
        # END SOLUTION

    def flush(self) -> str:
        """The sequence ended: return the text still held back, as decoded (U+FFFD included)."""
        # BEGIN SOLUTION what="the text still held back" hint="as push, but return the growth even when it ends in U+FFFD"
        if self.tokenizer is None or self.read == len(self.ids):
            return ""
        old = self.decode(self.ids[self.prefix : self.read])
        rest = self.decode(self.ids[self.prefix :])[len(old) :]
        self.prefix, self.read = self.read, len(self.ids)
        return rest
        # END SOLUTION


class LabStopStrings(StopStrings):
    """Stop strings on streamed text: hold back a possible start, cut at the earliest match."""

    def __init__(self, stops: list[str]):
        super().__init__(stops)
        self.pending = ""  # received, not sent: holds no stop string, and may be the start of one

    def feed(self, text: str) -> str:
        """Add a piece of text; return what may be sent now."""
        # BEGIN SOLUTION what="the part of the text that may be sent now" hint="look at the held-back text and the new text together: cut where the earliest stop string begins, else hold back the longest tail that begins a stop string"
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self.pending + text
        found = [at for at in (buf.find(s) for s in self.stops) if at != -1]
        if found:
            self.stopped = True
            self.pending = ""
            return buf[: min(found)]
        hold = 0
        for s in self.stops:
            for n in range(1, min(len(s), len(buf) + 1)):
                if buf.endswith(s[:n]):
                    hold = max(hold, n)
        self.pending = buf[len(buf) - hold :]
        return buf[: len(buf) - hold]
        # END SOLUTION

    def flush(self) -> str:
        """The sequence ended without a stop string: the text held back ("" once stopped)."""
        # BEGIN SOLUTION what="the text held back, unless a stop string ended the text" hint="return the held-back text and forget it; nothing once stopped"
        rest, self.pending = self.pending, ""
        return "" if self.stopped else rest
        # END SOLUTION


# what the server runs: python -m minisgl --detokenizer lab11_detokenizer:TEXT_STREAMS
TEXT_STREAMS = TextStreams(LabDetokenizer, LabStopStrings)
