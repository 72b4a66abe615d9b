"""Running the real engine on CPU for the swap-in tests (each lab's adapter swaps its component in)."""

from __future__ import annotations

from pathlib import Path


def generate_rounds(
    model: Path | None, rounds: list[list], max_tokens: int = 8, **engine_args
) -> tuple[list[list[list[int]]], list[list[int]], object]:
    """Greedy generation for each round of prompts on one engine, in order (later rounds can hit
    the prefix cache filled by earlier ones). Returns tokens and cached-prompt lengths per round,
    and the engine's cache stats."""
    from minisgl import LLM, SamplingParams

    llm = LLM(None if model is None else str(model), device="cpu", dtype="float32", **engine_args)
    try:
        tokens, cached = [], []
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        for prompts in rounds:
            outs = llm.generate(prompts, params, use_tqdm=False)
            tokens.append([o.token_ids for o in outs])
            cached.append([o.cached_tokens for o in outs])
        return tokens, cached, llm.cache_stats
    finally:
        llm.shutdown()
