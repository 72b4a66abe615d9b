"""The native routes: ``/generate`` (SGLang's shape: token ids in and out, greedy by default),
``/health`` and ``/stats``."""

from __future__ import annotations

import os
import uuid

from fastapi import APIRouter, Request

from minisgl.message import TokenizeMsg
from minisgl.server.errors import ApiError, error_response
from minisgl.server.frontend import frontend_of
from minisgl.server.generation import Generation, Seq, sse, stream_or_collect
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
    """Native API: greedy by default (``SamplingParams``' defaults); returns token ids too."""
    fe = frontend_of(request)
    fe.check_ready()
    if (req.text is None) == (req.input_ids is None):
        raise ApiError(400, "give exactly one of text or input_ids", "text")
    if req.text == "" or req.input_ids == []:
        raise ApiError(400, "the prompt is empty", "text" if req.text is not None else "input_ids")
    p = req.sampling_params
    msg = TokenizeMsg(fe.new_uid(), p.sampling(), text=req.text, input_ids=req.input_ids)
    gen = Generation(fe, [msg], p.stop)
    rid = uuid.uuid4().hex

    def meta(s: Seq) -> dict:
        return {
            "id": rid,
            "finish_reason": s.finish_reason,
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": len(s.token_ids),
            "cached_tokens": s.cached_tokens,
        }

    def events(s: Seq):
        text, ids = s.take_text(), s.take_ids()
        reason = s.take_finish()
        if text or ids or reason:
            yield sse({"text": text, "output_ids": ids, "meta_info": meta(s) | {"finish_reason": reason}})

    def body() -> dict:
        s = gen.seqs[0]
        return {"text": s.text, "output_ids": s.token_ids, "meta_info": meta(s)}

    return await stream_or_collect(gen, request, req.stream, events, body)
