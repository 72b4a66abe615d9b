"""The OpenAI-compatible routes: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request

from minisgl.core import SamplingParams
from minisgl.message import TokenizeMsg
from minisgl.server.errors import ApiError
from minisgl.server.frontend import Frontend, frontend_of
from minisgl.server.generation import Generation, Seq, stream_chunker, stream_or_collect
from minisgl.server.protocol import COMPLETIONS_DEFAULT_MAX_TOKENS, ChatCompletionRequest, CompletionRequest
from minisgl.toolcall import chat_output

router = APIRouter()
# the model sglang-router writes into a request that names none (minisgl/server/ops/dp.py): served as
# a request without a model, like the client sent it
ROUTER_UNNAMED = "unknown"


def check_model(fe: Frontend, name: str) -> None:
    """404 unless ``name`` is the served model: its name as ``/v1/models`` lists it
    (``--served-model-name``, else the ``--model`` folder or hub id, or the embedded model's name),
    or that name's last path component, so that a client may say ``Qwen3-0.6B`` for
    ``/models/Qwen3-0.6B`` or ``Qwen/Qwen3-0.6B``."""
    served = fe.model_name
    if name not in {served, served.rstrip("/").rpartition("/")[2]} - {""}:
        raise ApiError(404, f"model {name!r} not found; this server serves {served!r}", "model", "model_not_found")


def model_card(fe: Frontend) -> dict[str, Any]:
    return {
        "id": fe.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "minisgl",
        "max_model_len": fe.info.get("max_seq_len"),
    }


def check_supported(request: Request, req: ChatCompletionRequest | CompletionRequest, num_prompts: int) -> Frontend:
    """Ready, the served model (or none named), no more sequences than the server allows, and no
    field asks for what this server does not do; returns the frontend. Everything about the prompt
    and the sampling (context length, ``max_tokens``) is checked once, by the scheduler."""
    fe = frontend_of(request)
    fe.check_ready()
    if req.model not in (None, ROUTER_UNNAMED):
        check_model(fe, req.model)
    limit = request.app.state.max_sequences_per_request
    if num_prompts * req.n > limit:
        raise ApiError(
            400,
            f"this request asks for {num_prompts * req.n} sequences ({num_prompts} prompts x n={req.n}) but the "
            f"server allows at most {limit} per request (--max-sequences-per-request); split it into smaller requests",
            "n" if req.n > 1 else "prompt",
        )
    bad = req.unsupported_field()
    if bad is not None:
        raise ApiError(400, f"{bad} is not supported by this server", param=bad)
    return fe


def choice_sampling(sp: SamplingParams, j: int) -> SamplingParams:
    # the n choices of a seeded request must differ, and still be repeatable
    return sp if sp.seed is None or j == 0 else replace(sp, seed=(sp.seed + j) % 2**63)


def response_body(gen: Generation, rid: str, kind: str, model: str, choices: list[dict]) -> dict[str, Any]:
    return {"id": rid, "object": kind, "created": gen.created, "model": model, "choices": choices, "usage": gen.usage()}


def usage_tail(chunk: Callable[..., str], gen: Generation, include_usage: bool) -> Callable[[], list[str]]:
    """The last chunk of a stream before ``[DONE]``: the usage, if the client asked for it."""
    return lambda: [chunk([], gen.usage())] if include_usage else []


@router.get("/v1/models")
async def models(request: Request):
    fe = frontend_of(request)
    fe.check_ready()
    return {"object": "list", "data": [model_card(fe)]}


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, request: Request):
    fe = frontend_of(request)
    fe.check_ready()
    check_model(fe, model_id)
    return model_card(fe)


@router.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request):
    fe = check_supported(request, req, 1)
    traits = fe.workers.get("tokenizer", {})  # the chat template's tool-call format (minisgl/toolcall/)
    sp = req.sampling(req.requested_max_tokens, traits.get("tool_format", "hermes"))  # None: the rest of the context
    messages, tools = [m.as_template_input() for m in req.messages], req.template_tools()
    msgs = [TokenizeMsg(fe.new_uid(), choice_sampling(sp, j), messages=messages, tools=tools) for j in range(req.n)]
    gen = Generation(fe, msgs, req.stop, req.n)
    parser = getattr(getattr(request.app.state, "server_args", None), "reasoning_parser", "auto")
    outs = [chat_output(req.tools, req.tool_mode, traits, parser) for _ in msgs]  # reasoning, content, calls
    rid, model = f"chatcmpl-{uuid.uuid4().hex}", fe.model_name
    chunk = stream_chunker(rid, "chat.completion.chunk", gen.created, model, req.include_usage)

    def delta(s: Seq, d: dict, reason: str | None) -> str:
        lp = s.lp.chat(s.lp.take()) if req.logprobs and (d or reason) else None
        return chunk([{"index": s.index, "delta": d, "logprobs": lp, "finish_reason": reason}])

    def events(s: Seq):
        text = s.take_text()
        reason = s.take_finish()
        for d in outs[s.index].deltas(text, reason is not None):
            yield delta(s, d, None)
        if reason:
            yield delta(s, {}, outs[s.index].finish(reason))

    def body() -> dict[str, Any]:
        choices = [
            {
                "index": s.index,
                "message": outs[s.index].message(s.text),
                "logprobs": s.lp.chat(range(len(s.lp.out.logprobs))) if req.logprobs else None,
                "finish_reason": outs[s.index].finish(s.finish_reason),
            }
            for s in gen.seqs
        ]
        return response_body(gen, rid, "chat.completion", model, choices)

    roles = (delta(s, {"role": "assistant", "content": ""}, None) for s in gen.seqs)
    tail = usage_tail(chunk, gen, req.include_usage)
    return await stream_or_collect(gen, request, req.stream, events, body, head=roles, tail=tail)


@router.post("/v1/completions")
async def completions(req: CompletionRequest, request: Request):
    prompts = req.prompts()
    fe = check_supported(request, req, len(prompts))
    sp = req.sampling(COMPLETIONS_DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens)
    scoring_only = req.max_tokens == 0  # echo: the prompt (and its logprobs), the one token run is not shown
    msgs = []
    for p in prompts:
        for j in range(req.n):
            text, ids = (p, None) if isinstance(p, str) else (None, p)
            msgs.append(TokenizeMsg(fe.new_uid(), choice_sampling(sp, j), text=text, input_ids=ids))
    gen = Generation(fe, msgs, req.stop, req.n)
    rid, model = f"cmpl-{uuid.uuid4().hex}", fe.model_name
    chunk = stream_chunker(rid, "text_completion", gen.created, model, req.include_usage)

    def echoed(s: Seq) -> str:
        p = prompts[s.index // req.n]
        return p if isinstance(p, str) else s.lp.prompt_text()

    def logprobs(s: Seq, idx: range, first: bool, stream: bool = False) -> dict | None:
        return None if req.logprobs is None else s.lp.completion(idx, req.echo and first, stream)

    def events(s: Seq):
        # a chunk per step with new tokens, even if their text is not complete yet (or the model
        # has no tokenizer): clients time tokens by chunks
        first = s.ids_sent == 0
        text, new_ids = s.take_text(), s.take_ids()
        reason = s.take_finish()
        if scoring_only:
            text, new_ids = "", []
        head = echoed(s) if req.echo and first else ""
        if text or new_ids or reason or head:
            lp = logprobs(s, s.lp.take(0 if scoring_only else None), first, stream=True)
            yield chunk([{"index": s.index, "text": head + text, "logprobs": lp, "finish_reason": reason}])

    def body() -> dict[str, Any]:
        choices = []
        for s in gen.seqs:
            head = echoed(s) if req.echo else ""
            idx = range(0 if scoring_only else len(s.lp.out.logprobs))
            text = head + ("" if scoring_only else s.text)
            lp = logprobs(s, idx, True)
            choices.append({"index": s.index, "text": text, "logprobs": lp, "finish_reason": s.finish_reason})
        out = response_body(gen, rid, "text_completion", model, choices)
        if scoring_only:  # the token run to score the prompt is not an answer
            u = out["usage"]
            u["completion_tokens"], u["total_tokens"] = 0, u["prompt_tokens"]
        return out

    tail = usage_tail(chunk, gen, req.include_usage)
    return await stream_or_collect(gen, request, req.stream, events, body, tail=tail)
