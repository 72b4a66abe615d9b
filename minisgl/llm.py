"""The offline API: ``LLM(...).generate(prompts, sampling_params)`` drives the scheduler in-process.

>>> from minisgl import LLM, SamplingParams
>>> llm = LLM()                                   # the embedded SmolLM2-135M-Instruct
>>> out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8))
>>> out[0].text, out[0].token_ids, out[0].finish_reason
"""

from __future__ import annotations

import gc
import itertools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from minisgl.core import SamplingParams
from minisgl.engine.config import EngineConfig
from minisgl.scheduler import CacheStats, Scheduler
from minisgl.tokenizer import apply_chat_template, eos_token_ids, load_tokenizer

Prompt = str | list[int]


@dataclass
class RequestOutput:
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # with SamplingParams.logprobs / top_logprobs: per output token, its logprob and [(token id, logprob)]
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    # with SamplingParams.prompt_logprobs_from = s: (logprob, top) of prompt tokens max(s, 1).. (token 0 has none)
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None


class LLM:
    def __init__(self, model: str | None = None, **engine_args: Any):
        self.config = EngineConfig.from_kwargs(model=model, **engine_args)
        if self.config.tp_size > 1:
            from minisgl.scheduler.replicated import TPScheduler

            self.scheduler = TPScheduler(self.config)
        else:
            self.scheduler = Scheduler(self.config)
        engine = self.scheduler.engine
        self.tokenizer = engine.tokenizer if engine.tokenizer is not None else load_tokenizer(engine.model_path)
        self.scheduler.add_eos_ids(eos_token_ids(self.tokenizer))
        self._uids = itertools.count()
        # The engine freezes what it built out of the collector's reach (Engine.__init__); once this LLM
        # is dropped, its engine's reference cycles must be collectable again, or a process that makes
        # several engines (a notebook, the tests) keeps every one of them.
        weakref.finalize(self, gc.unfreeze)

    @property
    def cache_stats(self) -> CacheStats:
        return self.scheduler.stats

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: pass prompts as lists of token ids")
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) for t in prompt):
            raise ValueError("a prompt must be a string or a list of token ids")
        return list(prompt)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order. All prompts are checked
        before any runs: a bad one raises ``RequestError`` (a ``ValueError``) and nothing is queued."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = (
            [sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams) else list(sampling_params)
        )
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        ids = [self._encode(p) for p in prompts]
        return self._run(ids, params, [p if isinstance(p, str) else None for p in prompts], use_tqdm)

    def chat(
        self,
        conversations: list[dict[str, str]] | list[list[dict[str, str]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Like ``generate`` with the tokenizer's chat template applied to each conversation
        (a list of ``{"role", "content"}`` messages)."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        ids = [apply_chat_template(self.tokenizer, conv) for conv in conversations]  # type: ignore[arg-type]
        return self.generate(ids, sampling_params, use_tqdm)

    def _run(self, ids, params, texts, use_tqdm: bool) -> list[RequestOutput]:
        sched = self.scheduler
        uids = [next(self._uids) for _ in ids]
        reqs = []
        try:  # validate all first; a constraint that does not compile is refused too (they compile together)
            for u, i, p in zip(uids, ids, params):
                reqs.append(sched.make_request(u, i, p))
                sched.offered.add(reqs[-1])
            refused = sched.offered.admit(wait=True, together=True)  # all of them queued, or none
        except BaseException:
            for u in uids:  # the compiles of a refused call stop
                sched.abort(u)
            raise
        if refused:
            raise refused[0][1]
        outputs = {u: RequestOutput(t, i) for u, i, t in zip(uids, ids, texts)}
        bar = None
        if use_tqdm and len(ids) > 1:
            from tqdm import tqdm

            bar = tqdm(total=len(ids), desc="generate", unit="req", dynamic_ncols=True)
        pending = set(uids)
        try:
            while pending:
                for ev in sched.step():
                    out = outputs.get(ev.uid)
                    if out is None:
                        continue
                    out.token_ids.append(ev.token_id)
                    if ev.logprob is not None:
                        out.logprobs = (out.logprobs or []) + [ev.logprob]
                        out.top_logprobs = (out.top_logprobs or []) + [ev.top_logprobs or []]
                    if ev.prompt_logprobs is not None:
                        out.prompt_logprobs = ev.prompt_logprobs
                    if ev.finish_reason is not None:
                        out.finish_reason = ev.finish_reason
                        pending.discard(ev.uid)
                        if bar is not None:
                            bar.update()
        except BaseException:
            for u in pending:  # leave the engine clean for the next call
                sched.abort(u)
            raise
        finally:
            if bar is not None:
                bar.close()
        for req in reqs:
            out = outputs[req.uid]
            out.cached_tokens = req.hit_len
            if self.tokenizer is not None:
                out.text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        return [outputs[u] for u in uids]

    def shutdown(self) -> None:
        shutdown = getattr(self.scheduler, "shutdown", None)
        if shutdown is not None:
            shutdown()
