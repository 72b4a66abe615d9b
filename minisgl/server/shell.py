"""The terminal chat: ``python -m minisgl --shell``.

The shell drives the scheduler in-process (through ``minisgl.LLM``), not through the server's
processes. One person typing needs no batching across clients, so the HTTP and ZMQ hops would
only add start-up time and moving parts; in-process, Ctrl-C aborts the answer between two engine
steps, and the engine is left clean for the next question.

Commands: ``/reset`` forgets the conversation, ``/exit`` (or Ctrl-D) quits, Ctrl-C stops the
answer being written. Sampling comes from ``MINISGL_SHELL_*`` environment variables.
"""

from __future__ import annotations

import itertools
import signal
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from minisgl.core import SamplingParams
from minisgl.env import ENV, Env
from minisgl.server.args import ServerArgs

HELP = "/reset clears the conversation, /exit or Ctrl-D quits, Ctrl-C stops an answer"


@dataclass
class ShellSettings:
    max_tokens: int = 512
    # None: greedy on the embedded model (a 135M model de-quantised from 4 bits answers sensibly greedily
    # and wanders when sampled: "What is the capital of France?" got a wrong answer at 0.6), else 0.6
    temperature: float | None = None
    top_p: float = 0.95
    top_k: int = -1
    history_file: str | None = None  # None: <minisgl cache>/shell_history

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ShellSettings:
        """From the ``MINISGL_SHELL_*`` variables (``minisgl.env``) of ``environ``, or of the process;
        ``ValueError`` names a malformed one."""
        env = Env(environ) if environ is not None else ENV
        if environ is None:
            env.check()
        s = cls(env.shell_max_tokens, env.shell_temperature, env.shell_top_p, env.shell_top_k, env.shell_history)
        s.sampling().validate()
        return s

    def sampling(self, embedded: bool = True) -> SamplingParams:
        temperature = self.temperature if self.temperature is not None else 0.0 if embedded else 0.6
        return SamplingParams(temperature=temperature, top_p=self.top_p, top_k=self.top_k, max_tokens=self.max_tokens)


@contextmanager
def _ctrl_c_sets(flag: list[bool]):
    """While generating, Ctrl-C only raises a flag: the loop checks it between two engine steps,
    so a step is never torn in half."""
    old = signal.signal(signal.SIGINT, lambda sig, frame: flag.__setitem__(0, True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


class ChatSession:
    """A multi-turn conversation with the engine: history in, streamed answer out."""

    def __init__(self, llm, sampling: SamplingParams):
        self.llm, self.sampling = llm, sampling
        self.history: list[dict[str, str]] = []
        self._uids = itertools.count()

    def reset(self) -> None:
        self.history.clear()

    def ask(self, question: str, write: Callable[[str], None]) -> tuple[str, bool]:
        """Stream the answer through ``write``; returns (answer, interrupted). The turn (with the
        partial answer if interrupted) joins the history; a refused question does not."""
        from minisgl.tokenizer import apply_chat_template
        from minisgl.tokenizer.detokenizer import text_streams

        sched, tok = self.llm.scheduler, self.llm.tokenizer
        turn = self.history + [{"role": "user", "content": question}]
        uid = next(self._uids)
        req = sched.make_request(uid, apply_chat_template(tok, turn), replace(self.sampling))  # ValueError: refused
        sched.add(req)
        detokenizer = text_streams(self.llm.config.components.detokenizer).detokenizer
        dec, parts, stop = detokenizer(tok), [], [False]
        with _ctrl_c_sets(stop):
            done = False
            while not done and not stop[0]:
                for ev in sched.step():
                    if ev.uid != uid:
                        continue
                    piece = dec.push([ev.token_id])
                    if ev.finish_reason is not None:
                        piece += dec.flush()
                        done = True
                    if piece:
                        parts.append(piece)
                        write(piece)
            if not done:
                sched.abort(uid)
        answer = "".join(parts)
        self.history = turn + [{"role": "assistant", "content": answer}]
        return answer, not done


def _reader(history_file: str | None) -> Callable[[], str]:
    """prompt_toolkit with a persistent history on a terminal; plain ``input`` otherwise (pipes)."""
    if not sys.stdin.isatty():
        return lambda: input("> ")
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory, InMemoryHistory

    history = InMemoryHistory()
    try:
        if history_file is None:
            from minisgl.models.embedded import cache_dir

            history_file = str(cache_dir() / "shell_history")
        Path(history_file).parent.mkdir(parents=True, exist_ok=True)
        history = FileHistory(history_file)
    except OSError:
        pass
    session = PromptSession(history=history)
    return lambda: session.prompt("> ")


def banner(llm, model: str | None, sampling: SamplingParams) -> str:
    """What the user talks to, how big it is, how it samples, and how to talk to something bigger."""
    from minisgl.models.embedded import EMBEDDED_NAME

    engine = llm.scheduler.engine
    params = sum(p.numel() for p in engine.model.parameters()) * engine.tp.size  # tied weights count once
    dtype = str(engine.dtype).removeprefix("torch.")
    how = "greedy" if sampling.is_greedy else f"temperature {sampling.temperature}, top-p {sampling.top_p}"
    lines = [f"minisgl shell: {model or EMBEDDED_NAME}, {params / 1e6:,.0f}M parameters, {dtype} on {engine.device}"]
    if model is None:
        lines += [
            "  the embedded model: shipped 4-bit (GGUF Q4_1) and de-quantised, a tiny model with simple answers;",
            "  a bigger one: python -m minisgl --shell --model Qwen/Qwen3-0.6B (a hub id or a local folder)",
        ]
    lines += [
        f"  answers: {how}, up to {sampling.max_tokens} tokens (MINISGL_SHELL_* variables change it)",
        f"  {HELP}.",
    ]
    return "\n".join(lines)


def run_shell(args: ServerArgs) -> int:
    try:
        settings = ShellSettings.from_env()
    except ValueError as e:
        print(f"minisgl shell: {e}", file=sys.stderr)
        return 2
    from minisgl.llm import LLM

    print("minisgl: loading the model ...", flush=True)
    try:
        llm = LLM(**args.engine)
    except (ValueError, FileNotFoundError, NotImplementedError) as e:
        print(f"minisgl shell: {e}", file=sys.stderr)
        return 1
    if llm.tokenizer is None or not getattr(llm.tokenizer, "chat_template", None):
        print("minisgl shell: this model has no chat template; the shell needs one", file=sys.stderr)
        return 1
    if llm.scheduler.device.type == "cuda":  # compile the lazily built kernels before the first question
        from minisgl.scheduler.warmup import warm_up

        warm_up(llm.scheduler)
    else:  # not inside the first answer, with nothing on the screen
        from minisgl.kernels.jit import wait_built

        wait_built(lambda what: print(f"minisgl: {what}", flush=True))
    embedded = args.engine.get("model") is None
    sampling = settings.sampling(embedded)
    print(banner(llm, args.engine.get("model"), sampling), flush=True)
    chat = ChatSession(llm, sampling)
    read = _reader(settings.history_file)
    write = lambda s: (sys.stdout.write(s), sys.stdout.flush())
    try:
        while True:
            try:
                line = read().strip()
            except KeyboardInterrupt:
                continue  # Ctrl-C at the prompt clears the line
            except EOFError:
                print()
                break
            if not line:
                continue
            if line in ("/exit", "/quit"):
                break
            if line == "/reset":
                chat.reset()
                print("(conversation cleared)", flush=True)
                continue
            if line.startswith("/"):
                print(f"unknown command {line.split()[0]}: {HELP}", flush=True)
                continue
            try:
                _, interrupted = chat.ask(line, write)
            except ValueError as e:
                print(f"(refused: {e}; /reset starts a new conversation)", flush=True)
                continue
            print("\n(interrupted)" if interrupted else "", flush=True)
    finally:
        llm.shutdown()
    return 0
