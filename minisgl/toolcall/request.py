"""The chat request's tool fields, as mixins of the server's schemas (``minisgl/server/protocol.py``):
``ToolTurn`` for a message, ``ToolRequest`` for ``/v1/chat/completions``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import BaseModel, StrictBool, ValidationInfo, field_validator

from minisgl.toolcall.schema import NamedToolChoice, Tool, ToolCall, ToolChoice


class ToolTurn(BaseModel):
    tool_calls: list[ToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers

    def tool_fields(self) -> dict[str, Any]:
        """What the chat template sees of these fields (nothing for a turn without them)."""
        out: dict[str, Any] = {"tool_calls": [c.model_dump() for c in self.tool_calls]} if self.tool_calls else {}
        return out | ({"tool_call_id": self.tool_call_id} if self.tool_call_id is not None else {})


class ToolRequest(BaseModel):
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None  # None: "auto" with tools, else "none" (OpenAI's defaults)
    parallel_tool_calls: StrictBool = True
    # raises ValueError if a function's parameters is not a schema calls can be held to (the server's
    # protocol gives the constraint engine's check)
    check_parameters: ClassVar[Callable[[dict], None]] = staticmethod(lambda parameters: None)

    @field_validator("tools")
    @classmethod
    def _check_tools(cls, tools: list[Tool] | None) -> list[Tool] | None:
        for i, t in enumerate(tools or ()):
            if (t.function.parameters or {}).get("type", "object") != "object":
                raise ValueError(f"tools.{i}.function.parameters must describe an object (the arguments)")
            try:
                cls.check_parameters(t.function.parameters or {})
            except ValueError as e:
                raise ValueError(f"tools.{i}.function.parameters is not a schema calls can follow: {e}") from None
        if len({t.function.name for t in tools or ()}) < len(tools or ()):
            raise ValueError("two functions have the same name")
        return tools

    @field_validator("tool_choice")
    @classmethod
    def _check_choice(cls, choice: Any, info: ValidationInfo) -> Any:
        names = {t.function.name for t in info.data.get("tools") or ()}
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"names function {choice.function.name!r}, which is not in tools")
        if choice == "required" and not names:
            raise ValueError('"required" needs tools')
        return choice

    @property
    def tool_mode(self) -> str | NamedToolChoice:
        """``tool_choice`` with OpenAI's default; ``"none"`` without tools."""
        return "none" if not self.tools else self.tool_choice or "auto"

    @property
    def tool_mode_value(self) -> str | dict:
        mode = self.tool_mode
        return mode if isinstance(mode, str) else mode.model_dump()

    @property
    def tool_constraint(self) -> str | None:
        """Not None when the answer's calls are held to the tools (it cannot have another constraint)."""
        return None if self.tool_mode == "none" else "tools"

    def template_tools(self) -> list[dict] | None:
        """The tools the prompt shows: none with ``tool_choice="none"`` (the answer is text)."""
        return None if self.tool_mode == "none" else [t.model_dump(exclude_none=True) for t in self.tools]
