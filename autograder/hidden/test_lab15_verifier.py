"""Lab 15, hidden tests: seeds at the top of their range (2^62 and above: the salt's bit) with top-p and
late steps, bfloat16 logits (the model's dtype on a GPU), and random sampled batches. Each calls the lab
first, so a stub fails at once with its hint."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autograder.adapters import lab15 as lab
from autograder.points import points
from autograder.test_lab15_verifier import check_verdict, make_info, safe_rows, stub_first

V = 9


def _case(seed: int, rows: int, k: int, vocab: int, dtype=torch.float32, **params):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, k + 1, vocab, generator=g) * 1.5).to(dtype)
    best = logits.float().argmax(-1)[:, :k]
    drafts = torch.where(torch.rand(rows, k, generator=g) < 0.6, best, torch.randint(0, vocab, (rows, k), generator=g))
    for r in range(1, rows, 2):
        drafts[r, int(torch.randint(0, k, (1,), generator=g)) :] = -1
    info = make_info(vocab=vocab, **params)
    return logits, drafts, info, safe_rows(logits.float(), drafts, info)


@points(4)
def test_top_p_and_large_seeds():
    """Sampled rows with top-p and top-k, seeds of 2^62 and more (where the salt's bit is already set) and
    steps past 2^32: every certain draw is the engine's."""
    stub_first()
    rows = 24
    seeds = [2**62 + 5 * r for r in range(rows // 2)] + [2**63 - 1 - r for r in range(rows // 2)]
    temps = [0.7 + 0.05 * r for r in range(rows)]
    params = dict(temps=temps, top_k=[V, 4] * (rows // 2), top_p=[0.8, 1.0, 0.6] * (rows // 3), seeds=seeds,
                  steps=[2**32 + 7 * r for r in range(rows)])  # fmt: skip
    logits, drafts, info, safe = _case(11, rows, 3, V, **params)
    assert len(safe) >= 10, f"the test's own case: only {len(safe)} certain rows"
    usual = "the accept test's seed is seed ^ ACCEPT_SALT (xor, not +: seeds may have bit 62 set)"
    check_verdict(logits, drafts, info, "sampled rows with seeds >= 2^62, top-p and steps past 2^32", usual, safe)


@points(2)
def test_draw_without_all_the_mass():
    """draw_without where x holds all the mass (its residual is all zeros: token 0 by the rule, no NaN), beside
    rows where x is the first or the last token."""
    probs = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.5, 0.25, 0.25], [0.25, 0.25, 0.5]])
    x = torch.tensor([1, 0, 0, 2])
    u = torch.tensor([0.7, 0.3, 0.6, 0.9], dtype=torch.float64)
    got = lab.draw_without(probs.clone(), x.clone(), u.clone())
    want = [0, 0, 2, 1]  # residuals: zeros, zeros, [0, .25, .25] (u * total .15), [.25, .25, 0] (.45)
    assert isinstance(got, torch.Tensor) and got.tolist() == want, (
        f"draw_without(probs {probs.tolist()}, x {x.tolist()}, u {u.tolist()}) = {got!r:.120}, expected {want}: a "
        "residual of zeros has u * total = 0, and the first i with cdf[i] >= 0 is 0 (dividing by the total gives "
        "0 / 0 = NaN)"
    )


@points(2)
def test_bfloat16_logits():
    """The logits in bfloat16 (the model's dtype on a GPU), greedy and sampled rows: probabilities computed
    in float32 (logits.float()), every certain draw the engine's."""
    stub_first()
    rows = 16
    logits, drafts, info, safe = _case(12, rows, 3, V, torch.bfloat16, temps=[0.0, 1.0, 0.8, 1.2] * 4,
                                       seeds=list(range(40, 40 + rows)), steps=[3] * rows)  # fmt: skip
    assert len(safe) >= 6, f"the test's own case: only {len(safe)} certain rows"
    check_verdict(logits, drafts, info, "a batch of bfloat16 logits", "softmax(filter_logits(logits.float(), ...)): "
                  "the probabilities in float32, not in the logits' dtype", safe)  # fmt: skip


@points(2)
def test_random_sampled_batches():
    """Random sampled and greedy batches (sizes, vocabularies, parameters, padding): every certain row is
    the engine's."""
    stub_first()
    _random()


@settings(max_examples=25)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 8), k=st.integers(1, 5), vocab=st.integers(2, 30))
def _random(seed, rows, k, vocab):
    g = torch.Generator().manual_seed(seed)
    temps = [0.0 if t < 0.25 else 0.3 + t for t in torch.rand(rows, generator=g).tolist()]
    params = dict(temps=temps, top_k=torch.randint(1, vocab + 1, (rows,), generator=g).tolist(),
                  top_p=[1.0 if p > 0.5 else 0.5 + p for p in torch.rand(rows, generator=g).tolist()],
                  seeds=torch.randint(0, 2**62, (rows,), generator=g).tolist(),
                  steps=torch.randint(0, 4096, (rows,), generator=g).tolist())  # fmt: skip
    logits, drafts, info, safe = _case(seed, rows, k, vocab, **params)
    if safe:
        check_verdict(logits, drafts, info, f"a random batch [{rows}, {k + 1}, {vocab}]",
                      "see the visible tests: they name the step", safe)  # fmt: skip
