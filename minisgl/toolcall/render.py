"""Tools and tool turns into the prompt (in the tokenizer process, before the chat template).

A chat template that knows tools (Qwen3, Hermes, Llama 3.x) gets them as ``apply_chat_template(...,
tools=...)`` and the history as it expects it (a call's ``arguments`` as a dict). A template without
them (the embedded SmolLM2) gets the default rendering below: the tools described in the system
message, each call written back as the block the model was asked for, each result as a user turn::

    <|im_start|>system  ...DEFAULT_PROMPT with the tools...    (or prepended to the caller's own)
    <|im_start|>assistant  <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>
    <|im_start|>user  <tool_response>\\n...result...\\n</tool_response>

A chat without tools or tool turns reaches the template exactly as before.
"""

from __future__ import annotations

import json
from typing import Any

DEFAULT_PROMPT = (
    "You can call functions. Their signatures, as JSON schemas, are in <tools></tools>:\n<tools>\n{tools}\n</tools>\n"
    "To call functions, answer with one block per call, each holding a JSON object:\n"
    '<tool_call>\n{{"name": <function name>, "arguments": <arguments object>}}\n</tool_call>'
)


def chat_traits(tokenizer: Any) -> dict[str, Any]:
    """What the API server must know of the model's chat template (sent in the tokenizer's ReadyMsg):
    ``tool_format`` (``hermes``: ``<tool_call>`` blocks, also our default; ``llama3``: a bare JSON call
    with ``parameters``), ``native_tools`` (the template renders tools) and ``thinks`` (it knows ``<think>``)."""
    t = getattr(tokenizer, "chat_template", None)
    t = t if isinstance(t, str) else ""
    native = "tools" in t
    llama = native and "<tool_call>" not in t and '"parameters"' in t
    return {"tool_format": "llama3" if llama else "hermes", "native_tools": native, "thinks": "<think>" in t}


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # not JSON: kept as the client sent it


def render_chat(tokenizer: Any, messages: list[dict], tools: list[dict] | None) -> tuple[list[dict], list | None]:
    """``(messages, tools)`` for ``apply_chat_template``: unchanged without tools or tool turns."""
    if not tools and not any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        return messages, None
    if chat_traits(tokenizer)["native_tools"]:
        out = []
        for m in messages:
            m = {**m, "tool_calls": list(m["tool_calls"])} if m.get("tool_calls") else m
            for i, c in enumerate(m.get("tool_calls") or ()):  # templates write a call's arguments as a dict
                f = c["function"]
                m["tool_calls"][i] = {**c, "function": {**f, "arguments": _arguments(f["arguments"])}}
            out.append(m)
        return out, tools or None
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [json.dumps({"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])})
                     for c in m["tool_calls"]]  # fmt: skip
            blocks = "\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in calls)
            out.append({"role": "assistant", "content": (m["content"] + "\n" if m["content"] else "") + blocks})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    if tools:
        prompt = DEFAULT_PROMPT.format(tools="\n".join(json.dumps(t) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out, None
