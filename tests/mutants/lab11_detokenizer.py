"""Broken variants of solutions/lab11_detokenizer.py: one per pitfall its docstring names, a correct one
written another way (``EQUIVALENT``: the whole sequence decoded at every push, the held-back tail
found longest-first), and two that only the hidden tests catch (``HIDDEN_MUTANTS``: special tokens
always skipped; the hold-back taken from the first stop string that matches, not the longest over
all of them). Both passed every visible test when they were written."""

from mutants import Mutant

STEM = "lab11_detokenizer"

# every fixed test -> the randomized test of the same class, which must fail with it
RANDOMIZED = {
    **{
        name: "detokenizer_random_streams"
        for name in (
            "detokenizer_joins_to_the_full_decode",
            "detokenizer_keeps_spacing",
            "detokenizer_never_sends_a_broken_character",
            "detokenizer_sends_text_as_soon_as_complete",
            "detokenizer_never_sends_text_twice",
            "detokenizer_flush_returns_the_held_back_text",
        )
    },
    **{
        name: "stops_random_streams"
        for name in (
            "stops_hold_back_a_possible_start",
            "stops_cut_at_the_stop_string",
            "stops_spanning_pieces",
            "stops_earliest_match_wins",
            "stops_flush_returns_the_held_back_text",
            "stops_nothing_after_a_stop",
        )
    },
}

_WINDOW = (
    "        old = self.decode(self.ids[self.prefix : self.read])\n"
    "        new = self.decode(self.ids[self.prefix :])\n"
    "        if new.endswith(REPLACEMENT)"
)
_FOUND = "        found = [at for at in (buf.find(s) for s in self.stops) if at != -1]\n"

MUTANTS = [
    Mutant(
        "emits_partial_utf8",
        STEM,
        (("        if new.endswith(REPLACEMENT) or len(new) <= len(old):\n", "        if len(new) <= len(old):\n"),),
        must_fail=("detokenizer_never_sends_a_broken_character", "detokenizer_random_streams"),
        hint="ends in U+FFFD: an incomplete character was sent",
        why="a token holding the first bytes of a character is sent as U+FFFD",
    ),
    Mutant(
        "decodes_each_token_alone",
        STEM,
        (
            (
                _WINDOW,
                '        old = ""\n        new = self.decode(list(token_ids))\n        if new.endswith(REPLACEMENT)',
            ),
        ),
        must_fail=("detokenizer_keeps_spacing", "detokenizer_random_streams"),
        hint="did you decode each token on its own?",
        why="a SentencePiece token's leading space is dropped, and split characters never show",
    ),
    Mutant(
        "re_emits_text",
        STEM,
        (
            (
                "        self.prefix, self.read = self.read, len(self.ids)\n        return new[len(old) :]\n",
                "        self.prefix, self.read = self.read, len(self.ids)\n        return new\n",
            ),
        ),
        must_fail=("detokenizer_never_sends_text_twice", "detokenizer_random_streams"),
        hint="text was sent twice",
        why="the whole window is returned: the last piece's text again, then the new text",
    ),
    Mutant(
        "detokenizer_flush_drops_text",
        STEM,
        (
            (
                "        return rest\n        # END SOLUTION\n\n\nclass",
                '        return ""\n        # END SOLUTION\n\n\nclass',
            ),
        ),
        must_fail=("detokenizer_flush_returns_the_held_back_text", "detokenizer_random_streams"),
        hint="flush dropped the held-back text",
        why="a sequence that ends in the middle of a character loses its last bytes",
    ),
    Mutant(
        "no_hold_back",
        STEM,
        (("                    hold = max(hold, n)\n", "                    hold = 0\n"),),
        must_fail=("stops_hold_back_a_possible_start", "stops_random_streams"),
        hint="which may be the start of a stop string",
        why='"</" reaches the client before "s>" shows it was the stop string "</s>"',
    ),
    Mutant(
        "cuts_after_the_stop",
        STEM,
        ((_FOUND, "        found = [at + len(s) for s, at in ((s, buf.find(s)) for s in self.stops) if at != -1]\n"),),
        must_fail=("stops_cut_at_the_stop_string", "stops_random_streams"),
        hint="you cut after the stop string, not at it",
        why="the stop string itself is sent",
    ),
    Mutant(
        "misses_a_stop_spanning_pieces",
        STEM,
        (
            (
                _FOUND,
                "        found = [len(self.pending) + at for at in (text.find(s) for s in self.stops) if at != -1]\n",
            ),
        ),
        must_fail=("stops_spanning_pieces", "stops_random_streams"),
        hint="you missed a stop string that spans pieces",
        why="only the new piece is searched: a stop string split over pieces goes out to the client",
    ),
    Mutant(
        "latest_match",
        STEM,
        (("            return buf[: min(found)]\n", "            return buf[: max(found)]\n"),),
        must_fail=("stops_earliest_match_wins", "stops_random_streams"),
        hint="the earliest-starting stop string wins",
        why="with overlapping stop strings the text is cut at the later one",
    ),
    Mutant(
        "stop_flush_drops_text",
        STEM,
        (('        return "" if self.stopped else rest\n', '        return ""\n'),),
        must_fail=("stops_flush_returns_the_held_back_text", "stops_random_streams"),
        hint="flush dropped the held-back text",
        why='an answer ending in "</" (max_tokens, EOS) loses it, though no stop string came',
    ),
    Mutant(
        "sends_after_a_stop",
        STEM,
        (
            (
                '        if self.stopped:\n            return ""\n        if not self.stops:',
                "        if not self.stops:",
            ),
        ),
        must_fail=("stops_nothing_after_a_stop", "stops_random_streams"),
        hint="text after a stop string was sent",
        why="pieces fed after the stop (the engine's tokens in flight) reach the client",
    ),
]

EQUIVALENT = Mutant(
    "equivalent",
    STEM,
    (
        (
            "        old = self.decode(self.ids[self.prefix : self.read])\n"
            "        new = self.decode(self.ids[self.prefix :])\n"
            "        if new.endswith(REPLACEMENT) or len(new) <= len(old):\n"
            '            return ""\n'
            "        self.prefix, self.read = self.read, len(self.ids)\n"
            "        return new[len(old) :]\n",
            "        whole = self.decode(self.ids)  # the whole sequence, every time (slower, the same text)\n"
            '        done = getattr(self, "sent_chars", 0)\n'
            "        if whole.endswith(REPLACEMENT) or len(whole) <= done:\n"
            '            return ""\n'
            "        self.sent_chars, self.read = len(whole), len(self.ids)\n"
            "        return whole[done:]\n",
        ),
        (
            "        old = self.decode(self.ids[self.prefix : self.read])\n"
            "        rest = self.decode(self.ids[self.prefix :])[len(old) :]\n"
            "        self.prefix, self.read = self.read, len(self.ids)\n",
            '        rest = self.decode(self.ids)[getattr(self, "sent_chars", 0) :]\n'
            "        self.read = len(self.ids)\n",
        ),
        (
            "        hold = 0\n"
            "        for s in self.stops:\n"
            "            for n in range(1, min(len(s), len(buf) + 1)):\n"
            "                if buf.endswith(s[:n]):\n"
            "                    hold = max(hold, n)\n",
            "        starts = (n for s in self.stops for n in range(len(s) - 1, 0, -1) if buf.endswith(s[:n]))\n"
            "        hold = max(starts, default=0)\n",
        ),
    ),
    must_fail=(),
)

HIDDEN_MUTANTS = [
    Mutant(
        "always_skips_special_tokens",
        STEM,
        (
            (
                "        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)\n",
                "        return self.tokenizer.decode(ids, skip_special_tokens=True)\n",
            ),
        ),
        must_fail=("detokenizer_keeps_special_tokens_when_asked",),
        why="skip_special_tokens=False is ignored: a chat's <|im_end|> never shows",
    ),
    Mutant(
        "hold_back_from_the_first_matching_stop",
        STEM,
        (
            (
                "                    hold = max(hold, n)\n",
                "                    hold = max(hold, n)\n            if hold:\n                break\n",
            ),
        ),
        must_fail=("stops_hold_back_the_longest_start_over_all_stops",),
        why="a later stop string's longer possible start leaks to the client",
    ),
]
