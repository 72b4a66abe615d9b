"""Broken variants of solutions/lab11_detokenizer.py: one per pitfall its docstring names, one of each
kind of hole (``mutants.KINDS``), a correct one written another way (``EQUIVALENT``: the whole sequence
decoded at every push, the held-back tail found longest-first), and two that the hidden tests catch
(``HIDDEN_MUTANTS``: special tokens always skipped; the hold-back taken from the first stop string
that matches, not the longest over all of them). Both passed every visible test when they were
written; visible tests catch them now too (the ``visible_on_cpu`` mutants)."""

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
        "holds_back_too_much",
        STEM,
        (
            (
                "        self.pending = buf[len(buf) - hold :]\n",
                "        hold = min(len(buf), max(len(s) for s in self.stops) - 1)\n"
                "        self.pending = buf[len(buf) - hold :]\n",
            ),
        ),
        must_fail=("stops_hold_back_a_possible_start", "stops_random_streams"),
        hint="you held back text that cannot begin any stop string",
        why="the last len(longest stop) - 1 characters always wait, whether or not they may begin a stop string: "
        "the client gets its text late",
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

_HOLD = (
    "        hold = 0\n"
    "        for s in self.stops:\n"
    "            for n in range(1, min(len(s), len(buf) + 1)):\n"
    "                if buf.endswith(s[:n]):\n"
    "                    hold = max(hold, n)\n"
)
_CUT = "            return buf[: min(found)]\n"

# the contract has no input check: nothing of one argument to get wrong alone
NOT_APPLICABLE = {
    "one_argument": "the contract states no input check: push takes any ids, feed any text, and a None "
    "tokenizer or an empty list of stops is a mode of the contract, not an error",
}

MUTANTS += [
    Mutant(
        "window_moves_when_no_text_was_added",
        STEM,
        (
            (
                "        if new.endswith(REPLACEMENT) or len(new) <= len(old):\n",
                "        if new.endswith(REPLACEMENT) or len(new) < len(old):\n",
            ),
        ),
        must_fail=("detokenizer_skips_special_tokens_and_no_tokenizer",),
        hint="the window moved after a push that added no text",
        why="'no longer than old' read as 'shorter': a skipped special token moves the window, and the next "
        "SentencePiece token loses its leading space",
        kind="boundary",
    ),
    Mutant(
        "holds_back_for_the_longest_stop_only",
        STEM,
        (
            (
                "        for s in self.stops:\n",
                "        for s in [max(self.stops, key=len)]:\n",
            ),
        ),
        must_fail=("stops_hold_back_a_possible_start", "stops_random_streams"),
        hint="which may be the start of a stop string",
        why="the possible start is looked for in the longest stop string only, not in each: a shorter stop's "
        "start ('\\n' of '\\n\\n') leaks to the client",
        kind="each_part",
    ),
    Mutant(
        "holds_back_before_searching",
        STEM,
        (
            (_CUT + _HOLD, _CUT),
            (
                "        buf = self.pending + text\n" + _FOUND,
                "        buf = self.pending + text\n"
                + _HOLD
                + "        found = [at for at in (buf[: len(buf) - hold].find(s) for s in self.stops) if at != -1]\n",
            ),
        ),
        must_fail=("stops_cut_at_the_stop_string", "stops_random_streams"),
        hint="you missed a stop string inside this piece",
        why="the possible start is held back first and the stop strings searched in the rest: a stop that ends "
        "where the piece ends, and whose end begins another stop, is missed",
        kind="order",
    ),
    Mutant(
        "window_moves_read_first",
        STEM,
        (
            (
                "        self.prefix, self.read = self.read, len(self.ids)\n        return new[len(old) :]\n",
                "        self.read = len(self.ids)\n        self.prefix = self.read\n        return new[len(old) :]\n",
            ),
        ),
        must_fail=("detokenizer_keeps_spacing", "detokenizer_random_streams"),
        hint="spaces were lost",
        why="read moves before prefix, so prefix = len(ids): the next window holds no context, and a "
        "SentencePiece token loses its leading space",
        kind="order",
    ),
    Mutant(
        "hold_back_from_the_first_matching_stop_visibly",
        STEM,
        (
            (
                "                    hold = max(hold, n)\n",
                "                    hold = max(hold, n)\n            if hold:\n                break\n",
            ),
        ),
        must_fail=("stops_hold_back_a_possible_start", "stops_random_streams"),
        hint="which may be the start of a stop string",
        why="once a hidden-test-only bug: a later stop string's longer possible start leaks to the client",
        kind="visible_on_cpu",
    ),
    Mutant(
        "always_skips_special_tokens_visibly",
        STEM,
        (
            (
                "        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)\n",
                "        return self.tokenizer.decode(ids, skip_special_tokens=True)\n",
            ),
        ),
        must_fail=("detokenizer_skip_special_tokens_false",),
        hint="special tokens were skipped although skip_special_tokens=False",
        why="once a hidden-test-only bug: skip_special_tokens=False is ignored",
        kind="visible_on_cpu",
    ),
    Mutant(
        "text_streams_of_the_engine",
        STEM,
        (
            (
                "from minisgl.tokenizer.detokenizer import Detokenizer, StopStrings, TextStreams\n",
                "from minisgl.tokenizer.detokenizer import Detokenizer, StopStrings, TextStreams, text_streams\n",
            ),
            ("TEXT_STREAMS = TextStreams(LabDetokenizer, LabStopStrings)\n", "TEXT_STREAMS = text_streams()\n"),
        ),
        must_fail=("detokenizer_joins_to_the_full_decode", "stops_random_streams"),
        hint="the engine's own",
        why="the lab's classes are written, but the server is given the engine's (TEXT_STREAMS of the default): "
        "only the server test, in other processes, would run them",
        kind="engine_reference",
    ),
    Mutant(
        "push_delegates_to_the_engine",
        STEM,
        (
            (
                "from minisgl.tokenizer.detokenizer import Detokenizer, StopStrings, TextStreams\n",
                "from minisgl.tokenizer.detokenizer import Detokenizer, IncrementalDecoder, StopStrings, TextStreams\n",
            ),
            (
                "        self.ids += list(token_ids)\n",
                "        return IncrementalDecoder.push(self, token_ids)\n",
            ),
        ),
        must_fail=("detokenizer_joins_to_the_full_decode", "stops_random_streams"),
        hint="the engine's own",
        why="push is the engine's IncrementalDecoder.push run on the lab's own fields",
        kind="engine_reference",
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
