"""Request schemas of the HTTP API (OpenAI-compatible, plus the native ``/generate``), and their
translation into ``SamplingParams``.

Fields are strictly typed (``"5"`` is not an integer, ``"yes"`` is not a boolean) and range-checked
here, so a bad request is refused with a 400 that names the field before anything is queued.
Unknown fields are ignored, as clients written for other servers send extras; fields we know but
do not implement (logprobs, penalties, tools, ...) are refused rather than silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, StrictInt, StrictStr, field_validator

from minisgl.core import SamplingParams

StrictFloat = Annotated[float, Strict()]  # accepts ints too, but not strings or booleans
MAX_N = 16  # choices per request
MAX_STOP = 4  # stop strings per request (OpenAI's limit)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions

# field -> values that mean "not used"; anything else is refused with a 400
UNSUPPORTED = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}),
}


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


class _Request(BaseModel):
    """The sampling fields shared by /v1/chat/completions and /v1/completions."""

    model_config = ConfigDict(extra="allow")

    model: StrictStr | None = None
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: StrictFloat | None = Field(None, ge=0, le=2)
    top_p: StrictFloat | None = Field(None, gt=0, le=1)
    top_k: StrictInt | None = None  # extension (<= 0: off)
    stop: StrictStr | list[StrictStr] | None = Field(None, validate_default=True)  # a list once validated
    stop_token_ids: list[StrictInt] | None = None  # extension
    seed: StrictInt | None = Field(None, ge=0, le=2**63 - 1)
    n: StrictInt = Field(1, ge=1, le=MAX_N)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False  # extension
    user: StrictStr | None = None

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
            stop_token_ids=list(self.stop_token_ids or []),
            seed=self.seed,
        )


class TextPart(BaseModel):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None

    def as_template_input(self) -> dict[str, str]:
        content = self.content
        if isinstance(content, list):
            content = "\n".join(p.text for p in content)
        role = "system" if self.role == "developer" else self.role  # developer: OpenAI's newer name
        return {"role": role, "content": content or ""}


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


Prompt = StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]


class CompletionRequest(_Request):
    prompt: Prompt

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

    temperature: StrictFloat = Field(0.0, ge=0)
    top_k: StrictInt = -1
    top_p: StrictFloat = Field(1.0, gt=0, le=1)
    max_new_tokens: StrictInt = Field(SamplingParams.max_tokens, ge=1)
    stop: StrictStr | list[StrictStr] | None = Field(None, validate_default=True)  # a list once validated
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    seed: StrictInt | None = Field(None, ge=0, le=2**63 - 1)

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
            stop_token_ids=list(self.stop_token_ids or []),
            seed=self.seed,
        )


class GenerateRequest(BaseModel):
    """Native API: one prompt as ``text`` or ``input_ids``; returns text and token ids."""

    model_config = ConfigDict(extra="forbid")

    text: StrictStr | None = None
    input_ids: list[StrictInt] | None = None
    sampling_params: NativeSampling = Field(default_factory=NativeSampling)
    stream: StrictBool = False
