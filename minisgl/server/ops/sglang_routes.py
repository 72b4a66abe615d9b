"""SGLang's routes apart from ``/generate`` that its clients call (``sglang.bench_serving``, scripts
written for SGLang): ``/get_model_info``, ``/get_server_info``, ``/flush_cache``, ``/v1/tokenize`` and
``/v1/detokenize``, in SGLang's shapes (``docs/serving-ops.md``, "SGLang compatibility", says where they
differ)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, StrictBool

from minisgl import __version__
from minisgl.server.errors import ApiError
from minisgl.server.frontend import Frontend, frontend_of
from minisgl.server.openai_routes import check_model
from minisgl.server.protocol import Int32, Text

if TYPE_CHECKING:
    from minisgl.server.args import ServerArgs

router = APIRouter()


class TokenizeRequest(BaseModel):
    """SGLang's (and vLLM's) ``/v1/tokenize``: one prompt, or a list of them."""

    model: Text | None = None
    prompt: Text | list[Text]
    add_special_tokens: StrictBool = True


class DetokenizeRequest(BaseModel):
    """SGLang's ``/v1/detokenize``: one sequence of token ids, or a list of them."""

    model: Text | None = None
    tokens: list[Int32] | list[list[Int32]]
    skip_special_tokens: StrictBool = True


@router.get("/get_model_info")
@router.get("/model_info")  # SGLang's newer name
async def get_model_info(request: Request):
    fe = frontend_of(request)
    fe.check_ready()
    info = fe.info
    return {
        "model_path": info.get("model"),
        "tokenizer_path": info.get("model"),  # the tokenizer is always the model folder's
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",  # SGLang's value for weights never updated in place
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": info.get("model_type"),
        "architectures": info.get("architectures"),
        "served_model_name": fe.model_name,
    }


@router.get("/get_server_info")
@router.get("/server_info")
async def get_server_info(request: Request):
    """SGLang's shape: the server's arguments under SGLang's names, the scheduler's limits, and
    ``internal_states`` (one per data-parallel rank in SGLang; here the one scheduler's ``/stats``).
    ``minisgl`` holds every argument under our own names. Never the API key."""
    fe = frontend_of(request)
    stats = await fe.stats()  # checks readiness too
    args: ServerArgs | None = getattr(request.app.state, "server_args", None)
    info = fe.info
    sglang = sglang_server_args(fe, args)
    return {
        **sglang,
        "max_total_num_tokens": sglang["max_total_tokens"],
        "max_req_input_len": info["max_seq_len"] - 1,  # a prompt leaves room for one output token
        "internal_states": [stats],
        "version": __version__,
        "minisgl": None if args is None else public_args(args),
    }


def sglang_server_args(fe: Frontend, args: ServerArgs | None) -> dict[str, Any]:
    """Our settings under SGLang's ``ServerArgs`` names: the values the scheduler resolved where it
    reported them (page size, prefill budget, pool size), else the flags' values."""
    info, engine = fe.info, (args.engine if args is not None else {})
    return {
        "model_path": info.get("model"),
        "tokenizer_path": info.get("model"),
        "served_model_name": fe.model_name,
        "host": getattr(args, "host", None),
        "port": getattr(args, "port", None),
        "tp_size": info.get("tp_size"),
        "device": info.get("device"),
        "dtype": info.get("dtype"),
        "kv_cache_dtype": info.get("kv_cache_dtype"),
        "quantization": engine.get("quantization"),
        "context_length": info.get("max_seq_len"),
        "chunked_prefill_size": info.get("max_prefill_length") or -1,  # SGLang's -1: no chunking
        "max_total_tokens": info["num_pages"] * info["page_size"],
        "page_size": info.get("page_size"),
        "max_running_requests": info.get("max_running_requests"),
        "attention_backend": info.get("attention_backend"),
        "disable_radix_cache": info.get("cache_type") != "radix",
        "enable_mixed_chunk": bool(engine.get("mixed_chunk", False)),
        "cuda_graph_max_bs": engine.get("cuda_graph_max_bs"),
        "disable_cuda_graph": engine.get("cuda_graph_max_bs") == 0,
        "random_seed": engine.get("seed", 0),
        "mem_fraction_static": engine.get("mem_fraction_static"),  # None: the pool is sized by --memory-ratio
        "trust_remote_code": getattr(args, "trust_remote_code", False),
        "log_level": getattr(args, "log_level", None),
    }


def public_args(args: ServerArgs) -> dict[str, Any]:
    """Every server argument under our names (``ServerArgs``), but the API key."""
    out = dataclasses.asdict(args)
    out.pop("api_key", None)
    return out


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request):
    """Empty the prefix cache; 400 while a request runs or waits (SGLang's rule: nothing is flushed
    then, see ``minisgl.server.scheduler_worker``)."""
    answer = await frontend_of(request).flush_cache()
    if not answer.get("flushed"):
        raise ApiError(400, str(answer.get("message")), code="requests_running")
    return {"success": True, "message": answer.get("message"), "freed_tokens": answer.get("freed_tokens")}


def _ready(request: Request, model: str | None):
    """The frontend, once the engine is ready and ``model`` (if given) is the served one."""
    fe = frontend_of(request)
    fe.check_ready()
    if model is not None:
        check_model(fe, model)
    return fe


@router.post("/v1/tokenize")
@router.post("/tokenize")
async def tokenize(req: TokenizeRequest, request: Request):
    """``{"tokens", "count", "max_model_len"}``: lists of them for a list of prompts."""
    fe = _ready(request, req.model)
    one = isinstance(req.prompt, str)
    reply = await fe.text(texts=[req.prompt] if one else req.prompt, add_special_tokens=req.add_special_tokens)
    ids, max_len = reply.token_ids, fe.info.get("max_seq_len")
    if one:
        return {"tokens": ids[0], "count": len(ids[0]), "max_model_len": max_len}
    return {"tokens": ids, "count": [len(t) for t in ids], "max_model_len": max_len}


@router.post("/v1/detokenize")
@router.post("/detokenize")
async def detokenize(req: DetokenizeRequest, request: Request):
    """``{"text"}``: a list of texts for a list of token-id lists."""
    fe = _ready(request, req.model)
    one = not req.tokens or isinstance(req.tokens[0], int)
    seqs: list[list[int]] = [req.tokens] if one else req.tokens  # type: ignore[list-item]
    vocab = fe.info["vocab_size"]
    for ids in seqs:
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ApiError(400, f"token id {bad} is outside the vocabulary [0, {vocab})", "tokens")
    reply = await fe.text(token_ids=seqs, skip_special_tokens=req.skip_special_tokens)
    return {"text": reply.texts[0] if one else reply.texts}
