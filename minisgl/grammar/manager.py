"""The scheduler's side of constrained decoding: compiles off the loop, one matcher per request, and
each batch's bitmask, filled while the forward pass runs.

A constraint is checked when its request is made (``start``: ``limits.py``, size, depth and schema
keywords, a 400 at once) and compiled off the loop (``compiler.py``: a syntax check first, then a
forked child with a time limit, stopped when no request waits for it; a cache bounded in bytes), so
a new schema costs the loop nothing: the server's scheduler adds a request once its compile is done
(or answers 400), ``LLM.generate`` waits for it before queueing anything, and a matcher is made at
the request's first sample (on the other tensor-parallel ranks, which compile for themselves without
a time limit, since rank 0 already accepted the request, that waits for their compile if it still runs).

A matcher must have seen every earlier token of its request before its row's mask is filled. With
the overlap loop the previous token is still on the device when the next batch is launched, so the
mask is made in ``launch``, around the forward pass (as SGLang does)::

    launch(i+1):  gather from the token pool the tokens the matchers have not seen (batch i's)
                  -> copy to the host (async) -> queue forward(i+1) -> wait for the copy (batch i
                  is done; forward(i+1) runs on) -> accept them, fill the bitmask on the host while
                  forward(i+1) runs -> copy it to the device -> mask the logits -> sample
    process(i):   the same tokens reach the host; the matchers have seen them: nothing to do

What overlaps the forward pass is the host's work of the mask (accepting tokens, filling rows, the
copy); what the device waits for is only that work's tail. With the plain loop the matchers are
current at launch and nothing is gathered. On the CPU every step is synchronous anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch

from minisgl.core import Batch, Req, RequestError, TokenEvent
from minisgl.feature import Feature, SampleHooks
from minisgl.grammar import limits
from minisgl.grammar.base import GRAMMAR_BACKENDS, GrammarError, Matcher, apply_bitmask, bitmask_words
from minisgl.grammar.compiler import TIME_LIMIT_S, Compiler, Key

logger = logging.getLogger(__name__)


@dataclass
class _Tracked:
    future: Future
    matcher: Matcher | None = None  # made at the request's first sample
    consumed: int = 0  # output tokens the matcher has accepted
    broken: bool = False  # compile failed or a token was refused: the row goes unmasked, the request stops


class GrammarManager(Feature):
    """The grammar feature (``minisgl/feature.py``): a constrained request waits for its compile before
    it is queued; each batch's kept rows of constrained requests are masked before sampling; a request
    stops where its grammar ends."""

    name = "grammar"

    def __init__(
        self,
        backend: str,
        model_path: Path | None,
        vocab_size: int,
        stop_ids: Callable[[], set[int]],
        tp_rank: int = 0,
    ):
        """``tp_rank > 0``: a follower compiles what rank 0 accepted, with no time limit (rank 0 has one)."""
        self.backend_name, self.model_path, self.vocab_size = backend, model_path, vocab_size
        self._stop_ids = stop_ids
        self.compiler = Compiler(self._build, None if tp_rank else TIME_LIMIT_S)
        self._reqs: dict[Req, _Tracked] = {}

    @property
    def backend(self):
        """The backend (None until the first constraint has been checked)."""
        return self.compiler.backend

    def _build(self):
        return GRAMMAR_BACKENDS.get(self.backend_name).build(self.model_path, self.vocab_size, sorted(self._stop_ids()))

    # ---- compiling (compiler.py) -------------------------------------------------------------
    def compile(self, key: Key) -> Future:
        return self.compiler.submit(key)

    def validate(self, req: Req) -> None:
        """Check ``req``'s constraint (``RequestError`` for one ``limits.py`` refuses) and start its compile."""
        if (key := req.sampling.grammar) is not None:
            try:
                limits.check(*key)
            except GrammarError as e:
                raise RequestError(str(e), key[0]) from None
            self.compiler.submit(key, req)

    def error(self, req: Req, wait: bool = True) -> RequestError | None:
        """Why ``req``'s constraint cannot be compiled (None: it compiled, has none, or, with
        ``wait=False``, is still compiling)."""
        key = req.sampling.grammar
        if key is None:
            return None
        fut = self.compiler.submit(key, req)
        if not wait and not fut.done():
            return None
        exc = fut.exception()
        return None if exc is None else RequestError(str(exc), key[0])

    def ready(self, req: Req) -> bool:
        key = req.sampling.grammar
        return key is None or self.compiler.submit(key, req).done()

    def abandon(self, req: Req) -> None:
        """``req`` no longer waits for its compile (it was aborted before it was added): a compile that
        nobody waits for is stopped."""
        if (key := req.sampling.grammar) is not None:
            self.compiler.drop(key, req)

    # ---- requests ----------------------------------------------------------------------------
    def track(self, req: Req) -> None:
        if (key := req.sampling.grammar) is not None:
            self._reqs[req] = _Tracked(self.compiler.submit(key, req))

    def release(self, req: Req) -> None:
        self._reqs.pop(req, None)
        self.abandon(req)

    def plan(self, batch: Batch) -> tuple[list[int], list[int]] | None:
        """The kept rows of constrained requests and the output token number each samples."""
        rows, steps = [], []
        for i, (req, end) in enumerate(zip(batch.reqs, batch.ends)):
            if req in self._reqs and end == req.device_len:  # this pass samples a kept token
                rows.append(i)
                steps.append(req.num_scheduled_outputs)
        return (rows, steps) if rows else None

    def hooks(self, batch: Batch, plan: tuple[list[int], list[int]], token_pool: torch.Tensor) -> SampleHooks | None:
        mask = self.masker([batch.reqs[i] for i in plan[0]], *plan, token_pool)
        if mask is None:
            return None
        hooks = SampleHooks()
        hooks.on_logits = mask
        return hooks

    def on_token(self, batch: Batch, plan, row: int, req: Req, ev: TokenEvent) -> None:
        if ev.finish_reason is None and self.ended(req, len(req.output_ids) - 1):
            ev.finish_reason = "stop"

    def masker(self, reqs: list[Req], rows: list[int], steps: list[int], token_pool: torch.Tensor):
        """Call before the forward pass: for batch rows ``rows`` (their requests ``reqs``, sampling
        output token number ``steps[i]``), start fetching the tokens their matchers lack. Returns
        ``mask(logits)``, to call between the forward pass and sampling (None: no row constrained)."""
        work = [(r, req, self._reqs[req], s) for r, req, s in zip(rows, reqs, steps) if req in self._reqs]
        if not work:
            return None
        lag_rows, lag_pos = [], []  # tokens sampled but not yet on the host (the overlap loop's last batch)
        for _, req, st, step in work:
            for idx in range(max(st.consumed, len(req.output_ids)), step):
                lag_rows.append(req.table_idx)
                lag_pos.append(req.prompt_len + idx)
        fetched, ready = None, None
        if lag_rows:
            dev = token_pool.device
            fetched = token_pool[torch.tensor(lag_rows, device=dev), torch.tensor(lag_pos, device=dev)]
            if dev.type == "cuda":
                fetched = fetched.to("cpu", non_blocking=True)
                ready = torch.cuda.Event()
                ready.record()

        def mask(logits: torch.Tensor) -> None:
            if ready is not None:
                ready.synchronize()
            late = iter(fetched.tolist() if fetched is not None else ())
            on_cuda = logits.device.type == "cuda"
            bitmask = torch.full(
                (logits.shape[0], bitmask_words(logits.shape[1])), -1, dtype=torch.int32, pin_memory=on_cuda
            )
            for row, req, st, step in work:
                self._catch_up(req, st, step, late)
                if not st.broken and not st.matcher.is_terminated():
                    st.matcher.fill_bitmask(bitmask, row)
            apply_bitmask(logits, bitmask.to(logits.device, non_blocking=True), [w[0] for w in work])

        return mask

    def _catch_up(self, req: Req, st: _Tracked, step: int, late) -> None:
        """Make the matcher (first sample) and feed it output tokens ``[consumed, step)``: those on
        the host from ``req.output_ids``, the rest from ``late`` (fetched from the device, in order)."""
        if st.matcher is None and not st.broken:
            exc = st.future.exception()  # waits, if the compile still runs
            if exc is not None:
                st.broken = True
                logger.error("request %d: its grammar failed to compile: %s", req.uid, exc)
            else:
                st.matcher = self.backend.matcher(st.future.result())
        n_host = len(req.output_ids)
        for idx in range(st.consumed, step):
            tok = req.output_ids[idx] if idx < n_host else next(late)
            if not st.broken:
                self._accept(req, st, tok)

    def _accept(self, req: Req, st: _Tracked, token: int) -> None:
        if st.matcher.is_terminated() or not st.matcher.accept_token(token):
            st.broken = True
            logger.warning("request %d: token %d is outside its grammar; the request stops", req.uid, token)
        st.consumed += 1

    def ended(self, req: Req, index: int) -> bool:
        """Output token ``index`` of ``req`` reached the host (``req.output_ids[index]``); True when
        its grammar has ended (a stop token accepted) or broke: the request stops."""
        st = self._reqs.get(req)
        if st is None:
            return False
        if st.matcher is not None and not st.broken and index == st.consumed:
            self._accept(req, st, req.output_ids[index])
        return st.broken or (st.matcher is not None and st.matcher.is_terminated())

    def shutdown(self) -> None:
        self.compiler.shutdown()


def create(config, engine, scheduler) -> GrammarManager:
    """Every scheduler has one (a request without a constraint costs it nothing)."""
    eos = lambda: scheduler.eos_ids  # noqa: E731  (the tokenizer's join them after start-up)
    path = getattr(engine, "model_path", None)
    return GrammarManager(config.components.grammar, path, engine.model_config.vocab_size, eos, config.tp_rank)
