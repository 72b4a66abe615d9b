"""Running the real engine on CPU for the swap-in tests (each lab's adapter swaps its component in)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def engine_failure(what: str) -> Iterator[None]:
    """Anything the engine raises inside the block becomes the test's failure, saying what it ran
    with (``what``: "your cache (page_size=4)"); a stub's ``NotImplementedError`` and the engine's
    memory checks (``AssertionError``) keep their type."""
    try:
        yield
    except (NotImplementedError, AssertionError) as e:
        raise type(e)(f"the engine failed with {what}: {e}") from e
    except Exception as e:
        raise AssertionError(f"the engine failed with {what}: {type(e).__name__}: {e}") from e
