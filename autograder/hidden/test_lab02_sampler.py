"""Lab 02, hidden tests: bfloat16 logits (the engine's dtype on a GPU), very low temperatures on large
logits, and a uniform so close to 1 that it lies above a float32 CDF's total. Each calls the lab
code first, so a stub fails at once with its hint."""

from __future__ import annotations

import torch

from autograder.adapters import lab02 as lab
from autograder.points import points
from autograder.test_lab02_sampler import INF, check_tokens, make_info
from minisgl.engine.sample import uniform

SEED_NEAR_ONE = 10846756  # uniform(seed, step 0) = 1 - 4.3e-8: above the total of many float32 CDFs


@points(4)
def test_bfloat16_logits():
    """Logits in bfloat16 (the model's dtype on a GPU; distinct values, so no ties): scale_logits returns
    float32, and every draw is the one float32 math gives (bfloat16 keeps 3 significant digits)."""
    g = torch.Generator().manual_seed(20)
    rows, vocab = 2048, 256
    grid = torch.linspace(-6, 6, 4000).to(torch.bfloat16).unique()  # distinct bfloat16 values: no ties
    pick = torch.rand(rows, len(grid), generator=g).argsort(dim=-1)[:, :vocab]
    logits = grid[pick]
    temps = torch.tensor([0.7, 1.0, 1.3, 0.9]).repeat(rows // 4)
    scaled = lab.scale_logits(logits.clone(), temps)
    assert isinstance(scaled, torch.Tensor) and scaled.dtype == torch.float32, (
        f"scale_logits of bfloat16 logits returned {getattr(scaled, 'dtype', type(scaled).__name__)}; the contract "
        "says float32: convert with logits.float() before dividing (probabilities in bfloat16 are off by ~0.4%)"
    )
    info = make_info(temps, top_k=[vocab, 50] * (rows // 2), top_p=[1.0, 1.0, 0.9, 0.95] * (rows // 4),
                     seeds=range(rows), steps=[5] * rows, vocab=vocab)  # fmt: skip
    check_tokens(
        lab.sample(logits.clone(), info),
        logits.float(),
        info,
        "LabSampler.sample on bfloat16 logits [2048, 256]",
        "compute in float32: logits.float() before the temperature, the softmax and the cumulative sum (a CDF "
        "summed in bfloat16 drifts by whole percents over a vocabulary)",
    )


@points(3)
def test_cold_temperature_on_large_logits():
    """Temperatures of 0.01 to 0.05 on logits up to 40 (logits / T up to 4,000): no overflow, no NaN, and
    the draws are the engine's (almost always the argmax)."""
    g = torch.Generator().manual_seed(21)
    rows = 64
    logits = torch.randn(rows, 128, generator=g) * 12
    logits[:, 0] = 40.0
    logits[::4, 1] = 39.99  # a near tie: at T = 0.01 token 1 keeps e^-1 of token 0's odds
    temps = torch.tensor([0.01, 0.02, 0.05, 0.01]).repeat(rows // 4)
    info = make_info(temps, top_p=[1.0, 0.9] * (rows // 2), seeds=range(rows), steps=[1] * rows, vocab=128)
    got = lab.sample(logits.clone(), info)
    check_tokens(
        got,
        logits,
        info,
        "LabSampler.sample at temperature 0.01-0.05 on logits up to 40",
        "exp() of logits / T overflows float32 past 88: use softmax (it subtracts the row's maximum first)",
    )


@points(3)
def test_uniform_close_to_one():
    """u = 1 - 4e-8 lies above the total of a float32 CDF summed over 4,096 tokens (0.99999976): the draw
    must scale u by the CDF's total and land on the last token that can be drawn, never past the end (an
    index error) nor on a token the filters removed."""
    u = uniform(torch.tensor([SEED_NEAR_ONE]), torch.tensor([0]))
    assert u.item() > 1 - 1e-7, u.item()
    g = torch.Generator().manual_seed(0)
    for _ in range(5000):  # a row whose float32 CDF ends below u (about 1 in 500 rows)
        row = torch.randn(1, 4096, generator=g) * 0.5
        row[:, -64:] = INF  # the tail of the vocabulary cannot be drawn
        if row.softmax(-1).cumsum(-1)[0, -1].item() < 1 - 1e-7:
            break
    assert row.softmax(-1).cumsum(-1)[0, -1].item() < 1 - 1e-7
    logits = row.repeat(4, 1)
    logits[1, 4000:] = INF
    got = lab.draw(logits.clone(), u.repeat(4))
    last = [int((logits[r] > INF).nonzero().max()) for r in range(4)]
    assert isinstance(got, torch.Tensor) and got.tolist() == last, (
        f"draw with u = {u.item():.10f} (above the float32 CDF's total) returned "
        f"{got.tolist() if isinstance(got, torch.Tensor) else got}, expected the last drawable tokens {last}: "
        "compare cdf with u * cdf[-1], not with u (and never return an index past the end)"
    )
    logits = row.masked_fill(row.isinf(), -10.0).repeat(4, 1)  # top-k removes the tail
    info = make_info([1.0] * 4, top_k=[4096 - 64] * 4, seeds=[SEED_NEAR_ONE] * 4, steps=[0] * 4, vocab=4096)
    check_tokens(
        lab.sample(logits.clone(), info),
        logits,
        info,
        "LabSampler.sample with u = 1 - 4e-8 and top_k = 4032 of 4096",
        "scale u by the CDF's total (cdf[-1]): a float32 CDF ends a little below 1, and u above it would pick the "
        "last token of the vocabulary, which top-k removed",
    )
