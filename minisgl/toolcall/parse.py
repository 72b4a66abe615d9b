"""The model's text split into reasoning, content and tool calls, as it streams in.

``OutputSplitter.feed(text, final)`` takes each new piece and returns only what is certain: text that
could still be the start of a marker (``<think>``, ``</think>``, ``<tool_call>``) is held back until
the next piece decides. Formats (``render.chat_traits``):

- ``hermes`` (Qwen3, Hermes, our default): calls are ``<tool_call>{json}</tool_call>`` blocks anywhere
  in the answer; the text around them is content.
- ``llama3``: an answer that is one JSON object ``{"name": ..., "parameters": {...}}`` (or several
  joined by ``;``) is a call, held back to the end; any other answer is content.

Reasoning (``--reasoning-parser qwen3``): an answer that opens with ``<think>`` has its text up to
``</think>`` as reasoning. A block that does not parse as a call of a known function (an answer cut
by ``max_tokens``) stays in the content, as written.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

THINK, END_THINK, OPEN, CLOSE = "<think>", "</think>", "<tool_call>", "</tool_call>"


@dataclass
class Call:
    name: str
    arguments: str  # JSON text
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Split:
    reasoning: str = ""
    content: str = ""
    calls: list[Call] = field(default_factory=list)


def _held(buf: str, marker: str) -> int:
    """How many characters at the end of ``buf`` could be the start of ``marker``."""
    return next((k for k in range(min(len(marker) - 1, len(buf)), 0, -1) if marker.startswith(buf[-k:])), 0)


def parse_call(text: str, names: set[str]) -> Call | None:
    """A call from its JSON (``arguments`` or Llama's ``parameters``), or None if it is not one."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    args = json.loads(args) if isinstance(args, str) and args.strip().startswith("{") else args
    return Call(obj["name"], json.dumps(args, ensure_ascii=False)) if isinstance(args, dict) else None


class OutputSplitter:
    def __init__(self, fmt: str = "hermes", names: set[str] | None = None, think: bool = False):
        self.fmt, self.names = fmt, names or set()  # no names: no calls are looked for
        self.mode = "start" if think else "text"
        self.buf, self.seen_text, self.called = "", False, False

    def feed(self, text: str, final: bool = False) -> Split:
        out, self.buf = Split(), self.buf + text
        while True:
            if self.mode == "start":  # the answer may open with <think>
                head = self.buf.lstrip()
                if head.startswith(THINK):
                    self.buf, self.mode = head[len(THINK) :], "think"
                elif THINK.startswith(head) and not final:
                    return out
                else:
                    self.mode = "text"
            elif self.mode == "think":
                cut = self.buf.find(END_THINK)
                if cut < 0:
                    keep = 0 if final else _held(self.buf, END_THINK)
                    out.reasoning += self.buf[: len(self.buf) - keep]
                    self.buf = self.buf[len(self.buf) - keep :]
                    return out
                out.reasoning += self.buf[:cut]
                self.buf, self.mode = self.buf[cut + len(END_THINK) :], "lead"
            elif self.mode == "lead":  # the whitespace between </think> and the answer is neither
                self.buf = self.buf.lstrip()
                if not self.buf and not final:
                    return out
                self.mode = "text"
            elif self.names and self.fmt == "llama3" and not self.seen_text:
                if not final:  # a call is the whole answer: decided at the end
                    return out
                calls = [parse_call(p, self.names) for p in self.buf.strip().split(";")]
                if self.buf.strip() and all(calls):
                    out.calls, self.buf = calls, ""
                self.seen_text = True
            elif self.mode == "text":
                blocks = self.names and self.fmt == "hermes"
                cut = self.buf.find(OPEN) if blocks else -1
                if cut < 0:
                    keep = 0
                    if blocks and not final:  # held: a possible start of a block, and the whitespace before it
                        keep = len(self.buf) - len(self.buf[: len(self.buf) - _held(self.buf, OPEN)].rstrip())
                    if final and self.called and not self.buf.strip():
                        self.buf = ""  # the separator after the last call is no content
                    out.content += self.buf[: len(self.buf) - keep]
                    self.buf = self.buf[len(self.buf) - keep :]
                    self.seen_text |= bool(out.content)
                    return out
                pre = self.buf[:cut]
                out.content += pre if pre.strip() or not self.called else ""  # not the separator between calls
                self.buf, self.mode = self.buf[cut:], "call"
            else:  # in a <tool_call> block
                cut = self.buf.find(CLOSE)
                if cut < 0 and not final:
                    return out
                call = parse_call(self.buf[len(OPEN) : cut], self.names) if cut >= 0 else None
                if call is None:  # not a call (cut short, or bad): it stays text
                    end = len(self.buf) if cut < 0 else cut + len(CLOSE)
                    out.content += self.buf[:end]
                    self.buf = self.buf[end:]
                else:
                    out.calls.append(call)
                    self.called = True
                    self.buf = self.buf[cut + len(CLOSE) :]
                self.mode = "text"


class ChatOutput:
    """One choice's answer in OpenAI's shapes: the message (``message()``) or the stream's deltas
    (``deltas()``); the finish reason is ``tool_calls`` once a call was made."""

    def __init__(self, fmt: str = "hermes", names: set[str] | None = None, think: bool = False):
        self.args = fmt, names, think
        self.splitter, self.ncalls = OutputSplitter(*self.args), 0

    def deltas(self, text: str, final: bool) -> list[dict]:
        s, out = self.splitter.feed(text, final), []
        if s.reasoning:
            out.append({"reasoning_content": s.reasoning})
        if s.content:
            out.append({"content": s.content})
        for c in s.calls:  # OpenAI's shape: the id, type and name first, then the arguments
            head = {"index": self.ncalls, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}
            out += [
                {"tool_calls": [head]},
                {"tool_calls": [{"index": self.ncalls, "function": {"arguments": c.arguments}}]},
            ]
            self.ncalls += 1
        return out

    def finish(self, reason: str) -> str:
        return "tool_calls" if self.ncalls and reason == "stop" else reason

    def message(self, text: str) -> dict:
        s = OutputSplitter(*self.args).feed(text, final=True)
        self.ncalls = len(s.calls)
        msg = {"role": "assistant", "content": (s.content.strip() or None) if s.calls else s.content}
        if s.reasoning:
            msg["reasoning_content"] = s.reasoning
        if s.calls:
            msg["tool_calls"] = [c.as_openai() for c in s.calls]
        return msg
