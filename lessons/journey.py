"""Lesson 11's observer of a request's journey through the server's processes.

The server's text seam (``minisgl/tokenizer/detokenizer.py``) is given by name, so every process of
``python -m minisgl --detokenizer journey:TRACED`` imports this module itself (``lessons/`` on its
``PYTHONPATH``). Its two classes behave exactly as the engine's own and, when ``$MINISGL_JOURNEY``
names a file, append one JSON line per event with a wall-clock time (one clock for all processes
of a machine):

* ``detokenizer``: each token pushed in the detokenizer process, and the text it completed;
* ``api-server``: each sequence started in the API server, and each piece of text it fed to the stop
  strings, with what it let through.
"""

from __future__ import annotations

import json
import os
import time

from minisgl.tokenizer.detokenizer import IncrementalDecoder, StopStringCutter, TextStreams


def record(proc: str, event: str, **data) -> None:
    path = os.environ.get("MINISGL_JOURNEY")
    if path:
        line = json.dumps({"t": time.time(), "proc": proc, "pid": os.getpid(), "event": event, **data})
        with open(path, "a") as f:  # one short line per write: lines of two processes never mix
            f.write(line + "\n")


class TracedDecoder(IncrementalDecoder):
    def push(self, token_ids: list[int]) -> str:
        text = super().push(token_ids)
        record("detokenizer", "push", ids=list(token_ids), text=text)
        return text


class TracedStops(StopStringCutter):
    def __init__(self, stops: list[str]):
        super().__init__(stops)
        record("api-server", "start", stops=list(stops))

    def feed(self, text: str) -> str:
        out = super().feed(text)
        record("api-server", "feed", text=text, sent=out, stopped=self.stopped)
        return out


TRACED = TextStreams(TracedDecoder, TracedStops)
