"""Lab 15 (the verify step of speculative decoding): the helpers on fixed boundary cases, greedy verdicts
(no drafts, all accepted, the first rejected, a later match, padding), the sampled rule draw by draw on
small vocabularies whose uniforms are known, its distribution by a chi-square test, random greedy batches
against the engine's verifier, the rollback, and the engine with your verifier and n-gram drafting. Run:
``python -m autograder lab15``."""

from __future__ import annotations

import math
import random
from functools import partial

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from autograder.adapters import lab15 as lab
from autograder.checks import chi2_bound, first_token_difference, sampling_info
from autograder.engine_runs import engine_failure
from autograder.points import engine, points
from minisgl.engine.sample import SAMPLERS, SamplingInfo, filter_logits, uniform
from minisgl.speculative.verify import ACCEPT_SALT, DefaultVerifier

V = 6
MARGIN = 1e-4  # a sampled case is used only where u sits this far from every boundary: its token is certain
SAMPLER = SAMPLERS.get("default")()


make_info = partial(sampling_info, vocab=V)  # a batch's parameters as the engine builds them


def rows_of(info: SamplingInfo, rows: list[int]) -> SamplingInfo:
    idx = torch.tensor(rows)
    t = info.temperatures[idx]
    return SamplingInfo(
        t, info.top_k[idx], info.top_p[idx], info.seeds[idx], info.steps[idx],
        bool((t == 0).all()), info.need_top_k, info.need_top_p,
    )  # fmt: skip


def greedy_logits(argmaxes: list[list[int]], vocab: int = V) -> torch.Tensor:
    """``[B, K+1, V]`` logits whose argmax at row r, position j is ``argmaxes[r][j]``."""
    out = torch.zeros(len(argmaxes), len(argmaxes[0]), vocab)
    for r, row in enumerate(argmaxes):
        for j, t in enumerate(row):
            out[r, j, t] = 1.0 + 0.1 * j
    return out


def reference(logits, drafts, info):
    return DefaultVerifier().verify(logits.clone(), drafts.clone(), info, SAMPLER)


def run_lab(logits, drafts, info):
    v = lab.verify(logits.clone(), drafts.clone(), info, SAMPLER)
    b, k1 = logits.shape[:2]
    tokens, accepted = (v[0], v[1]) if isinstance(v, tuple) else (None, None)
    ok = isinstance(tokens, torch.Tensor) and isinstance(accepted, torch.Tensor)
    assert ok and tuple(tokens.shape) == (b, k1) and tuple(accepted.shape) == (b,), (
        f"verify must return Verdict(tokens [B, K+1] = [{b}, {k1}], accepted [B] = [{b}]), got {v!r:.200}"
    )
    return tokens, accepted


def stub_first() -> None:
    """One tiny call, so a stub fails at once with its hint (before a test builds its case)."""
    run_lab(greedy_logits([[1, 2]]), torch.tensor([[1]]), make_info([0.0]))


def output_of(tokens, accepted, r: int) -> list[int]:
    """What the engine outputs for row r: the accepted drafts, then one token."""
    a = int(accepted[r])
    return tokens[r, : a + 1].tolist()


# ---- what the usual mistakes output (for the messages) --------------------------------------------------
def mistaken(logits, drafts, info, mistake: str):
    """The verdict of the engine's rule with one mistake (the keys of ``MISTAKES``)."""
    b, k1, vocab = logits.shape
    k = k1 - 1
    if mistake == "position_major":  # row j * B + r holds position j of row r
        rep = lambda t: t.repeat(k1)  # noqa: E731
        steps = (info.steps[None, :] + torch.arange(k1)[:, None]).reshape(-1)
    else:
        rep = lambda t: t.repeat_interleave(k1)  # noqa: E731
        offsets = torch.zeros(k1, dtype=torch.int64) if mistake == "same_step" else torch.arange(k1)
        steps = (info.steps[:, None] + offsets[None, :]).reshape(-1)
    flat = SamplingInfo(
        rep(info.temperatures), rep(info.top_k), rep(info.top_p), rep(info.seeds), steps,
        info.all_greedy, info.need_top_k, info.need_top_p,
    )  # fmt: skip
    plain = SAMPLER.sample(logits.reshape(b * k1, vocab), flat).view(b, k1)
    real = drafts >= 0
    x = drafts.clamp(min=0)
    greedy = (info.temperatures == 0)[:, None]
    if mistake == "batch_greedy":
        greedy = torch.full_like(greedy, info.all_greedy)
    probs = filter_logits(logits.reshape(b * k1, vocab).float(), flat).softmax(-1).view(b, k1, vocab)[:, :k]
    seeds = flat.seeds.view(b, k1)[:, :k]  # the drafts' positions
    steps = flat.steps.view(b, k1)[:, :k]
    p_x = probs.gather(2, x[..., None])[..., 0]
    salt = 0 if mistake == "unsalted" else ACCEPT_SALT
    lucky = uniform(seeds ^ salt, steps) < p_x.double()
    passes = torch.where(greedy, (x if mistake == "padding" else drafts) == plain[:, :k], lucky)
    ok = passes if mistake == "padding" else real & passes
    accepted = ok.long().sum(1) if mistake == "not_leading" else ok.long().cumprod(1).sum(1)
    kept = probs if mistake == "not_removed" else probs.scatter(2, x[..., None], 0.0)
    cdf = kept.cumsum(2)
    u = uniform(seeds, steps).float()[..., None]
    target = u if mistake == "unscaled" else u * cdf[..., -1:]
    fixed = torch.searchsorted(cdf, target)[..., 0].clamp(max=vocab - 1)
    plain_there = greedy if mistake == "residual_at_bonus" else greedy | ~real
    tokens = plain.clone()
    tokens[:, :k] = torch.where(plain_there, plain[:, :k], fixed)
    limit = accepted[:, None] + (1 if mistake == "rejected_draft_output" else 0)
    tokens[:, :k] = torch.where(torch.arange(k)[None, :] < limit, drafts, tokens[:, :k])
    if mistake == "bonus_from_the_last_logits_row":
        tokens[torch.arange(b), accepted.clamp(max=k)] = plain[:, -1]
    return tokens, accepted


MISTAKES = {
    "rejected_draft_output": "the rejected draft itself output where the target's token goes (off by one in the "
    "accepted prefix: tokens[r, j] = drafts[r, j] only for j < accepted[r])",
    "not_leading": "counting every draft that passes (accept.sum()): only the leading run counts, nothing after "
    "the first rejection",
    "padding": "padding (-1) accepted: clamped to token 0, it passes where the target likes token 0; padding is "
    "never accepted",
    "unsalted": "the accept test on the plain stream uniform(seed, step): it must use the salted stream "
    "uniform(seed ^ ACCEPT_SALT, step), or accept and draw are correlated",
    "not_removed": "the residual drawn from p without removing the draft x (zero p[x] before the cumsum)",
    "unscaled": "u not scaled by the residual's total: compare cdf with u * cdf[-1] (the total is 1 - p(x))",
    "same_step": "every position given the row's own step: position j's step is steps[r] + j",
    "position_major": "rows laid out position-major (repeat): row r * k1 + j must be position j of row r "
    "(repeat_interleave)",
    "batch_greedy": "greedy rows judged by the batch's all_greedy instead of each row's own temperature",
    "residual_at_bonus": "a residual drawn where a padded row has no draft left: that position is the bonus, the "
    "plain draw",
    "bonus_from_the_last_logits_row": "the bonus token taken from the last position's logits whatever was accepted",
}


def check_verdict(logits, drafts, info, what: str, usual: str, rows: list[int] | None = None) -> None:
    """Every row's output (and accepted count) must be the engine verifier's; a failure names the mistake
    whose verdict the student's is. ``rows``: only these rows are compared (the others' uniforms sit near a
    boundary)."""
    tokens, accepted = run_lab(logits, drafts, info)
    want_t, want_a = reference(logits, drafts, info)
    rows = list(range(logits.shape[0])) if rows is None else rows
    bad = [r for r in rows if output_of(tokens, accepted, r) != output_of(want_t, want_a, r)]
    if not bad:
        return
    r = bad[0]
    got, want = output_of(tokens, accepted, r), output_of(want_t, want_a, r)
    message = (
        f"{what}: {len(bad)} of {len(rows)} rows differ from the engine's verdict. Row {r} (drafts "
        f"{drafts[r].tolist()}, temperature {info.temperatures[r].item():g}, seed {int(info.seeds[r])}, step "
        f"{int(info.steps[r])}): expected accepted {int(want_a[r])} and output {want}, got accepted "
        f"{int(accepted[r])} and output {got}"
    )
    for name, text in MISTAKES.items():
        try:
            wt, wa = mistaken(logits, drafts, info, name)
        except Exception:
            continue
        same = all(output_of(tokens, accepted, q) == output_of(wt, wa, q) for q in rows)
        if same and any(output_of(wt, wa, q) != output_of(want_t, want_a, q) for q in rows):
            raise AssertionError(f"{message}\nthis is exactly what {text} gives")
    raise AssertionError(f"{message}\nusual cause: {usual}")


# ---- per_position, leading_accepted, draw_without ------------------------------------------------------
@points(5)
def test_per_position():
    """Row r * k1 + j has row r's parameters and step steps[r] + j; the flags are the batch's."""
    info = make_info([0.0, 0.7, 1.3], top_k=[V, 3, 5], top_p=[1.0, 0.9, 0.5], seeds=[5, 2**40 + 1, 7], steps=[0, 4, 9])
    got = lab.per_position(info, 3)
    assert isinstance(got, SamplingInfo), f"per_position must return a SamplingInfo, got {type(got).__name__}"
    want_steps = [0, 1, 2, 4, 5, 6, 9, 10, 11]
    steps = got.steps.tolist()
    if steps == [0, 0, 0, 4, 4, 4, 9, 9, 9]:
        raise AssertionError(f"steps {steps}, expected {want_steps}: {MISTAKES['same_step']}")
    if steps == [0, 4, 9, 1, 5, 10, 2, 6, 11]:
        raise AssertionError(f"steps {steps}, expected {want_steps}: {MISTAKES['position_major']}")
    assert steps == want_steps, f"steps {steps}, expected {want_steps}: position j of row r is steps[r] + j"
    for name in ("temperatures", "top_k", "top_p", "seeds"):
        mine, row = getattr(got, name).tolist(), getattr(info, name).tolist()
        want = [v for v in row for _ in range(3)]
        assert mine == want, f"{name}: {MISTAKES['position_major']}; got {mine}, expected {want}"
    flags = (got.all_greedy, got.need_top_k, got.need_top_p)
    assert flags == (False, True, True), f"all_greedy, need_top_k, need_top_p = {flags}: keep info's flags"


@points(4)
def test_leading_accepted():
    """The leading run of True per row: all True, none, True after a False (not counted), K = 1, K = 0."""
    cases = [
        ([[True, True, True]], [3], "every draft passes"),
        ([[False, True, True]], [0], "the first is rejected: nothing later counts"),
        ([[True, False, True], [True, True, False]], [1, 2], "a pass after a rejection does not count"),
        ([[True], [False]], [1, 0], "one draft slot"),
    ]
    for rows, want, what in cases:
        got = lab.leading_accepted(torch.tensor(rows))
        ok = isinstance(got, torch.Tensor) and got.dtype == torch.int64 and got.tolist() == want
        hint = (
            MISTAKES["not_leading"] if isinstance(got, torch.Tensor) and got.tolist() == [sum(r) for r in rows] else ""
        )
        assert ok, f"leading_accepted({rows}) ({what}): expected {want} int64, got {got!r:.80}. {hint}"
    empty = lab.leading_accepted(torch.zeros(2, 0, dtype=torch.bool))
    assert empty.tolist() == [0, 0], f"no draft slots (K = 0): expected [0, 0], got {empty!r:.80}"


@points(6)
def test_draw_without():
    """Probabilities that are exact in float32 (multiples of 1/8), uniforms far from every boundary: the
    first i with cdf[i] >= u * cdf[-1], cdf without x."""
    probs = torch.tensor([[0.125, 0.375, 0.25, 0.25]] * 6 + [[0.25, 0.5, 0.25, 0.0]] * 2)
    x = torch.tensor([1, 1, 0, 3, 3, 2, 1, 1])
    u = torch.tensor([0.1, 0.5, 0.95, 0.3, 0.99, 0.6, 0.5, 0.5 + 1e-9], dtype=torch.float64)
    # residual rows: [.125, 0, .25, .25] (total .625) twice, [0, .375, .25, .25] (.875), [.125, .375, .25, 0]
    # (.75) twice, [.125, .375, 0, .25] (.75); the last, [.25, 0, .25, 0] (.5) with u * total = .25 = cdf[0]
    # exactly: the first i with cdf[i] >= .25 is 0 (cdf[i] > .25 would give 2); the same row once more with
    # u = 0.5 + 1e-9, which float32 rounds to 0.5: token 0 again (in float64, u * total > .25 would give 2)
    want = [0, 2, 3, 1, 2, 1, 0, 0]
    got = lab.draw_without(probs.clone(), x.clone(), u.clone())
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int64, f"expected int64 tokens, got {got!r:.80}"
    if got.tolist() == want:
        return
    plain = torch.searchsorted(probs.cumsum(1), u.float()[:, None])[:, 0].tolist()
    unscaled = torch.searchsorted(probs.scatter(1, x[:, None], 0.0).cumsum(1), u.float()[:, None])[:, 0]
    hint = "the first i with cdf[i] >= u * cdf[-1], cdf the cumulative sum with p[x] = 0"
    if got.tolist() == plain:
        hint = MISTAKES["not_removed"]
    elif got.tolist() == unscaled.clamp(max=3).tolist():
        hint = MISTAKES["unscaled"]
    elif got.tolist()[:-2] == want[:-2] and got.tolist()[-2] == want[-2]:
        hint = (
            "u is cast to float32 (the probabilities' dtype) before it is scaled: in the last row u = 0.5 + 1e-9 is "
            "0.5 in float32, so u * total is exactly cdf[0] = .25 and the token is 0; in float64 it is past it"
        )
    elif got.tolist()[:-2] == want[:-2]:
        hint = "row 6's u * total is exactly cdf[0]: the first i with cdf[i] >= u * total is 0 (>=, not >)"
    raise AssertionError(
        f"draw_without(probs {probs[0].tolist()}, x {x.tolist()}, u {u.tolist()}): expected {want}, got "
        f"{got.tolist()}: {hint}"
    )


# ---- greedy verdicts -------------------------------------------------------------------------------------
GREEDY_CASES = {  # name: (argmaxes at the k + 1 positions, drafts, accepted, what the case is)
    "no_drafts": ([2, 3, 4, 5], [-1, -1, -1], 0, "a row with no drafts: the plain decode token"),
    "all_accepted_bonus": ([1, 2, 3, 4], [1, 2, 3], 3, "every draft accepted: the bonus token from the last position"),
    "first_rejected": ([1, 2, 3, 4], [5, 2, 3], 0, "the first draft rejected: the target's token at position 0"),
    "later_match_after_rejection": (
        [1, 2, 3, 4], [1, 5, 3], 1, "a draft that matches after a rejection must not count",
    ),
    "padding_where_target_likes_token_0": (
        [1, 0, 0, 0], [1, -1, -1], 1, "one draft, padded: -1 is never accepted, even where the argmax is token 0",
    ),
    "last_rejected": ([1, 2, 3, 4], [1, 2, 5], 2, "the last draft rejected: two drafts, then the target's token"),
}  # fmt: skip


@points(2)
@pytest.mark.parametrize("case", list(GREEDY_CASES))
def test_greedy_verdict(case):
    """Greedy rows: draft j is accepted iff it is the argmax of position j, only the leading run counts,
    then the argmax after it (a correction or the bonus)."""
    argmax, drafts, accepted, what = GREEDY_CASES[case]
    logits, d = greedy_logits([argmax]), torch.tensor([drafts])
    info = make_info([0.0], steps=[3])
    tokens, got_a = run_lab(logits, d, info)
    want = argmax[: accepted + 1]
    got = output_of(tokens, got_a, 0) if 0 <= int(got_a[0]) < logits.shape[1] else None
    if int(got_a[0]) == accepted and got == want:
        return
    message = (
        f"{what}: argmaxes {argmax}, drafts {drafts}: expected accepted {accepted} and output {want}, got "
        f"accepted {int(got_a[0])} and tokens {tokens[0].tolist()}"
    )
    for name in ("not_leading", "padding", "rejected_draft_output", "bonus_from_the_last_logits_row"):
        wt, wa = mistaken(logits, d, info, name)
        if int(wa[0]) == int(got_a[0]) and (got is None or output_of(wt, wa, 0) == got):
            if (int(wa[0]), output_of(wt, wa, 0)) != (accepted, want):
                raise AssertionError(f"{message}\nthis is exactly what {MISTAKES[name]} gives")
    hint = "the token after the accepted drafts is the target's argmax there: the correction, or the bonus token"
    raise AssertionError(f"{message}\nusual cause: {hint}")


@points(4)
def test_greedy_rows_independent():
    """A batch of greedy rows with different outcomes (all, some, none accepted, padding) gives each row
    what it gives alone, and the same in the batch reversed."""
    argmaxes = [[1, 2, 3, 4], [4, 4, 4, 4], [0, 1, 2, 3], [5, 0, 0, 0], [2, 2, 1, 1]]
    drafts = torch.tensor([[1, 2, 3], [4, 0, -1], [1, 1, 2], [5, -1, -1], [2, 2, 1]])
    logits, info = greedy_logits(argmaxes), make_info([0.0] * 5, steps=[0, 5, 9, 2, 7])
    check_verdict(logits, drafts, info, "a batch of 5 greedy rows", "each row is judged on its own logits and drafts")
    flip = [4, 3, 2, 1, 0]
    check_verdict(logits[flip], drafts[flip], rows_of(info, flip), "the same batch reversed",
                  "a row's verdict depends only on its own logits, drafts and parameters")  # fmt: skip


# ---- sampled rows, draw by draw ---------------------------------------------------------------------------
def sampled_case(seed: int, rows: int, k: int, vocab: int, temps=None, top_k=None):
    """Random logits and drafts (some likely, some unlikely, some padding) for sampled rows, seeds and
    steps that vary; returns (logits, drafts, info, rows whose uniforms sit at least MARGIN from every
    boundary of the rule)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, k + 1, vocab, generator=g) * 1.5
    best = logits.argmax(-1)[:, :k]
    guess = torch.randint(0, vocab, (rows, k), generator=g)
    drafts = torch.where(torch.rand(rows, k, generator=g) < 0.6, best, guess)
    for r in range(2, rows, 3):  # every third row is padded after a random number of drafts
        drafts[r, int(torch.randint(0, k, (1,), generator=g)) :] = -1
    temps = temps or [float(t) for t in (torch.rand(rows, generator=g) * 1.2 + 0.4)]
    info = make_info(temps, top_k=top_k, seeds=torch.randint(0, 2**40, (rows,), generator=g).tolist(),
                     steps=torch.randint(0, 500, (rows,), generator=g).tolist(), vocab=vocab)  # fmt: skip
    return logits, drafts, info, safe_rows(logits, drafts, info)


def safe_rows(logits, drafts, info) -> list[int]:
    """Rows whose accept uniforms are at least MARGIN from p(x), and whose draws' u * total are at least
    MARGIN from every CDF value (plain and residual), in float64 over the engine's filtered logits."""
    b, k1, vocab = logits.shape
    flat = SamplingInfo(
        info.temperatures.repeat_interleave(k1), info.top_k.repeat_interleave(k1), info.top_p.repeat_interleave(k1),
        info.seeds.repeat_interleave(k1), (info.steps[:, None] + torch.arange(k1)).reshape(-1),
        info.all_greedy, info.need_top_k, info.need_top_p,
    )  # fmt: skip
    p = filter_logits(logits.reshape(b * k1, vocab).float(), flat).double().softmax(-1).view(b, k1, vocab)
    seeds, steps = flat.seeds.view(b, k1), flat.steps.view(b, k1)
    ua, ud = uniform(seeds ^ ACCEPT_SALT, steps), uniform(seeds, steps)
    out = []
    for r in range(b):
        ok = True
        for j in range(k1):
            x = int(drafts[r, j]) if j < k1 - 1 else -1
            cdfs = [p[r, j].cumsum(0)]
            if x >= 0:
                ok &= abs(ua[r, j].item() - p[r, j, x].item()) > MARGIN
                cdfs.append(p[r, j].index_fill(0, torch.tensor([x]), 0.0).cumsum(0))
            for cdf in cdfs:
                ok &= bool(((cdf - ud[r, j].item() * cdf[-1]).abs() > MARGIN).all())
        if ok:
            out.append(r)
    return out


def float64_boundary_rows(want: int = 4):
    """Sampled rows (one draft, token 0, at step 3) whose p(x) is exactly the float32 rounding of their accept
    uniform, rounded up: u < p(x) in float64, u == p(x) once u is cast to float32. Found by scanning the
    float32 logits next to log(f / (1 - f)) through the engine's own filter_logits and softmax.
    Returns (logits [rows, 2, V], info, [(u, p(x))])."""
    rows, cases = [], []
    for seed in range(400):
        u = float(uniform(torch.tensor([seed ^ ACCEPT_SALT]), torch.tensor([3]))[0])
        f = float(torch.tensor(u, dtype=torch.float32))
        if not (f > u and 0.1 < u < 0.9):
            continue
        around = (torch.tensor(math.log(f / (1 - f)), dtype=torch.float32).view(torch.int32)
                  + torch.arange(-2000, 2000, dtype=torch.int32)).view(torch.float32)  # fmt: skip
        pos0 = torch.full((len(around), V), float("-inf"))
        pos0[:, 0], pos0[:, 1] = around, 0.0
        p = filter_logits(pos0, make_info([1.0] * len(around))).softmax(-1)[:, 0]
        hit = (p == f).nonzero().flatten()
        if len(hit):
            rows.append((seed, pos0[int(hit[0])]))
            cases.append((u, f))
        if len(rows) == want:
            break
    assert len(rows) == want, f"the test's own case: only {len(rows)} float64 boundary rows found"
    logits = torch.zeros(want, 2, V)
    logits[:, 0] = torch.stack([r[1] for r in rows])
    info = make_info([1.0] * want, seeds=[r[0] for r in rows], steps=[3] * want)
    return logits, info, cases


@points(7)
def test_sampled_accept_test():
    """Sampled rows on 6 tokens: draft x at position j passes iff uniform(seed ^ ACCEPT_SALT, steps + j) <
    p(x); a draft that top-k removed (p = 0) never passes, the only finite token (p = 1) always does; and
    the comparison is in float64 (rows whose p(x) is the float32 rounding of their uniform: accepted)."""
    stub_first()
    logits, drafts, info, rows = sampled_case(1, 48, 3, V)
    assert len(rows) >= 24, f"the test's own case: only {len(rows)} rows are far from a boundary"
    usual = "accept x iff uniform(seed ^ ACCEPT_SALT, step) < p(x), p = softmax(filter_logits(...)) at that position"
    check_verdict(logits, drafts, info, "48 sampled rows (temperatures 0.4-1.6)", usual, rows)
    edge = torch.randn(4, 3, V, generator=torch.Generator().manual_seed(2))
    edge[0:2, 0, 1:] = float("-inf")  # position 0 of rows 0-1: only token 0 is finite, p(0) = 1
    d = torch.tensor([[0, 1], [0, -1], [5, 4], [5, 5]])
    edge[2:, 0, 5] = -50.0  # rows 2-3: token 5 is the least likely: top-k 5 drops it (p = 0)
    info = make_info([1.0] * 4, top_k=[V, V, 5, 5], seeds=[3, 4, 5, 6], steps=[10, 11, 12, 13])
    tokens, accepted = run_lab(edge, d, info)
    assert accepted[:2].tolist()[0] >= 1 and int(accepted[1]) == 1, (
        f"a draft whose probability is 1 (the only finite logit) is always accepted: accepted {accepted.tolist()}"
    )
    assert accepted[2:].tolist() == [0, 0] and 5 not in tokens[2:, 0].tolist(), (
        f"a draft that top-k removed (probability 0) is never accepted, and the residual never draws it: accepted "
        f"{accepted[2:].tolist()}, tokens at position 0 {tokens[2:, 0].tolist()}"
    )
    # the precision: u and p(x) closer than float32 rounds, so only a float64 comparison accepts
    logits, info, cases = float64_boundary_rows()
    drafts = torch.zeros(len(cases), 1, dtype=torch.int64)
    _, want_a = reference(logits, drafts, info)
    assert want_a.tolist() == [1] * len(cases), f"the test's own case: the reference accepted {want_a.tolist()}"
    u, p = cases[0]
    check_verdict(
        logits,
        drafts,
        info,
        f"{len(cases)} sampled rows whose draft's p(x) is the float32 rounding of the accept uniform",
        f"the accept test compares in float64: in row 0 u = {u!r} and p(x) = {p!r} (a float32 value) are closer "
        "than float32 rounds, and u < p(x) holds in float64; a u cast to float32 becomes p(x) and fails u < p(x). "
        "Compare the float64 uniform with p(x) promoted to float64",
    )


@points(7)
def test_sampled_residual():
    """After a rejection the token is draw_without(p, x, uniform(seed, step)): on 5 tokens, drafts that are
    each row's most likely token (rejected often), every draw compared where it is certain."""
    stub_first()
    g = torch.Generator().manual_seed(3)
    rows, vocab = 64, 5
    logits = torch.randn(rows, 2, vocab, generator=g) * 1.2
    drafts = logits[:, :1].argmax(-1)
    info = make_info([1.0] * rows, seeds=list(range(100, 100 + rows)), steps=[7] * rows, vocab=vocab)
    safe = safe_rows(logits, drafts, info)
    _, want_a = reference(logits, drafts, info)
    rejected = [r for r in safe if int(want_a[r]) == 0]
    assert len(rejected) >= 10, f"the test's own case: only {len(rejected)} certain rejections"
    check_verdict(logits, drafts, info, "64 sampled rows on 5 tokens, one draft each (the most likely token)",
                  "after a rejection draw from p with x removed, u = uniform(seed, step) (the plain draw's own "
                  "number), scaled by the residual's total", safe)  # fmt: skip


@points(5)
def test_mixed_batch():
    """Greedy and sampled rows in one batch, with padding: each row follows its own rule (the greedy rows
    their argmax, whatever the others do) and gives what it gives alone."""
    stub_first()
    logits, drafts, info, rows = sampled_case(4, 12, 4, 7, temps=[0.0, 0.8, 1.0, 0.0, 1.3, 0.6] * 2)
    assert len(rows) >= 6, f"the test's own case: only {len(rows)} rows are far from a boundary"
    check_verdict(logits, drafts, info, "a batch of greedy and sampled rows (temperatures 0, 0.8, 1, 0, 1.3, 0.6)",
                  "a greedy row (its own temperature 0) accepts a draft iff it is the argmax", rows)  # fmt: skip
    tokens, accepted = run_lab(logits, drafts, info)
    for r in rows[:6]:
        alone_t, alone_a = run_lab(logits[r : r + 1], drafts[r : r + 1], rows_of(info, [r]))
        assert output_of(alone_t, alone_a, 0) == output_of(tokens, accepted, r), (
            f"row {r} gives {output_of(alone_t, alone_a, 0)} alone and {output_of(tokens, accepted, r)} in the "
            "batch: a row's verdict depends only on its own logits, drafts, seed and step"
        )


@points(5)
def test_sampled_distribution():
    """Chi-square over the joint outcome of two positions, 6,000 seeds, significance 0.001: the token at
    position 0 follows p0 (draft x0: accepted with p0(x0), else the residual), and given x0 accepted, the
    token at position 1 follows p1. Any verifier of the right distribution passes."""
    stub_first()
    g = torch.Generator().manual_seed(0)
    p0, p1 = torch.rand(V, generator=g) + 0.05, torch.rand(V, generator=g) + 0.05
    p0, p1 = p0 / p0.sum(), p1 / p1.sum()
    x0, x1 = int(p0.argmax()), int(p1.argmin())
    n = 6000
    logits = torch.stack([p0.log(), p1.log(), torch.zeros(V)])[None].repeat(n, 1, 1)
    info = make_info([1.0] * n, seeds=range(n), steps=[3] * n)
    tokens, accepted = run_lab(logits, torch.tensor([[x0, x1]] * n), info)
    expected: dict[tuple, float] = {(y,): float(p0[y]) for y in range(V) if y != x0}
    expected.update({(x0, z): float(p0[x0] * p1[z]) for z in range(V)})
    observed: dict[tuple, int] = {}
    for a, row in zip(accepted.tolist(), tokens.tolist()):
        key = tuple(row[: min(a, 1) + 1])
        observed[key] = observed.get(key, 0) + 1
    stat = sum((observed.get(k, 0) - n * p) ** 2 / (n * p) for k, p in expected.items())
    stat += sum(c for k, c in observed.items() if k not in expected) * n  # impossible outcomes fail at once
    bound = chi2_bound(len(expected) - 1)
    first = {y: sum(c for k, c in observed.items() if k[0] == y) / n for y in range(V)}
    assert stat < bound, (
        f"chi-square {stat:.1f} >= {bound:.1f}: the outputs do not follow the target distribution. Position 0: "
        f"expected {[round(float(v), 3) for v in p0]}, got {[round(first[y], 3) for y in range(V)]} (draft "
        f"{x0}). Usual causes: {MISTAKES['unsalted']}; {MISTAKES['not_removed']}"
    )


@points(2)
def test_seeded_repeatable():
    """The same batch twice gives the same verdict (draws are counter-based on seed and step)."""
    stub_first()
    logits, drafts, info, _ = sampled_case(5, 16, 3, V)
    a = run_lab(logits, drafts, info)
    b = run_lab(logits, drafts, info)
    assert all(output_of(*a, r) == output_of(*b, r) for r in range(16)), (
        "two calls on the same inputs gave different outputs: use uniform(seeds, steps), never a random generator"
    )


@points(6)
def test_greedy_random():
    """Random greedy batches (sizes, draft counts, padding, drafts right and wrong): every row's verdict is
    the engine's."""
    stub_first()
    _greedy_random()


@settings(max_examples=40)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 9), k=st.integers(1, 6), vocab=st.integers(2, 40))
def _greedy_random(seed, rows, k, vocab):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, k + 1, vocab, generator=g)
    best = logits.argmax(-1)[:, :k]
    drafts = torch.where(torch.rand(rows, k, generator=g) < 0.7, best, torch.randint(0, vocab, (rows, k), generator=g))
    for r in range(rows):
        drafted = int(torch.randint(0, k + 1, (1,), generator=g))
        drafts[r, drafted:] = -1
        if r % 2 and drafted < k:  # the target likes token 0 where the padding is: -1 clamped to 0 would pass
            logits[r, drafted:, 0] = 9.0
    info = make_info([0.0] * rows, steps=torch.randint(0, 99, (rows,), generator=g).tolist(), vocab=vocab)
    check_verdict(logits, drafts, info, f"a random greedy batch [{rows}, {k + 1}, {vocab}]",
                  "see the fixed greedy tests: they name the case")  # fmt: skip


# ---- the rollback ----------------------------------------------------------------------------------------
@points(5)
def test_rollback_values():
    """(cached_len, device_len) = (n + accepted, n + accepted + 1): none accepted, some, all, no drafts, n = 1."""
    cases = [(10, 4, 0), (10, 4, 2), (10, 4, 4), (7, 0, 0), (1, 3, 3), (1, 1, 0)]
    for n, drafted, accepted in cases:
        got = lab.rollback(n, drafted, accepted)
        want = (n + accepted, n + accepted + 1)
        if tuple(got) == want:
            continue
        hint = "the KV of n + accepted tokens is valid; the token pool holds one more (the correction or bonus)"
        if tuple(got) == (n + drafted, n + drafted + 1) and drafted != accepted:
            hint = "not rolled back: the rejected drafts' positions are still counted; roll back to n + accepted"
        elif tuple(got) == (n + accepted + 1, n + accepted + 1):
            hint = (
                "the correction counted as cached: its KV is not computed yet (the pass saw the rejected draft there)"
            )
        elif tuple(got) == (n + accepted, n + accepted + 2):
            hint = "the bonus counted twice in device_len: the pool holds n + accepted + 1 tokens"
        raise AssertionError(
            f"rollback(n={n}, drafted={drafted}, accepted={accepted}) = {tuple(got)}, expected {want}: {hint}"
        )


@points(3)
def test_rollback_input_checks():
    """ValueError for n = 0, accepted = -1 and accepted = drafted + 1, each with the other arguments valid;
    accepted == drafted (every draft accepted) is valid."""
    try:
        got = tuple(lab.rollback(5, 2, 2))
    except ValueError as e:
        raise AssertionError(f"rollback(5, 2, 2) raised ValueError({e}): accepted == drafted (every draft accepted) "
                             "is a valid step, (7, 8)") from None  # fmt: skip
    assert got == (7, 8), f"rollback(5, 2, 2) = {got}, expected (7, 8): every draft accepted"
    for args, why in [((0, 2, 1), "n = 0"), ((5, 2, -1), "accepted < 0"), ((5, 2, 3), "accepted > drafted")]:
        with pytest.raises(ValueError):
            lab.rollback(*args)
            raise AssertionError(f"rollback{args}: expected ValueError ({why}), got no error: each argument is checked")


class _Syncs(TorchDispatchMode):
    """Records the ops that copy a device value to the host."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "_local_scalar_dense" in str(func) or "nonzero" in str(func):
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@points(2)
def test_no_host_sync():
    """verify on a mixed batch reads nothing back to the host (no .item(), bool(tensor), int(tensor),
    nonzero, .tolist())."""
    logits, drafts, info, _ = sampled_case(6, 8, 3, V, temps=[0.0, 1.0] * 4)
    lab.verify(logits.clone(), drafts.clone(), info, SAMPLER)  # a stub fails here, outside the recording
    calls: list[str] = []
    tolist = torch.Tensor.tolist

    def counted(self, *a, **kw):
        calls.append("Tensor.tolist")
        return tolist(self, *a, **kw)

    torch.Tensor.tolist = counted
    try:
        with _Syncs() as mode:
            lab.verify(logits.clone(), drafts.clone(), info, SAMPLER)
    finally:
        torch.Tensor.tolist = tolist
    seen = mode.seen + calls
    assert not seen, (
        f"verify read tensors back to the host: {sorted(set(seen))}. On a GPU each is a synchronisation inside the "
        "engine's launch; keep every decision a tensor op (torch.where, cumprod, gather), branch only on "
        "info.all_greedy"
    )


# ---- the engine with your verifier ----------------------------------------------------------------------
MAX_NEW = 16
REFS: dict[tuple[int, ...], list[int]] = {}


def _prompts() -> list[list[int]]:
    rng = random.Random(15)
    r = lambda n: [rng.randrange(3, 49152) for _ in range(n)]  # noqa: E731
    # [7] * 20 and [5] * 30: the tiny Llama's greedy answers repeat a token, so n-gram drafts are accepted
    return [[7] * 20, [5] * 30, r(4) * 5, r(9), r(3) * 4 + r(2)]


def _oracle_drafter():
    from minisgl.speculative import Drafter

    class Oracle(Drafter):
        """The plain engine's greedy continuation, some tokens wrong (a pattern in the position): steps accept
        all, some or none of their drafts, so the rollback matters."""

        def propose(self, req, k):
            n = len(req.output_ids)
            good = REFS.get(tuple(req.input_ids), [])[n : n + k]
            return [t if (3 * n + 5 * j) % 7 else (t + 1) % 49152 for j, t in enumerate(good)]

    return Oracle


def _generate(model, drafter: str | None, components: dict, params_list, max_steps: int = 400):
    """Drive the scheduler step by step (a wrong rollback can leave a request that never decodes again:
    the run stops after ``max_steps`` instead of hanging). Returns (tokens per request, spec stats)."""
    from minisgl import LLM

    kw = dict(speculative_algorithm=drafter, debug_checks=True) if drafter else {}
    llm = LLM(str(model), device="cpu", dtype="float32", attention_backend="torch", components=components, **kw)
    try:
        sched, reqs = llm.scheduler, []
        for uid, (prompt, params) in enumerate(params_list):
            reqs.append(sched.add_request(1000 + uid, prompt, params))
        steps = 0
        rollback = "roll back to (cached_len, device_len) = (n + accepted, n + accepted + 1)"
        while sched.has_work:
            try:
                sched.step()
            except AssertionError as e:  # the request's invariant cached_len < end <= device_len, or memory checks
                raise AssertionError(f"the scheduler's checks failed ({e}): after a verify step, {rollback}") from None
            steps += 1
            if steps > max_steps:
                stuck = [(len(r.output_ids), r.device_len - r.prompt_len) for r in reqs]
                raise AssertionError(
                    f"no progress in {max_steps} steps: {rollback}. A request whose device_len is not prompt + "
                    f"outputs never drafts or decodes again; (outputs, device_len - prompt_len) per request: {stuck}"
                )
        sched.check_memory()
        return [list(r.output_ids) for r in reqs], spec.stats if (spec := sched.feature("speculative")) else None
    finally:
        llm.shutdown()


@points(10, timeout=180)
@engine
def test_engine_greedy_tokens(tiny_llama):
    """The engine with components={"verifier": "lab15"} and n-gram drafting (prompts whose answers repeat), then
    with a drafter that is partly right (all, some or none of a step's drafts accepted): greedy tokens
    equal the plain engine's, token for token, and the scheduler's memory checks pass after every step."""
    from minisgl import SamplingParams
    from minisgl.speculative import DRAFTERS

    cls = lab.verifier_class()
    cls().rollback(5, 2, 1)  # a stub fails here, before any engine is built
    run_lab(greedy_logits([[1, 2]]), torch.tensor([[1]]), make_info([0.0]))
    prompts = _prompts()
    greedy = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    plain, _ = _generate(tiny_llama, None, {}, [(p, greedy) for p in prompts])
    REFS.clear()
    REFS.update({tuple(p): r for p, r in zip(prompts, plain)})
    with lab.registered_verifier(cls) as components, DRAFTERS.registered("lab15-oracle", _oracle_drafter()):
        for drafter in ("NGRAM", "lab15-oracle"):
            with engine_failure(f"your verifier ({drafter} drafts)"):
                got, stats = _generate(tiny_llama, drafter, components, [(p, greedy) for p in prompts])
            diff = first_token_difference(got, plain)
            assert diff is None, (
                f"with your verifier and {drafter} drafts the greedy tokens differ from the plain engine's: {diff}. "
                "Greedy rows accept a draft iff it is the argmax; then the argmax (the correction or the bonus); "
                "and the rollback leaves (n + accepted, n + accepted + 1)"
            )
            assert stats is not None and stats.accepted_tokens > 0, f"{drafter}: no draft was accepted: {stats}"


@points(7, timeout=180)
@engine
def test_engine_sampled_tokens(tiny_llama):
    """Seeded sampled requests (temperature, top-k, top-p) and a greedy one, with a partly-right drafter:
    the engine with your verifier gives the reference verifier's tokens under the same seeds."""
    from minisgl import SamplingParams
    from minisgl.speculative import DRAFTERS

    cls = lab.verifier_class()
    logits, drafts, info, _ = sampled_case(7, 2, 2, V)
    run_lab(logits, drafts, info)  # a stub fails here, before any engine is built
    prompts = _prompts()
    greedy = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    plain, _ = _generate(tiny_llama, None, {}, [(p, greedy) for p in prompts])
    REFS.clear()
    REFS.update({tuple(p): r for p, r in zip(prompts, plain)})
    kw = dict(max_tokens=MAX_NEW, ignore_eos=True)
    params = [
        SamplingParams(temperature=0.6, top_k=3, seed=1, **kw),
        SamplingParams(temperature=0.8, top_k=5, top_p=0.9, seed=2**40 + 3, **kw),
        SamplingParams(temperature=0.5, top_k=2, seed=7, **kw),
        SamplingParams(temperature=0.0, **kw),
        SamplingParams(temperature=1.0, top_k=4, seed=11, **kw),
    ]
    jobs = list(zip(prompts, params))
    with DRAFTERS.registered("lab15-oracle", _oracle_drafter()):
        want, ref_stats = _generate(tiny_llama, "lab15-oracle", {}, jobs)
        with lab.registered_verifier(cls) as components, engine_failure("your verifier (sampled requests)"):
            got, _ = _generate(tiny_llama, "lab15-oracle", components, jobs)
    assert 0 < ref_stats.accepted_tokens < ref_stats.draft_tokens, f"the test's own case: {ref_stats}"
    diff = first_token_difference(got, want)
    assert diff is None, (
        f"with your verifier the sampled tokens differ from the reference verifier's under the same seeds: {diff} "
        "(requests: 0 = T 0.6 top-k 3; 1 = T 0.8 top-k 5 top-p 0.9; 2 = T 0.5 top-k 2; 3 = greedy; 4 = T 1 top-k 4). "
        f"Usual causes: {MISTAKES['unsalted']}; {MISTAKES['not_removed']}; {MISTAKES['same_step']}"
    )
