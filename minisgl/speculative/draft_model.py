"""Draft-model drafting (SGLang's ``--speculative-algorithm STANDALONE`` with
``--speculative-draft-model-path``): a smaller model with the target's vocabulary proposes ``k`` tokens
greedily, one forward pass of its own per token.

Each request has its own dense KV cache for the draft model (a tensor per layer, grown by doubling), run
through the engine's decoder (``minisgl/models``: Llama and Qwen3) with a small attention of its own
(``DenseAttention``) in place of the paged backend. What the cache holds is checked against the request's
tokens at every ``propose``, since the target may have rejected drafts fed to it last time::

    cached:   t0 ... t(n-3) t(n-2) d0 d1 d2          (KV of what the last propose fed: tokens, then drafts)
    request:  t0 ... t(n-3) t(n-2) d0 x  ...  t(n-1)  (the target accepted d0, then gave x != d1)
    keep the common prefix (d0 included), feed the rest up to t(n-1): its logits give the first draft

So a rejected draft's KV is never read again: its positions are overwritten by the next pass. Simple
rather than fast: requests draft one at a time (a batch of B drafts B x k small passes), on the Python
layer path; no tensor parallelism (refused).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from minisgl.core import Req
from minisgl.speculative.base import Drafter


@dataclass
class DenseKV:
    """One request's draft-model KV: positions ``[0, len(tokens))`` hold the KV of ``tokens``."""

    k: list[torch.Tensor]  # per layer [capacity, kv_heads, head_dim]
    v: list[torch.Tensor]
    tokens: list[int] = field(default_factory=list)

    def reserve(self, n: int) -> None:
        """Room for ``n`` positions (doubling, so a request's cache is copied O(log n) times)."""
        cap = self.k[0].shape[0]
        if n <= cap:
            return
        cap = max(n, 2 * cap)
        grow = lambda t: torch.cat([t, t.new_empty(cap - t.shape[0], *t.shape[1:])])
        self.k, self.v = [grow(t) for t in self.k], [grow(t) for t in self.v]


class DenseAttention:
    """Stands in for the attention backend while the draft model runs (``AttentionLayer`` only calls
    ``forward``): stores the pass's K/V at positions ``[start, start + n)`` of ``kv`` and attends causally
    over ``[0, start + n)``."""

    def __init__(self):
        self.kv: DenseKV | None = None
        self.start = 0

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch) -> torch.Tensor:
        kv, s, n = self.kv, self.start, q.shape[0]
        kv.k[layer_id][s : s + n], kv.v[layer_id][s : s + n] = k, v
        keys, values = kv.k[layer_id][: s + n].transpose(0, 1), kv.v[layer_id][: s + n].transpose(0, 1)
        group = q.shape[1] // keys.shape[0]  # grouped-query attention: each KV head serves `group` q heads
        keys, values = keys.repeat_interleave(group, 0), values.repeat_interleave(group, 0)
        # query i sits at position s + i: it sees keys 0 .. s + i
        mask = torch.ones(n, s + n, dtype=torch.bool, device=q.device).tril(diagonal=s) if n > 1 else None
        out = F.scaled_dot_product_attention(q.transpose(0, 1), keys, values, attn_mask=mask)
        return out.transpose(0, 1).reshape(n, -1)


class DraftModelDrafter(Drafter):
    """``STANDALONE``: greedy drafts of a draft model (``speculative_draft_model_path``, same vocabulary).
    ``num_layers``: run only the draft model's first this many layers (then its final norm and LM head;
    None: all), e.g. a target drafting for itself from its first few layers."""

    num_layers: int | None = None

    def __init__(self, model, device: torch.device):
        self.model, self.device = model, device
        self.attn = DenseAttention()
        self.state: dict[Req, DenseKV] = {}  # per running request; dropped by release

    @classmethod
    def build(cls, config, engine) -> DraftModelDrafter:
        from minisgl.models.decoder import DecoderForCausalLM
        from minisgl.models.resolve import resolve_model
        from minisgl.models.weights import load_weights

        if not config.speculative_draft_model_path:
            raise ValueError("speculative_algorithm STANDALONE needs speculative_draft_model_path (a model folder)")
        if config.tp_size > 1:
            raise ValueError("speculative_algorithm STANDALONE does not run with tensor parallelism (tp_size > 1)")
        path, cfg = resolve_model(config.speculative_draft_model_path)
        target_vocab = engine.model_config.vocab_size
        if cfg.vocab_size != target_vocab:
            raise ValueError(f"the draft model's vocabulary ({cfg.vocab_size}) is not the target's ({target_vocab})")
        model = DecoderForCausalLM.build(cfg, None, config.torch_dtype, engine.device)
        load_weights(model, path)
        if cls.num_layers is not None:
            model.model.layers = model.model.layers[: cls.num_layers]
        return cls(model.eval(), engine.device)

    def _new_kv(self) -> DenseKV:
        attn = self.model.model.layers[0].self_attn
        shape = (64, attn.num_kv_heads, attn.head_dim)
        p = next(self.model.parameters())
        layers = len(self.model.model.layers)
        empty = lambda: p.new_empty(shape)
        return DenseKV([empty() for _ in range(layers)], [empty() for _ in range(layers)])

    def _next(self, kv: DenseKV, start: int, tokens: list[int]) -> int:
        """Feed ``tokens`` at positions ``start ..`` (dropping what ``kv`` held from ``start`` on); the draft
        model's greedy token after them."""
        kv.reserve(start + len(tokens))
        del kv.tokens[start:]
        kv.tokens += tokens
        self.attn.kv, self.attn.start = kv, start
        ids = torch.tensor(tokens, dtype=torch.int64, device=self.device)
        pos = torch.arange(start, start + len(tokens), dtype=torch.int64, device=self.device)
        from minisgl.attention.context import forward_context

        with forward_context(None, self.attn):  # type: ignore[arg-type]
            logits = self.model(ids, pos, torch.tensor([len(tokens) - 1], device=self.device))
        return int(logits[0].argmax())

    @torch.inference_mode()
    def propose(self, req: Req, k: int) -> list[int]:
        tokens = req.input_ids + req.output_ids
        kv = self.state.get(req)
        if kv is None:
            kv = self.state[req] = self._new_kv()
        same = 0  # the cached prefix that is still the request's (a rejected draft ends it)
        limit = min(len(kv.tokens), len(tokens) - 1)  # the last token is always fed: its logits give d0
        while same < limit and kv.tokens[same] == tokens[same]:
            same += 1
        drafts = [self._next(kv, same, tokens[same:])]
        while len(drafts) < k:
            drafts.append(self._next(kv, len(tokens) + len(drafts) - 1, drafts[-1:]))
        return drafts

    def release(self, req: Req) -> None:
        self.state.pop(req, None)
