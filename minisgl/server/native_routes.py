"""The native routes: ``/generate`` in SGLang's shape (token ids in and out, greedy by default; a list
of prompts is a batch; a stream's chunks carry the whole text so far, as SGLang's do), ``/health``
and ``/stats``. SGLang's other routes are ``minisgl.server.ops.sglang_routes``'."""

from __future__ import annotations

import os
import uuid

from fastapi import APIRouter, Request

from minisgl.message import TokenizeMsg
from minisgl.server.errors import ApiError, error_response
from minisgl.server.frontend import frontend_of
from minisgl.server.generation import Generation, Seq, sse, stream_or_collect
from minisgl.server.openai_routes import ROUTER_UNNAMED, check_model
from minisgl.server.protocol import GenerateRequest

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    """200 while every worker answers its heartbeat; 503 (saying why) while loading, stopping, or
    when a worker is stopped or hung (``Frontend.health``)."""
    problem = frontend_of(request).health()
    if problem is not None:
        return error_response(503, problem)
    return {"status": "ok"}


@router.get("/stats")
async def stats(request: Request):
    fe = frontend_of(request)
    s = await fe.stats()
    procs = {"api_server": os.getpid(), **getattr(request.app.state, "processes", {})}
    s["server"] = {"open_sequences": len(fe.routes), "processes": procs}
    return s


@router.post("/generate")
async def generate(req: GenerateRequest, request: Request):
    """Native API: greedy by default (``SamplingParams``' defaults); returns token ids too. ``text`` or
    ``input_ids`` as a list of prompts is a batch: a list of answers, one per prompt, and a stream
    whose chunks name their prompt (``index``)."""
    fe = frontend_of(request)
    fe.check_ready()
    if req.model not in (None, ROUTER_UNNAMED):
        check_model(fe, req.model)
    if (req.text is None) == (req.input_ids is None):
        raise ApiError(400, "give exactly one of text or input_ids", "text")
    field = "text" if req.text is not None else "input_ids"
    prompts, batch = req.prompts()
    if not prompts or any(p in ("", []) for p in prompts):
        raise ApiError(400, "the prompt is empty", field)
    if len(prompts) > (limit := request.app.state.max_sequences_per_request):
        raise ApiError(400, f"{len(prompts)} prompts; the server allows {limit} per request", field)
    p = req.sampling_params
    sp = p.sampling()
    if req.return_logprob:  # SGLang's fields; the logprobs are meta_info's, as SGLang returns them
        sp.logprobs, sp.top_logprobs, sp.prompt_logprobs_from = True, req.top_logprobs_num, req.logprob_start_len
    msgs = [TokenizeMsg(fe.new_uid(), sp, **{field: x}) for x in prompts]
    gen = Generation(fe, msgs, p.stop)
    rid = uuid.uuid4().hex
    # SGLang's --incremental-streaming-output: each chunk carries only its new text and ids
    incremental = getattr(getattr(request.app.state, "server_args", None), "incremental_streaming_output", False)

    def meta(s: Seq, finish: dict | None) -> dict:
        return {
            "id": f"{rid}-{s.index}" if batch else rid,
            "finish_reason": finish,
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": len(s.token_ids),
            "cached_tokens": s.cached_tokens,
        } | (logprobs(s) if req.return_logprob else {})

    def logprobs(s: Seq) -> dict:  # all so far, also in a stream's chunks (SGLang's default)
        return s.lp.sglang(req.return_text_in_logprobs, req.top_logprobs_num > 0, req.logprob_start_len)

    def events(s: Seq):
        text, ids, reason = s.take_text(), s.take_ids(), s.take_finish()
        if text or ids or reason:
            out = {"text": text, "output_ids": ids} if incremental else {"text": s.text, "output_ids": s.token_ids}
            out["meta_info"] = meta(s, finish_reason(s) if reason else None)
            yield sse(out | ({"index": s.index} if batch else {}))

    def answer(s: Seq) -> dict:
        return {"text": s.text, "output_ids": s.token_ids, "meta_info": meta(s, finish_reason(s))}

    body = lambda: [answer(s) for s in gen.seqs] if batch else answer(gen.seqs[0])
    return await stream_or_collect(gen, request, req.stream, events, body)  # type: ignore[arg-type]


def finish_reason(s: Seq) -> dict | None:
    """SGLang's object: what stopped the sequence (the stop string, or the stop token: the last one) or
    how long it grew."""
    if s.finish_reason == "length":
        return {"type": "length", "length": len(s.token_ids)}
    if s.finish_reason == "stop":
        if s.hit_stop_string:  # the text was cut where the earliest stop string begins: the earliest in the tail
            found = [(s.tail.find(x), -len(x), x) for x in s.stops.stops if x in s.tail]
            return {"type": "stop", "matched": min(found, default=(0, 0, ""))[2]}
        return {"type": "stop", "matched": (s.token_ids or [None])[-1]}
    return None
