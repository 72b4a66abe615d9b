"""The request's tool fields in OpenAI's shapes: ``tools``, ``tool_choice`` and an assistant turn's
``tool_calls``. Checked here (names, types); whether a function's ``parameters`` is a schema the engine
can enforce is the server's protocol's check (it compiles it)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, Strict

Name = Annotated[str, Strict(), Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]  # OpenAI's function names


class FunctionDef(BaseModel):
    name: Name
    description: Annotated[str, Strict()] | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object (None: no arguments)
    strict: Annotated[bool, Strict()] | None = None  # calls always follow the schema here


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(BaseModel):
    name: Name


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(BaseModel):
    name: Annotated[str, Strict()]
    arguments: Annotated[str, Strict()] = "{}"  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: Annotated[str, Strict()] | None = None
    type: Literal["function"] = "function"
    function: CalledFunction
