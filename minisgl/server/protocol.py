"""Request schemas of the HTTP API (OpenAI-compatible, plus the native ``/generate``), and their
translation into ``SamplingParams``.

Fields are strictly typed (``"5"`` is not an integer, ``"yes"`` is not a boolean) and range-checked
here, so a bad request is refused with a 400 that names the field before anything is queued. Every
value must also survive the trip to the workers: integers are bounded (``Int32``; seeds 63 bits:
msgpack cannot encode a Python int of 2^64 or more) and strings are valid Unicode (``Text``: JSON
allows a lone surrogate such as ``"\\ud800"``, which UTF-8 cannot encode). What depends on the
model (token ids in ``[0, vocab)``, the context length) is the scheduler's check (``make_request``).
Unknown fields are ignored, as clients written for other servers send extras; fields we know but
do not implement (penalties, ...) are refused rather than silently ignored.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

from minisgl.core import MAX_TOP_LOGPROBS, SamplingParams
from minisgl.grammar.limits import MAX_DEPTH, json_depth
from minisgl.grammar.tools import check_parameters, tool_grammar
from minisgl.toolcall.request import ToolRequest, ToolTurn


def _valid_unicode(s: str) -> str:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the text is not valid Unicode (it holds a lone UTF-16 surrogate such as \\ud800)") from None
    return s


StrictFloat = Annotated[float, Strict()]  # accepts ints too, but not strings or booleans
# token ids, token counts and top_k: no vocabulary or context comes near 2^31 (the token pool is
# int32). NOTE: a field's own Field(ge=...) does not narrow these bounds (the type's win), hence two.
Int32 = Annotated[int, Strict(), Field(ge=-(2**31), le=2**31 - 1)]
PositiveInt32 = Annotated[int, Strict(), Field(ge=1, le=2**31 - 1)]
Text = Annotated[str, Strict(), AfterValidator(_valid_unicode)]
MAX_N = 16  # choices per request
# Sequences (prompts x n) one request may queue (--max-sequences-per-request): a quarter of the
# default --max-running-requests (256), so one request cannot take the whole running batch from the
# other clients, while n at its maximum (16) still works for 4 prompts. Larger batches of prompts go
# as several requests.
MAX_SEQUENCES_PER_REQUEST = 64
MAX_STOP = 4  # stop strings per request (OpenAI's limit)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions

# field -> values that mean "not used"; anything else is refused with a 400
UNSUPPORTED = {
    "suffix": (None, ""),
    "best_of": (None, 1),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "functions": (None, []),  # the old form of tools
}
TopLogprobs = Annotated[int, Strict(), Field(ge=0, le=MAX_TOP_LOGPROBS)]  # OpenAI's bound (0..20)


def stop_list(v: str | list[str] | None) -> list[str]:
    """``stop`` as a list (after validation the field always holds one)."""
    stops = [] if v is None else [v] if isinstance(v, str) else v
    if len(stops) > MAX_STOP:
        raise ValueError(f"at most {MAX_STOP} stop sequences")
    if any(s == "" for s in stops):
        raise ValueError("stop sequences must not be empty")
    return stops


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class JsonSchemaFormat(BaseModel):
    name: Text | None = None
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: StrictBool | None = None

    @field_validator("schema_")
    @classmethod
    def _not_too_deep(cls, v: dict | None) -> dict | None:
        # before json.dumps, whose recursion a schema nested ~950 deep exhausted (a 500)
        if v is not None and (depth := json_depth(v)) > MAX_DEPTH:
            raise ValueError(f"the schema nests {depth} levels deep; the limit is {MAX_DEPTH}")
        return v


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: ``text`` (no constraint), ``json_object`` (any JSON object) or
    ``json_schema`` (``{"json_schema": {"name", "schema", "strict"}}``)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _check_schema(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise ValueError('response_format of type "json_schema" needs json_schema.schema')
        return self

    def schema_text(self) -> str | None:
        if self.type == "json_object":
            return '{"type": "object"}'
        return json.dumps(self.json_schema.schema_) if self.type == "json_schema" else None


class _Request(BaseModel):
    """The sampling fields shared by /v1/chat/completions and /v1/completions."""

    model_config = ConfigDict(extra="allow")

    model: Text | None = None
    max_tokens: PositiveInt32 | None = None
    temperature: StrictFloat | None = Field(None, ge=0, le=2)
    top_p: StrictFloat | None = Field(None, gt=0, le=1)
    top_k: Int32 | None = None  # extension (<= 0: off)
    stop: Text | list[Text] | None = Field(None, validate_default=True)  # a list once validated
    stop_token_ids: list[Int32] | None = None  # extension
    seed: StrictInt | None = Field(None, ge=0, le=2**63 - 1)  # 63-bit seeds
    n: StrictInt = Field(1, ge=1, le=MAX_N)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False  # extension
    speculative: StrictBool = True  # extension: false opts out of speculative decoding (--speculative-algorithm)
    user: Text | None = None
    response_format: ResponseFormat | None = None
    regex: Text | None = None  # extension (SGLang's): the output matches this regex
    ebnf: Text | None = None  # extension (SGLang's): the output is in this grammar

    @model_validator(mode="after")
    def _one_constraint(self) -> _Request:
        given = (self.json_schema_text, self.regex, self.ebnf, getattr(self, "tool_constraint", None))  # tools: chat's
        if sum(x is not None for x in given) > 1:
            raise ValueError("give at most one of response_format (json_object, json_schema), regex, ebnf and tools")
        return self

    @property
    def json_schema_text(self) -> str | None:
        return None if self.response_format is None else self.response_format.schema_text()

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v: str | list[str] | None) -> list[str]:
        return stop_list(v)

    def unsupported_field(self) -> str | None:
        """The first field that asks for something this server does not do."""
        extra = self.model_extra or {}
        for name, unused in UNSUPPORTED.items():
            if name in extra and not any(extra[name] == u and type(extra[name]) is type(u) for u in unused):
                return name
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling(self, max_tokens: int | None) -> SamplingParams:
        return SamplingParams(
            temperature=1.0 if self.temperature is None else float(self.temperature),  # OpenAI's default
            top_k=-1 if self.top_k is None else self.top_k,
            top_p=1.0 if self.top_p is None else float(self.top_p),
            max_tokens=max_tokens,
            ignore_eos=self.ignore_eos,
            speculative=self.speculative,
            stop_token_ids=list(self.stop_token_ids or []),
            seed=self.seed,
            json_schema=self.json_schema_text,
            regex=self.regex,
            ebnf=self.ebnf,
        )


class TextPart(BaseModel):
    type: Literal["text"]
    text: Text


class ChatMessage(ToolTurn):  # an assistant's tool_calls, a tool message's tool_call_id (minisgl/toolcall/)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None  # required but for an assistant's turn
    name: Text | None = None

    @model_validator(mode="after")
    def _check_content(self) -> ChatMessage:
        # OpenAI lets an assistant turn carry tool calls instead of text; we keep such a turn in the
        # history as empty text. Any other role without content is a client bug: refuse it.
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content (only an assistant message may have none)")
        return self

    def as_template_input(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "\n".join(p.text for p in content)
        role = "system" if self.role == "developer" else self.role  # developer: OpenAI's newer name
        return {"role": role, "content": content or "", **self.tool_fields()}


class ChatCompletionRequest(ToolRequest, _Request):
    check_parameters: ClassVar = staticmethod(check_parameters)  # ToolRequest's check of each tool's schema
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: PositiveInt32 | None = None
    logprobs: StrictBool | None = None
    top_logprobs: TopLogprobs | None = None

    @model_validator(mode="after")
    def _check_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def sampling(self, max_tokens: int | None, tool_format: str = "hermes") -> SamplingParams:
        sp = super().sampling(max_tokens)
        sp.logprobs, sp.top_logprobs = bool(self.logprobs), (self.top_logprobs or 0) if self.logprobs else 0
        if tools := self.template_tools():  # the calls follow their schemas (None: free, grammar/tools.py)
            sp.ebnf = tool_grammar(tools, self.tool_mode_value, self.parallel_tool_calls, tool_format)
        return sp

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


Prompt = Text | list[Text] | list[Int32] | list[list[Int32]]


class CompletionRequest(_Request):
    prompt: Prompt
    max_tokens: Annotated[int, Strict(), Field(ge=0, le=2**31 - 1)] | None = None  # 0: only with echo
    logprobs: TopLogprobs | None = None  # the most likely tokens per step (0: the chosen token's only)
    echo: StrictBool = False  # the prompt, before the completion (with logprobs: scored too)

    @model_validator(mode="after")
    def _check_echo(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens must be at least 1 (0 only with echo: score the prompt, generate nothing)")
        return self

    def sampling(self, max_tokens: int | None) -> SamplingParams:
        sp = super().sampling(max(max_tokens, 1) if max_tokens is not None else None)  # 0: one token, not shown
        sp.logprobs, sp.top_logprobs = self.logprobs is not None, self.logprobs or 0
        sp.prompt_logprobs_from = 0 if self.echo else -1  # echo shows the prompt's tokens: made from its logprobs
        return sp

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, v: Any) -> Any:
        if v == "" or v == [] or (isinstance(v, list) and any(p == "" or p == [] for p in v)):
            raise ValueError("the prompt is empty")
        return v

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: a string or a list of token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


class NativeSampling(BaseModel):
    """``/generate``'s sampling: ``SamplingParams``' fields and defaults (greedy), SGLang's names."""

    model_config = ConfigDict(extra="forbid")

    temperature: StrictFloat = Field(0.0, ge=0, le=2)  # OpenAI's range, as on the other routes
    top_k: Int32 = -1
    top_p: StrictFloat = Field(1.0, gt=0, le=1)
    max_new_tokens: PositiveInt32 = SamplingParams.max_tokens
    stop: Text | list[Text] | None = Field(None, validate_default=True)  # a list once validated
    stop_token_ids: list[Int32] | None = None
    ignore_eos: StrictBool = False
    speculative: StrictBool = True  # false: this request never drafts (--speculative-algorithm)
    seed: StrictInt | None = Field(None, ge=0, le=2**63 - 1)  # 63-bit seeds
    json_schema: Text | None = None  # SGLang's constraints: at most one
    regex: Text | None = None
    ebnf: Text | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v: str | list[str] | None) -> list[str]:
        return stop_list(v)

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            temperature=float(self.temperature),
            top_k=self.top_k,
            top_p=float(self.top_p),
            max_tokens=self.max_new_tokens,
            ignore_eos=self.ignore_eos,
            speculative=self.speculative,
            stop_token_ids=list(self.stop_token_ids or []),
            seed=self.seed,
            json_schema=self.json_schema,
            regex=self.regex,
            ebnf=self.ebnf,
        )


class GenerateRequest(BaseModel):
    """Native API: a prompt as ``text`` or ``input_ids``, or a list of them (a batch, as in SGLang);
    returns text and token ids."""

    model_config = ConfigDict(extra="forbid")

    text: Text | list[Text] | None = None
    input_ids: list[Int32] | list[list[Int32]] | None = None
    sampling_params: NativeSampling = Field(default_factory=NativeSampling)
    stream: StrictBool = False
    return_logprob: StrictBool = False  # SGLang's logprob fields (meta_info's *_token_logprobs)
    top_logprobs_num: TopLogprobs = 0
    logprob_start_len: Annotated[int, Strict(), Field(ge=-1, le=2**31 - 1)] = -1  # -1: no prompt logprobs
    return_text_in_logprobs: StrictBool = False  # each logprob's token text too (else null)
    # SGLang's GenerateReqInput fields that sglang-router writes into every /generate it forwards
    # (minisgl/server/ops/dp.py), and SGLang's bench_serving (lora_path, return_routed_experts): those
    # that change nothing here take any value of their type; those that ask for what this server does
    # not do take only their "off" value
    model: Text | None = None
    log_metrics: StrictBool = True
    no_logs: StrictBool = False
    return_hidden_states: Literal[False] = False
    return_entropy: Literal[False] = False
    return_bytes: Literal[False] = False
    background: Literal[False] = False
    lora_path: None = None
    return_routed_experts: Literal[False] = False

    def prompts(self) -> tuple[list[str] | list[list[int]], bool]:
        """The prompts, and whether they came as a batch (a list of texts or of token-id lists)."""
        p = self.text if self.text is not None else self.input_ids or []
        batch = isinstance(p, list) and (self.text is not None or any(isinstance(x, list) for x in p))
        return (p if batch else [p]), batch  # type: ignore[return-value]
