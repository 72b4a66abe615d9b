"""Tokenizer loading and use: prompts (text, token ids or a chat) to token ids, and EOS ids."""

from __future__ import annotations

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


def apply_chat_template(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model has no chat template; send a plain prompt instead")
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(out, dict) or hasattr(out, "keys"):  # transformers 5 returns a BatchEncoding
        out = out["input_ids"]
    return list(out)


def tokenize(
    tokenizer: Any, text: str | None = None, input_ids: list[int] | None = None, messages: list[dict] | None = None
) -> list[int]:
    """The prompt's token ids from exactly one of ``text``, ``input_ids`` or a chat's ``messages``;
    ``ValueError`` says what is wrong with the input (the scheduler checks the ids themselves)."""
    if messages is not None:
        return apply_chat_template(tokenizer, messages)
    if text is not None:
        if tokenizer is None:
            raise ValueError("this model has no tokenizer: send the prompt as token ids")
        return tokenizer.encode(text, add_special_tokens=True)
    return list(input_ids or [])
