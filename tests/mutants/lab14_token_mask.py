"""Broken variants of solutions/lab14_token_mask.py: one per pitfall its docstring names, one of each
kind of hole (``mutants.KINDS``), a correct one written another way (``EQUIVALENT``: tokens walked
through a trie of their bytes, so shared prefixes are walked once), and three that the hidden tests
catch (``HIDDEN_MUTANTS``)."""

from mutants import Mutant

STEM = "lab14_token_mask"

NOT_APPLICABLE: dict[str, str] = {}

# every fixed unit test whose bugs the randomized test also meets (its explicit cases first)
RANDOMIZED = {
    name: "random_regexes_match_reference"
    for name in (
        "token_bytes_byte_level",
        "token_bytes_special_tokens",
        "walk_through_dead_state",
        "allowed_tokens_fixed",
        "eos_only_in_accepting_states",
        "empty_token_never_allowed",
        "pack_row_bit_order",
        "pack_row_boundaries",
        "matcher_spans_states",
        "fill_bitmask_padded_vocab",
    )
}

_WALK = "        nxt = dfa.step(state, b)\n        if nxt == DEAD:\n            return DEAD\n        state = nxt\n"
_EOS = "            if accepting:\n                out.append(i)\n"
_WORDS = "    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)\n"
_ACCEPT = (
    "        nxt = walk(dfa, self.state, data) if data else DEAD\n        if nxt == DEAD:\n            return False\n"
    "        self.state = nxt\n"
)

MUTANTS = [
    Mutant(
        "token_text_as_utf8",
        STEM,
        (
            (
                "                out[i] = bytes(BYTE_DECODER[c] for c in text)\n",
                '                out[i] = text.encode("utf-8")\n',
            ),
        ),
        must_fail=("token_bytes_byte_level", "random_regexes_match_reference"),
        hint="map every character through BYTE_DECODER",
        why="a byte-level token's text encoded as UTF-8: 'Ġthe' becomes b'\\xc4\\xa0the', not b' the'",
    ),
    Mutant(
        "specials_from_all_special_ids",
        STEM,
        (
            (
                "            tok = added.get(i)\n",
                "            tok = added.get(i) if i in tokenizer.all_special_ids else None\n",
            ),
        ),
        must_fail=("token_bytes_special_tokens", "random_regexes_match_reference"),
        hint="all_special_ids lists only",
        why="special tokens taken from all_special_ids alone: <repo_name> and 13 others become text",
    ),
    Mutant(
        "walk_keeps_the_fine_prefix",
        STEM,
        ((_WALK, _WALK.replace("            return DEAD\n", "            break\n")),),
        must_fail=("walk_through_dead_state", "allowed_tokens_fixed", "random_regexes_match_reference"),
        hint="although a prefix of it was fine",
        why="the walk stops at the refused byte but returns the state before it: '12a' allowed under \\d+",
    ),
    Mutant(
        "empty_token_allowed",
        STEM,
        (
            (
                "        elif data and walk(dfa, state, data) != DEAD:\n",
                "        elif data is not None and walk(dfa, state, data) != DEAD:\n",
            ),
        ),
        must_fail=("empty_token_never_allowed", "allowed_tokens_fixed", "random_regexes_match_reference"),
        hint="the empty token is never allowed",
        why="b'' walks nowhere and so never dies: it is allowed in every state",
    ),
    Mutant(
        "eos_anywhere",
        STEM,
        ((_EOS, "                out.append(i)\n"),),
        must_fail=("eos_only_in_accepting_states", "allowed_tokens_fixed", "random_regexes_match_reference"),
        hint="EOS is allowed only in accepting states",
        why="stop ids allowed in every state: the model may end before the output matches",
    ),
    Mutant(
        "eos_never",
        STEM,
        ((_EOS, "                pass\n"),),
        must_fail=(
            "eos_only_in_accepting_states",
            "allowed_tokens_fixed",
            "random_regexes_match_reference",
            "engine_follows_regexes",
        ),
        hint="EOS must be allowed where the state is accepting",
        why="stop ids never allowed: a finished match has nothing left to sample, and the request cannot stop",
    ),
    Mutant(
        "bit_order_reversed",
        STEM,
        (("        words[t // 32] |= 1 << (t % 32)\n", "        words[t // 32] |= 1 << (31 - t % 32)\n"),),
        must_fail=("pack_row_bit_order", "random_regexes_match_reference"),
        hint="the bit order within a word is reversed",
        why="token t at bit 31 - t % 32 (the highest bit first)",
    ),
    Mutant(
        "bit_31_overflows",
        STEM,
        ((_WORDS, "    return torch.tensor(words, dtype=torch.int32)\n"),),
        must_fail=("pack_row_bit_order", "random_regexes_match_reference"),
        hint="int32 is two's complement",
        why="a word with bit 31 set (2**31 or more) does not fit an int32: torch refuses it",
    ),
    Mutant(
        "row_sized_by_the_tokenizer",
        STEM,
        (
            (
                "            compiled.rows[state] = pack_row(allowed, self.vocab_size)\n",
                "            compiled.rows[state] = pack_row(allowed, len(self.vocab))\n",
            ),
            (
                "        bitmask[row] = self.backend.row(self.compiled, self.state)\n",
                "        words = self.backend.row(self.compiled, self.state)\n"
                "        bitmask[row, : len(words)] = words\n",
            ),
        ),
        must_fail=("fill_bitmask_padded_vocab", "random_regexes_match_reference"),
        hint="the padded LM head",
        why="the row covers the tokenizer's tokens only: the padded ids keep the engine's all-ones",
    ),
    Mutant(
        "matcher_steps_the_first_byte",
        STEM,
        (
            (
                "        nxt = walk(dfa, self.state, data) if data else DEAD\n",
                "        nxt = dfa.step(self.state, data[0]) if data else DEAD\n",
            ),
        ),
        must_fail=("matcher_spans_states", "random_regexes_match_reference"),
        hint="by all of the token's bytes",
        why="accept_token advances by the token's first byte only: '4-' leaves the matcher among the digits",
    ),
    Mutant(
        "eos_does_not_terminate",
        STEM,
        (
            (
                "            self.terminated = self.state in dfa.accepting\n            return self.terminated\n",
                "            return self.state in dfa.accepting\n",
            ),
        ),
        must_fail=("matcher_terminates",),
        hint="is_terminated() must be True",
        why="EOS accepted but the matcher goes on: the engine never learns that the grammar ended",
    ),
    Mutant(
        "masks_not_cached",
        STEM,
        (("        if state not in compiled.rows:\n", "        if True:\n"),),
        must_fail=("masks_cached",),
        hint="at most once per compiled regex",
        why="a scan of the whole vocabulary at every step of every request",
    ),
    Mutant(
        "non_special_added_tokens_dropped",
        STEM,
        (("            elif not tok.special:\n", "            elif False:\n"),),
        must_fail=("token_bytes_special_tokens", "random_regexes_match_reference"),
        hint="an added token that is not special writes its text as UTF-8",
        why="every added token is None, also one that is plain text: the model can never write it",
    ),
    Mutant(
        "stop_ids_listed_first",
        STEM,
        (
            (
                "    return out\n    # END SOLUTION\n\n\ndef pack_row",
                "    return sorted(i for i in out if i in stops) + [i for i in out if i not in stops]\n"
                "    # END SOLUTION\n\n\ndef pack_row",
            ),
        ),
        must_fail=("eos_only_in_accepting_states",),
        hint="in ascending order",
        why="the allowed stop ids come before the text tokens: the ids are no longer ascending",
    ),
    # ---- the kinds of hole (mutants.KINDS) --------------------------------------------------------------
    Mutant(
        "word_of_exactly_bit_31",
        STEM,
        ((_WORDS, _WORDS.replace("w >= 1 << 31", "w > 1 << 31")),),
        must_fail=("pack_row_boundaries", "random_regexes_match_reference"),
        hint="exactly 1 << 31",
        why="a word of exactly 2**31 (only bit 31 set) is not wrapped and overflows int32",
        kind="boundary",
    ),
    Mutant(
        "vocab_size_equal_refused",
        STEM,
        (("        if vocab_size < len(self.vocab):\n", "        if vocab_size <= len(self.vocab):\n"),),
        must_fail=("backend_input_checks",),
        hint="vocab_size == len(tokenizer) is allowed",
        why="an LM head exactly as wide as the tokenizer (the embedded model's) is refused",
        kind="boundary",
    ),
    Mutant(
        "stop_ids_unchecked",
        STEM,
        (
            (
                "        if any(not 0 <= s < vocab_size for s in self.stop_ids):\n"
                '            raise ValueError(f"a stop id outside [0, {vocab_size}): {self.stop_ids}")\n',
                "",
            ),
        ),
        must_fail=("backend_input_checks",),
        hint="a stop id outside [0, vocab_size)",
        why="the constructor checks vocab_size only; a stop id past the logits would index out of the row",
        kind="one_argument",
    ),
    Mutant(
        "walk_checks_the_final_state_only",
        STEM,
        ((_WALK, "        state = dfa.step(state, b)\n"),),
        must_fail=("walk_through_dead_state", "random_regexes_match_reference"),
        hint="a later byte never brings it back",
        why="each byte's step must be live, not only the last: DEAD (-1) indexes the last row and revives '1a2'",
        kind="each_part",
    ),
    Mutant(
        "state_moves_before_the_check",
        STEM,
        (
            (
                _ACCEPT,
                _ACCEPT.replace("        nxt = walk", "        self.state = nxt = walk").replace(
                    "        self.state = nxt\n", ""
                ),
            ),
        ),
        must_fail=("matcher_refuses_and_changes_nothing",),
        hint="a refused token changes nothing",
        why="the state is advanced before the walk is checked: a refused token leaves the matcher DEAD",
        kind="order",
    ),
    Mutant(
        "backend_derives_from_the_engine",
        STEM,
        (
            (
                "from minisgl.grammar.regex_dfa import BYTE_DECODER, DEAD, DFA, compile_regex\n",
                "from minisgl.grammar.dfa_backend import DFABackend\n"
                "from minisgl.grammar.regex_dfa import BYTE_DECODER, DEAD, DFA, compile_regex\n",
            ),
            ("class LabGrammarBackend(GrammarBackend):\n", "class LabGrammarBackend(DFABackend):\n"),
        ),
        must_fail=("backend_input_checks", "matcher_spans_states"),
        hint="the engine's own",
        why="the backend is the engine's DFABackend with the lab's name",
        kind="engine_reference",
    ),
    Mutant(
        "pack_row_calls_pack_bitmask",
        STEM,
        (
            (
                "    words = [0] * bitmask_words(vocab_size)\n",
                "    from minisgl.grammar.base import pack_bitmask\n\n"
                "    flags = torch.zeros(vocab_size, dtype=torch.bool)\n"
                "    flags[list(allowed)] = True\n"
                "    return pack_bitmask(flags)\n"
                "    words = [0] * bitmask_words(vocab_size)\n",
            ),
        ),
        must_fail=("pack_row_bit_order", "pack_row_boundaries"),
        hint="the engine's own",
        why="pack_row delegates to the engine's pack_bitmask",
        kind="engine_reference",
    ),
    Mutant(
        "one_word_too_many_visibly",
        STEM,
        (("    words = [0] * bitmask_words(vocab_size)\n", "    words = [0] * (vocab_size // 32 + 1)\n"),),
        must_fail=("pack_row_boundaries", "random_regexes_match_reference"),
        hint="bitmask_words(vocab_size) words",
        why="once a hidden-test-only bug (a vocabulary of whole words gets an extra word): the visible test's "
        "vocabulary of exactly one word shows it now",
        kind="visible_on_cpu",
    ),
]

HIDDEN_MUTANTS = [
    Mutant(
        "added_tokens_all_none",
        STEM,
        (("            elif not tok.special:\n", "            elif False:\n"),),
        must_fail=("token_bytes_added_tokens_not_special",),
        why="every added token is None, also the ones that are plain text (the embedded tokenizer has none)",
    ),
    Mutant(
        "row_sized_by_the_tokenizer",
        STEM,
        MUTANTS[8].edits,
        must_fail=("padded_vocab_word_boundaries",),
        why="the padded ids of a new word keep the engine's all-ones",
    ),
    Mutant(
        "walk_keeps_the_fine_prefix",
        STEM,
        MUTANTS[2].edits,
        must_fail=("every_state_of_unicode_regexes",),
        why="tokens dying midway are allowed in the real vocabulary",
    ),
]

EQUIVALENT = Mutant(
    "equivalent",
    STEM,
    (
        (
            "    stops, accepting = set(stop_ids), state in dfa.accepting\n"
            "    out = []\n"
            "    for i, data in enumerate(vocab):\n"
            "        if i in stops:\n"
            "            if accepting:\n"
            "                out.append(i)\n"
            "        elif data and walk(dfa, state, data) != DEAD:\n"
            "            out.append(i)\n"
            "    return out\n",
            "    stops = set(stop_ids)\n"
            "    # one trie per vocabulary and stop set, built on the first call; the vocabulary is kept with it,\n"
            "    # so its id cannot be reused by another list while the entry lives\n"
            "    tries = globals().setdefault('_TRIES', {})\n"
            "    key = (id(vocab), len(vocab), frozenset(stops))\n"
            "    if key not in tries or tries[key][0] is not vocab:\n"
            "        trie: dict = {}  # byte -> child; the key None holds the ids that end there\n"
            "        for i, data in enumerate(vocab):\n"
            "            if data and i not in stops:\n"
            "                node = trie\n"
            "                for b in data:\n"
            "                    node = node.setdefault(b, {})\n"
            "                node.setdefault(None, []).append(i)\n"
            "        tries[key] = (vocab, trie)\n"
            "    trie = tries[key][1]\n"
            "    out = [i for i in stops if i < len(vocab)] if state in dfa.accepting else []\n"
            "    stack = [(trie, state)]\n"
            "    while stack:\n"
            "        node, s = stack.pop()\n"
            "        for b, child in node.items():\n"
            "            if b is None:\n"
            "                out += child\n"
            "            elif (nxt := dfa.step(s, b)) != DEAD:\n"
            "                stack.append((child, nxt))\n"
            "    return sorted(out)\n",
        ),
    ),
    must_fail=(),
    why="a trie of the tokens' bytes, built once per vocabulary, walked once per state: shared prefixes stepped once",
)
