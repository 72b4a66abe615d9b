"""Tool calls and reasoning in the OpenAI-compatible chat API (docs/serving.md, lesson 14).

``schema.py`` and ``request.py`` the request's tool fields, ``render.py`` tools and tool turns into
the prompt (the tokenizer process), ``parse.py`` the answer split into reasoning, content and calls
(the API server). What holds a call to its function's schema is built by the constraint engine
(its ``tools.py``), from the server's protocol.
"""

from __future__ import annotations

from typing import Any

from minisgl.toolcall.parse import ChatOutput, OutputSplitter, parse_call
from minisgl.toolcall.render import chat_traits, render_chat
from minisgl.toolcall.schema import NamedToolChoice, Tool, ToolCall, ToolChoice

REASONING_PARSERS = ("auto", "qwen3", "none")  # auto: qwen3 when the chat template knows <think>


def chat_output(
    tools: list[Tool] | None, choice: Any, traits: dict[str, Any], reasoning_parser: str = "auto"
) -> ChatOutput:
    """The splitter of one choice's answer: which calls it looks for (none with ``tool_choice="none"``),
    in the model's format, and whether it separates the reasoning."""
    names = {t.function.name for t in tools or ()} if choice != "none" else set()
    if isinstance(choice, NamedToolChoice):
        names = {choice.function.name}
    think = reasoning_parser == "qwen3" or (reasoning_parser == "auto" and bool(traits.get("thinks")))
    return ChatOutput(traits.get("tool_format", "hermes"), names, think)


__all__ = ["REASONING_PARSERS", "ChatOutput", "NamedToolChoice", "OutputSplitter", "Tool", "ToolCall",
           "ToolChoice", "chat_output", "chat_traits", "parse_call", "render_chat"]  # fmt: skip
