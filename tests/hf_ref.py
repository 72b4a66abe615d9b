"""Reference greedy generation with HF transformers (the correctness oracle)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch


@lru_cache(maxsize=4)
def hf_model(path: Path, device: str = "cpu"):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()


@torch.inference_mode()
def hf_greedy(path: Path, prompt: list[int], max_new: int, eos: int | None = None, device: str = "cpu") -> list[int]:
    """Greedy tokens from HF with its KV cache; stops after ``eos`` if given (included)."""
    model = hf_model(path, device)
    out = model(torch.tensor([prompt], device=device), use_cache=True)
    past, tokens = out.past_key_values, []
    for _ in range(max_new):
        tok = int(out.logits[0, -1].argmax())
        tokens.append(tok)
        if tok == eos:
            break
        out = model(torch.tensor([[tok]], device=device), past_key_values=past, use_cache=True)
        past = out.past_key_values
    return tokens
