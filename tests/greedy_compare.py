"""Comparing the greedy generations of two numerically different runs (kernels, dtypes, graphs).

A different summation order moves logits by a few ulps. Where a request's two best logits are that
close, the runs may pick different tokens, and from there on they feed different inputs. So, per
request:

- while the tokens so far agree, the logits agree within ``atol``;
- at the first differing token, the reference had a near-tie: its logits of the two choices are
  within ``atol`` of each other;
- the rest of that request is not compared.
"""

from __future__ import annotations

from collections import defaultdict

import torch


class LogitRecorder:
    """Wraps an engine: the logits row of every sampled token, per request (keyed by prompt)."""

    def __init__(self, engine):
        self.rows: dict[tuple[int, ...], list[torch.Tensor]] = defaultdict(list)
        self._batch = None
        forward, sampler = engine.forward_batch, engine.sampler

        def forward_batch(batch, info):
            self._batch = batch
            return forward(batch, info)

        recorder = self

        class Recording:
            def sample(self, logits, info):
                batch = recorder._batch
                kept = [i for i, keep in enumerate(batch.sample_mask) if keep]
                rows = logits[kept].float().cpu()
                for row, i in zip(rows, kept):
                    recorder.rows[tuple(batch.reqs[i].input_ids)].append(row)
                return sampler.sample(logits, info)

        engine.forward_batch = forward_batch
        engine.sampler = Recording()

    def of(self, prompt: list[int], n: int) -> list[torch.Tensor]:
        return self.rows[tuple(prompt)][:n]


def compare_greedy(
    prompts: list[list[int]],
    tokens: list[list[int]],
    rows: LogitRecorder,
    ref_tokens: list[list[int]],
    ref_rows: LogitRecorder,
    atol: float,
) -> float:
    """Assert the rules above; return the fraction of tokens compared before any near-tie split.
    Prompts must be distinct: the recorder keys logits by prompt."""
    assert len({tuple(p) for p in prompts}) == len(prompts), "duplicate prompts"
    compared = total = 0
    for p, a, b in zip(prompts, tokens, ref_tokens):
        assert len(a) == len(b), f"prompt of {len(p)} tokens: {len(a)} tokens against {len(b)}"
        la, lb = rows.of(p, len(a)), ref_rows.of(p, len(b))
        assert len(la) == len(a) and len(lb) == len(b), "a sampled token without its logits"
        total += len(a)
        for t, (x, y) in enumerate(zip(la, lb)):
            err = float((x - y).abs().max())
            assert err < atol, f"prompt of {len(p)} tokens, output {t}: logits differ by {err:.3f}"
            compared += 1
            if a[t] != b[t]:
                gap = float(y[b[t]] - y[a[t]])
                assert gap < atol, (
                    f"prompt of {len(p)} tokens, output {t}: token {a[t]} instead of {b[t]}, "
                    f"which led by {gap:.3f} (not a near-tie)"
                )
                break
    return compared / max(total, 1)
