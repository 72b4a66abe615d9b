"""The offline API: ``LLM(...).generate(prompts, sampling_params)`` drives the scheduler in-process, with
vLLM's conventions: ``n`` samples per prompt, ``stop`` strings, results as ``RequestOutput.outputs``.

>>> from minisgl import LLM, SamplingParams
>>> llm = LLM()                                   # the embedded SmolLM2-135M-Instruct
>>> outs = llm.generate(["The capital of France is"], SamplingParams(n=2, temperature=0.8, stop=["."]))
>>> [c.text for c in outs[0].outputs], outs[0].text   # the samples; the first one's fields, flat
"""

from __future__ import annotations

import gc
import itertools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from minisgl.core import RequestError, SamplingParams
from minisgl.engine.config import EngineConfig
from minisgl.scheduler import CacheStats, Scheduler
from minisgl.tokenizer import apply_chat_template, eos_token_ids, load_tokenizer
from minisgl.tokenizer.detokenizer import Detokenizer, StopStrings, text_streams

Prompt = str | list[int]
Top = list[tuple[int, float]]  # (token id, logprob) of the most likely tokens at a step, most likely first


@dataclass
class Logprob:
    """A token's entry in vLLM's per-step dict ``{token id: Logprob}``."""

    logprob: float
    rank: int | None = None  # 1: the most likely; None: a sampled token below the top ones asked for
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One sample (vLLM's): ``finish_reason`` is ``"stop"`` or ``"length"``; ``stop_reason`` the stop string
    or stop token id that ended it (None: EOS or the length)."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None  # with logprobs: the sum of the sampled tokens'
    logprobs: list[dict[int, Logprob]] | None = None  # with logprobs: per token, it and the top ones
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # the same logprobs in minisgl's flat shapes: per token its logprob, and the top ones
    token_logprobs: list[float] | None = None
    top_logprobs: list[Top] | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """One prompt's result: its samples in ``outputs`` (``n`` of them, ``index`` 0..n-1). ``text``,
    ``token_ids``, ``finish_reason``, ``logprobs`` and ``top_logprobs`` are the first sample's, flat."""

    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # with SamplingParams.prompt_logprobs_from = s: (logprob, top) of prompt tokens max(s, 1).. (token 0 has none);
    # with vLLM's SamplingParams.prompt_logprobs = k: vLLM's shape, None then {token id: Logprob} per prompt token
    prompt_logprobs: list[tuple[float, Top]] | list[dict[int, Logprob] | None] | None = None

    text = property(lambda self: self.outputs[0].text)
    token_ids = property(lambda self: self.outputs[0].token_ids)
    finish_reason = property(lambda self: self.outputs[0].finish_reason)
    logprobs = property(lambda self: self.outputs[0].token_logprobs)
    top_logprobs = property(lambda self: self.outputs[0].top_logprobs)
    num_cached_tokens = property(lambda self: self.cached_tokens)  # vLLM's name


@dataclass
class _Seq:
    """One request of a ``generate`` call: sample ``out`` of ``params`` (the caller's) for prompt ``prompt``."""

    prompt: int
    params: SamplingParams
    out: CompletionOutput
    stops: list[str]
    decoder: Detokenizer | None = None  # with stop strings: the text as it grows, cut at the first one
    cutter: StopStrings | None = None
    raw: str = ""  # all the text decoded so far (``out.text`` is its cut prefix)


def _top_count(sp: SamplingParams) -> int:
    """Top tokens per output step: ``top_logprobs`` (ours), or vLLM's ``logprobs`` count if larger."""
    return max(sp.top_logprobs, 0 if isinstance(sp.logprobs, bool) or sp.logprobs is None else sp.logprobs)


def _engine_params(sp: SamplingParams, j: int) -> SamplingParams:
    """What the scheduler runs for sample ``j`` of ``sp``: the vLLM fields turned into the engine's (a seeded
    request's samples differ, and are each repeatable, as the server's ``n`` choices)."""
    return replace(
        sp,
        n=1,
        stop=None,
        logprobs=sp.logprobs is not None and sp.logprobs is not False,
        top_logprobs=max(_top_count(sp), sp.prompt_logprobs or 0),
        prompt_logprobs=None,
        prompt_logprobs_from=0 if sp.prompt_logprobs is not None else sp.prompt_logprobs_from,
        seed=sp.seed if sp.seed is None or j == 0 else (sp.seed + j) % 2**63,
    )


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
        for sp in params:  # the caller's fields, named as given (vLLM's counts become the engine's fields)
            sp.validate()
            if sp.stop and self.tokenizer is None:
                raise RequestError("stop strings need a tokenizer: this model has none", "stop")
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
        outputs = [RequestOutput(t, i) for i, t in zip(ids, texts)]
        seqs: dict[int, _Seq] = {}
        for k, sp in enumerate(params):
            for j in range(sp.n):
                out = CompletionOutput(j)
                outputs[k].outputs.append(out)
                stops = [sp.stop] if isinstance(sp.stop, str) else list(sp.stop or [])
                seqs[next(self._uids)] = _Seq(k, sp, out, stops)
        reqs = []
        try:  # validate all first; a constraint that does not compile is refused too (they compile together)
            for u, seq in seqs.items():
                reqs.append(sched.make_request(u, ids[seq.prompt], _engine_params(seq.params, seq.out.index)))
                sched.offered.add(reqs[-1])
            refused = sched.offered.admit(wait=True, together=True)  # all of them queued, or none
        except BaseException:
            for u in seqs:  # the compiles of a refused call stop
                sched.abort(u)
            raise
        if refused:
            raise refused[0][1]
        bar = None
        if use_tqdm and len(seqs) > 1:
            from tqdm import tqdm

            bar = tqdm(total=len(seqs), desc="generate", unit="req", dynamic_ncols=True)
        pending = set(seqs)
        try:
            while pending:
                for ev in sched.step():
                    if ev.uid not in pending:
                        continue  # another call's, or one this call ended (a stop string)
                    seq = seqs[ev.uid]
                    self._add_token(seq, ev, outputs[seq.prompt])
                    if seq.out.finish_reason is not None:
                        if ev.finish_reason is None:
                            sched.abort(ev.uid)  # its text hit a stop string
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
            self._finish(seqs[req.uid], req.hit_len, outputs[seqs[req.uid].prompt])
        for result, sp in zip(outputs, params):
            self._prompt_logprobs(result, sp)
        return outputs

    def _add_token(self, seq: _Seq, ev, result: RequestOutput) -> None:
        out, sp = seq.out, seq.params
        out.token_ids.append(ev.token_id)
        if ev.logprob is not None:
            if out.token_logprobs is None:
                out.token_logprobs, out.top_logprobs = [], []
            out.token_logprobs.append(ev.logprob)
            out.top_logprobs.append((ev.top_logprobs or [])[: _top_count(sp)])
        if ev.prompt_logprobs is not None:
            result.prompt_logprobs = ev.prompt_logprobs
        if ev.finish_reason is not None:
            out.finish_reason = ev.finish_reason
            if ev.token_id in sp.stop_token_ids:
                out.stop_reason = ev.token_id
        if not seq.stops:
            return
        if seq.decoder is None:
            streams = text_streams(self.config.components.detokenizer)
            seq.decoder, seq.cutter = (
                streams.detokenizer(self.tokenizer, sp.skip_special_tokens),
                streams.stop_strings(seq.stops),
            )
        piece = seq.decoder.push([ev.token_id]) + (seq.decoder.flush() if ev.finish_reason else "")
        seq.raw += piece
        if len(out.token_ids) <= sp.min_tokens:  # as vLLM: no stop string ends a sample before min_tokens
            out.text += piece
            return
        out.text += seq.cutter.feed(piece) + ("" if seq.cutter.stopped or not ev.finish_reason else seq.cutter.flush())
        if seq.cutter.stopped:
            out.finish_reason = "stop"
            out.stop_reason = next(s for s in seq.stops if seq.raw.startswith(s, len(out.text)))
            if sp.include_stop_str_in_output:
                out.text += out.stop_reason

    def _finish(self, seq: _Seq, hit_len: int, result: RequestOutput) -> None:
        out, sp = seq.out, seq.params
        if out.index == 0:
            result.cached_tokens, result.finished = hit_len, True
        if not seq.stops and self.tokenizer is not None:
            out.text = self.tokenizer.decode(out.token_ids, skip_special_tokens=sp.skip_special_tokens)
        if out.token_logprobs is not None:  # vLLM's shapes
            out.cumulative_logprob = sum(out.token_logprobs)
            steps = zip(out.token_ids, out.token_logprobs, out.top_logprobs)
            out.logprobs = [self._step(t, lp, top) for t, lp, top in steps]

    def _prompt_logprobs(self, result: RequestOutput, sp: SamplingParams) -> None:
        """Prompt logprobs as asked: vLLM's shape for its ``prompt_logprobs`` count, else ours."""
        got = result.prompt_logprobs
        if got is None:
            return
        if sp.prompt_logprobs is None:  # the engine may have scored more top tokens (a larger logprobs count)
            result.prompt_logprobs = [(lp, top[: sp.top_logprobs]) for lp, top in got]
            return
        scored = zip(result.prompt_token_ids[1:], got)
        result.prompt_logprobs = [None] + [self._step(t, lp, top[: sp.prompt_logprobs]) for t, (lp, top) in scored]

    def _step(self, token: int, logprob: float, top: Top) -> dict[int, Logprob]:
        """vLLM's dict of one step: the top tokens ranked 1.., and the chosen token (its rank if among them)."""
        dec = (lambda t: self.tokenizer.decode([t])) if self.tokenizer is not None else (lambda t: None)
        step = {t: Logprob(v, r, dec(t)) for r, (t, v) in enumerate(top, 1)}
        if token not in step:
            step[token] = Logprob(logprob, None, dec(token))
        return step

    def shutdown(self) -> None:
        shutdown = getattr(self.scheduler, "shutdown", None)
        if shutdown is not None:
            shutdown()
