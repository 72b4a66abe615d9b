"""Logprobs in the API's shapes: OpenAI's chat (``logprobs.content``), OpenAI's completions
(``tokens`` / ``token_logprobs`` / ``top_logprobs`` / ``text_offset``, the prompt's too with
``echo``: what ``lm-eval``'s loglikelihood reads) and SGLang's ``/generate`` (``meta_info``'s
``output_token_logprobs`` and friends). The numbers are the engine's (``minisgl/logprobs/``:
the model's distribution after a grammar mask, before temperature / top-k / top-p); a token's text is
made from its bytes, which the detokenizer sends along (``ReplyMsg.pieces``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from minisgl.message import ReplyMsg, TokenLogprobs


@dataclass
class SeqLogprobs:
    """One sequence's logprobs as its replies bring them (``Seq.lp``); ``out`` is aligned with the
    sequence's token ids."""

    out: TokenLogprobs = field(default_factory=TokenLogprobs)
    prompt: TokenLogprobs | None = None
    pieces: dict[int, bytes] = field(default_factory=dict)
    sent: int = 0  # output entries already streamed
    chars: int = 0  # characters of token text already streamed (a stream's next text_offset)

    def feed(self, r: ReplyMsg) -> None:
        if r.pieces:
            self.pieces.update((i, bytes(b)) for i, b in r.pieces.items())
        if r.logprobs is not None:
            self.out.extend(r.logprobs)
        if r.prompt_logprobs is not None:
            self.prompt = r.prompt_logprobs

    def text(self, token_id: int) -> str:
        return self.pieces.get(token_id, b"").decode("utf-8", errors="replace")

    def take(self, end: int | None = None) -> range:
        """Output entries not streamed yet (up to ``end``), marked as sent."""
        end = len(self.out.logprobs) if end is None else min(end, len(self.out.logprobs))
        got, self.sent = range(self.sent, max(self.sent, end)), max(self.sent, end)
        return got

    # ---- OpenAI chat -------------------------------------------------------------------------
    def chat(self, idx: range) -> dict[str, Any]:
        """``choices[i].logprobs`` of a chat completion (or of one streamed chunk)."""
        o = self.out

        def entry(tid: int, lp: float) -> dict[str, Any]:
            return {"token": self.text(tid), "logprob": lp, "bytes": list(self.pieces.get(tid, b""))}

        content = [
            entry(o.token_ids[j], o.logprobs[j])
            | {"top_logprobs": [entry(t, v) for t, v in zip(o.top_ids[j], o.top_vals[j])]}
            for j in idx
        ]
        return {"content": content, "refusal": None}

    # ---- OpenAI completions ------------------------------------------------------------------
    def completion(self, idx: range, echo: bool = False, stream: bool = False) -> dict[str, Any]:
        """``choices[i].logprobs`` of a completion: with ``echo``, the prompt's tokens first (the
        first token, and any before ``prompt_logprobs_from``, with ``None``). ``text_offset``: where
        each token's text starts in the choice's text (in a stream, counting the chunks before)."""
        offset = self.chars if stream else 0
        tokens, lps, tops = [], [], []
        if echo and self.prompt is not None:
            p = self.prompt
            unscored = len(p.token_ids) - len(p.logprobs)
            tokens += [self.text(t) for t in p.token_ids]
            lps += [None] * unscored + p.logprobs
            tops += [None] * unscored + [self._top(i, v) for i, v in zip(p.top_ids, p.top_vals)]
        o = self.out
        tokens += [self.text(o.token_ids[j]) for j in idx]
        lps += [o.logprobs[j] for j in idx]
        tops += [self._top(o.top_ids[j], o.top_vals[j]) for j in idx]
        offsets = []
        for t in tokens:
            offsets.append(offset)
            offset += len(t)
        if stream:
            self.chars = offset
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}

    def _top(self, ids: list[int], vals: list[float]) -> dict[str, float]:
        # OpenAI's shape: token text -> logprob (two tokens with the same text keep the likelier)
        top: dict[str, float] = {}
        for t, v in zip(ids, vals):
            top.setdefault(self.text(t), v)
        return top

    def prompt_text(self) -> str:
        """The prompt as text, from its tokens' bytes (an echo of a prompt given as token ids)."""
        return b"".join(self.pieces.get(t, b"") for t in self.prompt.token_ids).decode("utf-8", errors="replace")

    # ---- SGLang's /generate ------------------------------------------------------------------
    def sglang(self, with_text: bool, top: bool, start: int, idx: range | None = None) -> dict[str, Any]:
        """``meta_info``'s logprob fields: ``[logprob, token_id, text or None]`` triples; the prompt's
        from token ``start`` (SGLang's ``logprob_start_len``; -1: none)."""
        text = (lambda t: self.text(t)) if with_text else (lambda t: None)
        o, idx = self.out, range(len(self.out.logprobs)) if idx is None else idx
        meta: dict[str, Any] = {
            "output_token_logprobs": [[o.logprobs[j], o.token_ids[j], text(o.token_ids[j])] for j in idx]
        }
        if top:
            meta["output_top_logprobs"] = [[[v, t, text(t)] for t, v in zip(o.top_ids[j], o.top_vals[j])] for j in idx]
        if self.prompt is not None and start >= 0:
            p = self.prompt
            ids = p.token_ids[len(p.token_ids) - len(p.logprobs) :]
            pad = p.token_ids[:1] if start == 0 else []  # token 0 has no logprob: SGLang's None
            meta["input_token_logprobs"] = [[None, t, text(t)] for t in pad] + [
                [lp, t, text(t)] for lp, t in zip(p.logprobs, ids)
            ]
            if top:
                meta["input_top_logprobs"] = [None for _ in pad] + [
                    [[v, t, text(t)] for t, v in zip(ti, tv)] for ti, tv in zip(p.top_ids, p.top_vals)
                ]
        return meta
