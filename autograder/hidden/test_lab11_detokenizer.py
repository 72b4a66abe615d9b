"""Lab 11, hidden tests: ``skip_special_tokens=False`` (a chat's ``<|im_end|>`` kept as text), and
several stop strings at once whose possible starts differ in length (the held-back tail is the
longest over all of them). Each calls the lab first, so a stub fails at once with its hint."""

from __future__ import annotations

from autograder.points import points
from autograder.test_lab11_detokenizer import PIECE, check_detokenizer, check_stops, one_by_one, smollm2

warm_before_fork = smollm2  # loaded once by the grader's parent process, not in every test's child


@points(5)
def test_detokenizer_keeps_special_tokens_when_asked():
    """With skip_special_tokens=False the special tokens are text like any other, and sent at once."""
    ids = PIECE.ids("<s>", "▁Hello", "</s>", "▁world", "<pad>")
    check_detokenizer(PIECE, one_by_one(ids), "the piece tokenizer, keeping special tokens", skip=False)
    tok = smollm2()
    chat = [1, *tok.encode("assistant\nHi 🎉"), 2]
    check_detokenizer(tok, one_by_one(chat), "SmolLM2, a chat turn with <|im_start|> / <|im_end|> kept", skip=False)


@points(5)
def test_stops_hold_back_the_longest_start_over_all_stops():
    """Several stop strings: the held-back tail is the longest that begins any of them."""
    check_stops(["x", "abc"], ["zab", "d"])
    check_stops(["END", "\n\nQ", "Nope"], ["fine\n", "\n", "Q?"])
    check_stops(["b", "ab", "aab"], ["caa", "c"])
    check_stops(["zz", "<|im_end|>"], ["ok<|im", "_", "end", "|> tail"])
