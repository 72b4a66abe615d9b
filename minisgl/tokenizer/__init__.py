"""Tokenizer loading and use: prompts (text, token ids or a chat) to token ids, and EOS ids."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(path: Path | None) -> Any:
    """The HF tokenizer of a model folder, or None when it has none (dummy-weight architectures,
    bare checkpoints): such a model takes token ids only."""
    if path is None or not any((Path(path) / f).exists() for f in _TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def eos_token_ids(tokenizer: Any) -> set[int]:
    if tokenizer is None or tokenizer.eos_token_id is None:
        return set()
    return {int(tokenizer.eos_token_id)}


def apply_chat_template(tokenizer: Any, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model has no chat template; send a plain prompt instead")
    kw = {"tools": tools} if tools else {}  # a chat without tools renders as it always did
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kw)
    if isinstance(out, dict) or hasattr(out, "keys"):  # transformers 5 returns a BatchEncoding
        out = out["input_ids"]
    return list(out)


def tokenize(
    tokenizer: Any,
    text: str | None = None,
    input_ids: list[int] | None = None,
    messages: list[dict] | None = None,
    tools: list[dict] | None = None,
) -> list[int]:
    """The prompt's token ids from exactly one of ``text``, ``input_ids`` or a chat's ``messages``;
    ``ValueError`` says what is wrong with the input (the scheduler checks the ids themselves)."""
    if messages is not None:
        return apply_chat_template(tokenizer, messages, tools)
    if text is not None:
        if tokenizer is None:
            raise ValueError("this model has no tokenizer: send the prompt as token ids")
        return tokenizer.encode(text, add_special_tokens=True)
    return list(input_ids or [])


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, reversed: the character that stands for each byte -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def token_bytes(tokenizer: Any, ids: list[int]) -> list[list[int]]:
    """The bytes each token stands for (OpenAI's ``bytes`` of a logprob): exact for byte-level BPE
    (GPT-2, Llama 3, Qwen, SmolLM) and SentencePiece byte tokens; otherwise the UTF-8 of its text. A
    token may hold part of a character, which its text alone cannot show."""
    if tokenizer is None:
        return [[] for _ in ids]
    dec = _byte_decoder()
    out = []
    for i, tok in zip(ids, tokenizer.convert_ids_to_tokens(ids)):
        if tok is None:
            out.append([])
        elif all(c in dec for c in tok):
            out.append([dec[c] for c in tok])
        elif len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):  # SentencePiece's byte fallback
            out.append([int(tok[3:5], 16)])
        elif "\u2581" in tok:  # SentencePiece's word boundary
            out.append(list(tok.replace("\u2581", " ").encode()))
        else:
            out.append(list(tokenizer.decode([i]).encode()))
    return out
