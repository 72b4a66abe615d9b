"""Lab 02 (the sampler): fixed cases against the engine's ``filter_logits`` and draw rule, random
batches, statistical tests (total variation distance over thousands of seeds), batch invariance, and
the engine sampling with your ``LabSampler``. Run: ``python -m autograder lab02``."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autograder.adapters import lab02 as lab
from autograder.checks import Pitfall, check_tensor, first_token_difference, sampling_info
from autograder.points import engine, points
from minisgl.engine.sample import SamplingInfo, filter_logits, uniform

V = 64
INF = float("-inf")
TOL = 1e-5  # how far u * total may sit outside the drawn token's float64 CDF interval (float32 rounding)
TVD_LIMIT = 0.04  # a correct sampler's tokens over 20,000 seeds: about 0.015 from the exact distribution


make_info = partial(sampling_info, vocab=V)  # a batch's parameters as the engine builds them


def with_(info: SamplingInfo, **changes) -> SamplingInfo:
    """A copy of ``info`` with some per-row tensors replaced (a replaced top_k counts as needed)."""
    fields = {name: getattr(info, name) for name in ("temperatures", "top_k", "top_p", "seeds", "steps")}
    fields.update(changes)
    return SamplingInfo(
        **fields,
        all_greedy=bool((fields["temperatures"] == 0).all()),
        need_top_k=info.need_top_k or "top_k" in changes,
        need_top_p=bool((fields["top_p"] < 1.0).any()),
    )


def rows_of(info: SamplingInfo, rows) -> SamplingInfo:
    """The parameters of some rows of ``info`` (an index tensor or a slice)."""
    return with_(info, **{k: getattr(info, k)[rows] for k in ("temperatures", "top_k", "top_p", "seeds", "steps")})


def row_text(info: SamplingInfo, r: int) -> str:
    return (
        f"temperature {info.temperatures[r].item():g}, top_k {int(info.top_k[r])}, top_p {info.top_p[r].item():g}, "
        f"seed {int(info.seeds[r])}, step {int(info.steps[r])}"
    )


# ---- the reference draw -----------------------------------------------------------------------------
def reference(logits: torch.Tensor, info: SamplingInfo, u: torch.Tensor | None = None):
    """The engine's rule, its CDF in float64 over the engine's filtered float32 logits: (tokens,
    probabilities, cdf, u * total). ``u``: each row's uniform, ``uniform(info.seeds, info.steps)``
    unless given."""
    probs = filter_logits(logits.float(), info).double().softmax(dim=-1)
    cdf = probs.cumsum(dim=-1)
    target = (uniform(info.seeds, info.steps) if u is None else u.double()) * cdf[:, -1]
    tokens = torch.searchsorted(cdf, target[:, None]).squeeze(1).clamp(max=logits.shape[-1] - 1)
    tokens = torch.where(info.temperatures > 0, tokens, logits.float().argmax(dim=-1))
    return tokens, probs, cdf, target


def bad_rows(got: torch.Tensor, logits: torch.Tensor, info: SamplingInfo, u=None) -> tuple[list[int], torch.Tensor]:
    """Rows whose token breaks the rule (beyond float32 rounding), and the reference tokens."""
    want, probs, cdf, target = reference(logits, info, u)
    bad = []
    for r in range(len(want)):
        t = int(got[r])
        if t == int(want[r]):
            continue
        if info.temperatures[r] > 0 and 0 <= t < logits.shape[-1] and probs[r, t] > 0:
            lo = cdf[r, t - 1].item() if t > 0 else 0.0
            if lo - TOL <= target[r].item() <= cdf[r, t].item() + TOL:
                continue  # u * total sits on the boundary: a rounding of float32 math in another order
        bad.append(r)
    return bad, want


def check_tokens(got, logits: torch.Tensor, info: SamplingInfo, what: str, usual: str, pitfalls=(), u=None) -> None:
    """Every row's token must be the engine rule's (greedy: the argmax). ``pitfalls``: (mistake,
    tokens-it-gives function) pairs; a failure names the one the student's tokens match. ``u``: the
    uniforms the draw was given, when not ``uniform(info.seeds, info.steps)``."""
    n = logits.shape[0]
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what}: expected a tensor of {n} token ids, got {type(got).__name__}")
    if got.shape != (n,) or got.dtype != torch.int64:
        raise AssertionError(f"{what}: expected shape [{n}] int64, got {list(got.shape)} {got.dtype}")
    bad, want = bad_rows(got, logits, info, u)
    if not bad:
        return
    _, probs, cdf, target = reference(logits, info, u)
    r, t = bad[0], int(got[bad[0]])
    w = int(want[r])
    if info.temperatures[r] == 0:
        detail = f"it is a greedy row (temperature 0): expected the argmax {w}, got {t}"
    else:
        inside = 0 <= t < logits.shape[-1]
        p_t = probs[r, t].item() if inside else float("nan")
        filtered = " (a token the filters removed, or a -inf logit: probability 0)" if inside and p_t == 0 else ""
        detail = (
            f"u * total = {target[r].item():.6f} falls in token {w}'s CDF interval "
            f"[{cdf[r, w - 1].item() if w else 0:.6f}, {cdf[r, w].item():.6f}]; you returned token {t}{filtered}"
            + (f" whose probability is {p_t:.4g}" if inside and p_t > 0 else "")
        )
    message = f"{what}: {len(bad)} of {n} rows differ from the engine's draw. Row {r} ({row_text(info, r)}): {detail}"
    for mistake, answer in pitfalls:
        try:
            wrong = answer()
        except Exception:
            continue
        if isinstance(wrong, torch.Tensor) and wrong.shape == got.shape and (wrong != got).float().mean() <= 0.02:
            raise AssertionError(f"{message}\nthis is exactly what {mistake} gives")
    raise AssertionError(f"{message}\nusual cause: {usual}")


# ---- wrong answers the messages recognise -----------------------------------------------------------
def ref_tokens(logits: torch.Tensor, info: SamplingInfo) -> torch.Tensor:
    return reference(logits, info)[0]


def _sorted_mask(logits: torch.Tensor, keep_sorted) -> torch.Tensor:
    values, indices = logits.sort(dim=-1, descending=True)
    keep = torch.zeros_like(values, dtype=torch.bool).scatter_(1, indices, keep_sorted(values))
    return logits.masked_fill(~keep, INF)


def top_p_without_crossing(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    return _sorted_mask(logits, lambda o: (o.softmax(-1).cumsum(-1) < top_p[:, None]) | (top_p[:, None] >= 1))


def masked_by_arithmetic(logits: torch.Tensor, filtered: torch.Tensor) -> torch.Tensor:
    """``logits * keep + (1 - keep) * -inf``: 0 * -inf is NaN, so every kept logit turns NaN."""
    keep = (~filtered.isinf()).float()
    return logits * keep + (1 - keep) * INF


NAN_FIX = "use masked_fill or torch.where: 0 * -inf is NaN"


def top_k_exactly_k(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """torch.topk's indices: exactly k tokens, so ties with the k-th lose out."""
    rank = torch.arange(logits.shape[-1])
    return _sorted_mask(logits, lambda o: rank[None, :] < top_k[:, None])


def draw_tokens(filtered: torch.Tensor, info: SamplingInfo, logits: torch.Tensor) -> torch.Tensor:
    cdf = filtered.double().softmax(-1).cumsum(-1)
    tokens = torch.searchsorted(cdf, (uniform(info.seeds, info.steps) * cdf[:, -1])[:, None]).squeeze(1)
    return torch.where(info.temperatures > 0, tokens.clamp(max=logits.shape[-1] - 1), logits.argmax(-1))


def sample_pitfalls(logits: torch.Tensor, info: SamplingInfo) -> list:
    """(mistake, tokens it gives) for the pitfalls of ``LabSampler.sample``."""
    temps = info.temperatures
    safe = torch.where(temps > 0, temps, torch.ones_like(temps))
    ones = torch.where(temps > 0, torch.ones_like(temps), temps)
    flat = make_info(temps.tolist(), vocab=logits.shape[-1], seeds=info.seeds, steps=info.steps)
    n = len(temps)

    def nucleus_of_the_raw_logits():
        raw = filter_logits(logits.float(), with_(info, temperatures=ones))
        return draw_tokens(raw / safe[:, None], info, logits)

    def top_p_on_everything():
        x = filter_logits(logits.float(), with_(info, top_p=torch.ones(n)))  # temperature + top-k
        nucleus = filter_logits(logits.float(), with_(info, top_k=torch.full((n,), logits.shape[-1])))
        return draw_tokens(torch.where(nucleus.isinf(), nucleus, x), info, logits)

    def greedy_sampled():
        return ref_tokens(logits, with_(info, temperatures=torch.where(temps > 0, temps, 1.0)))

    return [
        ("drawing with the step index ignored (the same u at every step)",
         lambda: ref_tokens(logits, with_(info, steps=torch.zeros_like(info.steps)))),
        ("using the row index as the seed (the draw then depends on the batch)",
         lambda: ref_tokens(logits, with_(info, seeds=torch.arange(n)))),
        ("ignoring the temperature, or applying it to the probabilities after the softmax (renormalising undoes it)",
         lambda: ref_tokens(logits, with_(info, temperatures=ones))),
        ("multiplying by the temperature instead of dividing",
         lambda: ref_tokens(logits, with_(info, temperatures=torch.where(temps > 0, 1 / safe, temps)))),
        ("top-p computed before the temperature (top-p must see softmax(logits / T))", nucleus_of_the_raw_logits),
        ("top-p computed on the whole distribution instead of what top-k kept (top-k first, then top-p on its "
         "renormalised softmax)", top_p_on_everything),
        ("keeping k + 1 tokens in top-k", lambda: ref_tokens(logits, with_(info, top_k=info.top_k + 1))),
        ("dropping the crossing token in top-p (keep a token when the mass *before* it is < p)",
         lambda: draw_tokens(top_p_without_crossing(filter_logits(logits.float(), with_(info, top_p=torch.ones(n))),
                                                    info.top_p), info, logits)),
        ("sampling the greedy rows (temperature 0 means argmax)", greedy_sampled),
        ("no filters at all (top-k and top-p ignored)", lambda: ref_tokens(logits, flat)),
    ]  # fmt: skip


# ---- rows of equally likely tokens: exact probabilities, to land on the boundaries --------------------
def tied_rows(sizes: list[int], vocab: int, seed: int) -> torch.Tensor:
    """Row r: ``sizes[r]`` logits 0 (a power of two of them) at random places, -inf elsewhere. Each
    probability is 1/n and every partial sum m/n, exactly, in float32 and float64 alike, whatever the
    softmax (exp(0) = 1), so a rule's ``<`` and ``<=`` give different answers there."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.full((len(sizes), vocab), INF)
    for r, n in enumerate(sizes):
        logits[r, torch.randperm(vocab, generator=g)[:n]] = 0.0
    return logits


def random_tied_case(seed: int, rows: int, vocab: int) -> tuple[torch.Tensor, list[int], list[int]]:
    """Tied rows of random sizes n (powers of two up to vocab) and a random m in [1, n] each."""
    g = torch.Generator().manual_seed(seed)
    sizes = [2 ** int(torch.randint(0, vocab.bit_length(), (1,), generator=g)) for _ in range(rows)]
    ms = [int(torch.randint(1, n + 1, (1,), generator=g)) for n in sizes]
    return tied_rows(sizes, vocab, seed), sizes, ms


def check_nucleus_sizes(got, logits: torch.Tensor, top_p: torch.Tensor, keep: list[int], what: str) -> None:
    """``got = top_p_filter(logits, top_p)`` on tied rows: row r keeps exactly ``keep[r]`` of its tokens,
    unchanged. Which of the tied tokens stay is up to the sort, so only their number is checked."""
    if not isinstance(got, torch.Tensor) or got.shape != logits.shape:
        raise AssertionError(f"{what}: expected a tensor shaped {list(logits.shape)}, got {got!r:.80}")
    for r, m in enumerate(keep):
        kept, n, p = got[r] > INF, int((logits[r] > INF).sum()), top_p[r].item()
        if (kept & ~(logits[r] > INF)).any() or not torch.equal(got[r][kept], logits[r][kept]):
            raise AssertionError(f"{what}: row {r}: a kept value changed, or a -inf logit came back finite")
        k = int(kept.sum())
        if k == m:
            continue
        why = {
            m + 1: "this keeps the token whose mass before it equals p (mass_before <= p): keep it only while "
            "mass_before < p",
            m - 1: "this drops the token that reaches p (cumsum < p): keep a token when the mass *before* it is < p",
        }
        rule = "p = 1 keeps every token" if m == n else "the mass before the next one is p itself, not < p"
        raise AssertionError(
            f"{what}: row {r} has {n} equally likely tokens (probability 1/{n} each, exact in float32) and p = {p:g} "
            f"= {m}/{n}: the {m} most likely sum to exactly p, so {m} stay ({rule}); {k} stayed"
            + (f"\n{why[k]}" if k in why else "")
        )


# ---- scale_logits -------------------------------------------------------------------------------------
@points(5)
def test_scale_logits():
    """Each row divided by its temperature, in float32 (bfloat16 logits too); greedy rows (temperature 0)
    divided by 1."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, V, generator=g) * 3
    logits[4, :10] = INF
    temps = torch.tensor([0.5, 1.0, 2.0, 0.0, 0.7])
    got = lab.scale_logits(logits.clone(), temps)
    want = filter_logits(logits, make_info(temps.tolist()))
    check_tensor(
        got,
        want,
        "scale_logits(logits [5, 64] float32, temperatures [0.5, 1, 2, 0, 0.7])",
        exact=True,
        hint="divide each row by its own temperature (temperatures[:, None]); temperature 0 rows by 1",
        pitfalls=[
            Pitfall("dividing greedy rows by their temperature 0", "divide by 1 where temperature == 0 "
                    "(those rows take the argmax; an inf or NaN logit would poison the batch)",
                    lambda: logits / temps[:, None]),
            Pitfall("multiplying by the temperature", "divide: T < 1 sharpens the distribution, T > 1 flattens it",
                    lambda: logits * torch.where(temps > 0, temps, 1.0)[:, None]),
        ],
    )  # fmt: skip
    check_scale_bfloat16(logits, temps, "scale_logits(logits [5, 64] bfloat16, temperatures [0.5, 1, 2, 0, 0.7])")


def check_scale_bfloat16(logits: torch.Tensor, temps: torch.Tensor, what: str) -> None:
    """The model's logits come in bfloat16 on a GPU: scale_logits returns float32, divided in float32."""
    low = logits.bfloat16()
    check_tensor(
        lab.scale_logits(low.clone(), temps),
        filter_logits(low.float(), make_info(temps.tolist(), vocab=logits.shape[-1])),
        what,
        exact=True,
        hint="convert with logits.float() before dividing: the result is float32 whatever the logits' dtype "
        "(divided in bfloat16, a logit keeps 3 significant digits, and every probability after it moves)",
    )


# ---- top-k --------------------------------------------------------------------------------------------
def _top_k_case():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(7, V, generator=g) * 2
    logits[0, :6] = torch.tensor([5.0, 3.0, 3.0, 3.0, 1.0, 3.0])  # the 2nd largest (3.0) is tied four times
    logits[0, 6:] = -2.0
    logits[5, 8:] = INF  # 8 finite logits, top_k 20: everything finite stays
    logits[6, 3] = 100.0
    top_k = torch.tensor([2, 1, 5, V, 17, 20, 1, V + 3])  # k = V and k > V keep everything
    return torch.cat([logits, logits[3:4]]), top_k


@points(7)
def test_top_k_filter():
    """Each row keeps the logits >= its own k-th largest (ties kept); k >= vocab keeps everything (k = vocab
    and k > vocab)."""
    logits, top_k = _top_k_case()
    got = lab.top_k_filter(logits.clone(), top_k.clone())
    capped = top_k.clamp(max=V)  # the engine never asks for more than the vocabulary
    want = filter_logits(logits, make_info([1.0] * len(top_k), top_k=capped))
    check_tensor(
        got,
        want,
        f"top_k_filter(logits [8, 64], top_k {top_k.tolist()})",
        exact=True,
        hint="keep logits >= the k-th largest of the row (sort descending, take index k - 1), the rest -inf; "
        "k >= vocab keeps every token (row 7: k = vocab + 3)",
        pitfalls=[
            Pitfall("keeping k + 1 tokens", "the k-th largest is at index k - 1 of the descending sort",
                    lambda: filter_logits(logits, make_info([1.0] * 8, top_k=(top_k + 1).clamp(max=V)))),
            Pitfall("dropping the ties with the k-th logit (torch.topk's indices keep exactly k)",
                    "compare with the k-th largest value: every logit >= it stays (row 0 has k=2 and keeps 4 tokens)",
                    lambda: top_k_exactly_k(logits, top_k)),
            Pitfall("one k for the whole batch", "each row uses its own top_k[r] (gather per row)",
                    lambda: filter_logits(logits, make_info([1.0] * 8, top_k=[int(capped.max())] * 8))),
            Pitfall("one k for the whole batch", "each row uses its own top_k[r] (gather per row)",
                    lambda: filter_logits(logits, make_info([1.0] * 8, top_k=[int(top_k[0])] * 8))),
            Pitfall("masking by arithmetic (logits * keep + (1 - keep) * -inf)", NAN_FIX,
                    lambda: masked_by_arithmetic(logits, filter_logits(logits, make_info([1.0] * 8, top_k=capped)))),
        ],
    )  # fmt: skip


# ---- top-p --------------------------------------------------------------------------------------------
def _top_p_case():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(6, V, generator=g) * 2
    logits[0] = INF
    logits[0, :4] = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()  # p = 0.7: keeps 0.5 and 0.3 (the crossing one)
    logits[2, 7] = 30.0  # p = 1: the float32 mass before the other tokens rounds to 1.0, and they must stay
    logits[3, 20:] = INF  # top-k already ran
    top_p = torch.tensor([0.7, 0.001, 1.0, 0.9, 0.5, 0.95])
    return logits, top_p


@points(7)
def test_top_p_filter():
    """Each row keeps its nucleus: a token stays when the mass of the more likely tokens is < p, so the
    token crossing p stays and a tiny p keeps the top token; a token whose mass before it is exactly p
    goes (rows of equally likely tokens, whose probabilities are exact)."""
    logits, top_p = _top_p_case()
    got = lab.top_p_filter(logits.clone(), top_p.clone())
    want = filter_logits(logits, make_info([1.0] * len(top_p), top_p=top_p))
    check_tensor(
        got,
        want,
        f"top_p_filter(logits [6, 64], top_p {[round(p, 3) for p in top_p.tolist()]}) (row 0: probabilities "
        "0.5, 0.3, 0.15, 0.05 and p = 0.7 keep 0.5 and 0.3)",
        exact=True,
        hint="sort by probability; keep a token when cumsum - p_token (the mass before it) < top_p; the rest -inf",
        pitfalls=[
            Pitfall("dropping the crossing token", "keep a token when the mass *before* it is < p (cumsum - p); "
                    "with p = 0.001 the top token must stay", lambda: top_p_without_crossing(logits, top_p)),
            Pitfall("dropping tokens at p = 1", "a row with top_p = 1 keeps every token (row 2: one logit dominates, "
                    "so the float32 mass before the others rounds to 1.0)",
                    lambda: _sorted_mask(logits, lambda o: o.softmax(-1).cumsum(-1) - o.softmax(-1) < top_p[:, None])),
            Pitfall("one p for the whole batch", "each row uses its own top_p[r]",
                    lambda: filter_logits(logits, make_info([1.0] * 6, top_p=[top_p[0].item()] * 6))),
            Pitfall("masking by arithmetic (logits * keep + (1 - keep) * -inf)", NAN_FIX,
                    lambda: masked_by_arithmetic(logits, filter_logits(logits, make_info([1.0] * 6, top_p=top_p)))),
        ],
    )  # fmt: skip
    # the boundary itself: the mass before a token equal to p, exactly (equally likely tokens)
    sizes, keep = [8, 4, 4, 16, 2], [4, 1, 3, 2, 1]
    tied, p = tied_rows(sizes, V, seed=9), torch.tensor([0.5, 0.25, 0.75, 0.125, 0.5])
    check_nucleus_sizes(lab.top_p_filter(tied.clone(), p.clone()), tied, p, keep, "top_p_filter on the boundary")


# ---- draw ---------------------------------------------------------------------------------------------
@points(5)
def test_draw():
    """The inverse-CDF rule: the first token whose cumulative probability reaches u * total (also when it
    equals it exactly), on logits above 88 (exp overflows float32) and with u above a float32 CDF's total."""
    logits = torch.tensor([[0.2, 0.5, 0.3]]).log().repeat(6, 1)
    logits[5, 1] = INF  # probability 0: never drawn
    u = torch.tensor([0.1, 0.3, 0.69, 0.71, 0.99, 0.45], dtype=torch.float64)
    got = lab.draw(logits.clone(), u.clone())
    want = torch.tensor([0, 1, 1, 2, 2, 2])
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int64 and got.shape == (6,), (
        f"draw(logits [6, 3], u [6]) must return a [6] int64 tensor, got "
        f"{f'{list(got.shape)} {got.dtype}' if isinstance(got, torch.Tensor) else type(got).__name__}"
    )
    assert torch.equal(got, want), (
        f"draw with probabilities [0.2, 0.5, 0.3] (CDF 0.2, 0.7, 1.0) and u = {u.tolist()} (last row: the middle "
        f"token masked to -inf, CDF 0.4, 0.4, 1.0) returned {got.tolist()}, expected {want.tolist()}: the token is "
        "the first i with cdf[i] >= u * cdf[-1] (torch.searchsorted), and a -inf logit has probability 0"
    )
    shifted = lab.draw(logits.clone() + 100.0, u.clone())  # the same probabilities: softmax ignores a shift
    assert isinstance(shifted, torch.Tensor) and torch.equal(shifted, want), (
        f"draw on the same rows shifted by +100 (the same probabilities) returned "
        f"{shifted.tolist() if isinstance(shifted, torch.Tensor) else shifted}, expected {want.tolist()}\nexp() of a "
        "logit above 88 overflows float32 to inf (and inf / inf is NaN); use softmax, which subtracts the row's "
        "maximum first"
    )
    sizes = [4, 4, 4, 8, 2, 1]
    check_draw_boundary(tied_rows(sizes, 16, seed=10), sizes, [1, 2, 3, 3, 1, 1], "draw on the boundary")
    check_draw_near_one()
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(200, V, generator=g) * 2
    logits[::3, ::2] = INF
    info = make_info([1.0] * 200, seeds=range(200), steps=[7] * 200)
    check_tokens(
        lab.draw(logits.clone(), uniform(info.seeds, info.steps)),
        logits,
        info,
        "draw(logits [200, 64], uniform(seeds, steps))",
        "the CDF of the probabilities (softmax, not the logits), and the first index where it reaches u * cdf[-1]",
        [("the argmax instead of a draw", lambda: logits.argmax(-1))],
    )


def check_draw_boundary(tied: torch.Tensor, sizes: list[int], ms: list[int], what: str) -> None:
    """draw on tied rows (n equally likely tokens: the CDF's values m/n are exact) with u = m/n: u * total
    equals the CDF at the m-th drawable token, which is the first i with cdf[i] >= u * total."""
    ms = [min(m, n - 1) if n > 1 else 0 for n, m in zip(sizes, ms)]  # u in (0, 1): u = 1/2 for one token
    u = torch.tensor([m / n if m else 0.5 for n, m in zip(sizes, ms)], dtype=torch.float64)
    got = lab.draw(tied.clone(), u.clone())
    want = [int((tied[r] > INF).nonzero()[max(m, 1) - 1]) for r, m in enumerate(ms)]
    if isinstance(got, torch.Tensor) and got.tolist() == want:
        return
    shown = got.tolist() if isinstance(got, torch.Tensor) else got
    r = next((r for r in range(len(want)) if not isinstance(shown, list) or shown[r] != want[r]), 0)
    raise AssertionError(
        f"{what}: expected the tokens {want}, got {shown}. Row {r} has {sizes[r]} equally likely tokens (CDF values "
        f"m/{sizes[r]}, exact in float32) and u = {u[r].item():g}: u * total equals the CDF at drawable token "
        f"{max(ms[r], 1)} (token id {want[r]})\nthe token is the first i with cdf[i] >= u * total; cdf[i] > u * total "
        "(searchsorted with right=True) takes the next one"
    )


def check_draw_near_one() -> None:
    """u = 1 - 2^-40 lies above the total of a float32 CDF that ends below 1: scaled by the total, it lands
    on the last drawable token, never past it."""
    u_one, g, rows = 1 - 2**-40, torch.Generator().manual_seed(11), []
    for _ in range(200):  # rows whose float32 CDF ends below u (about one in three)
        row = torch.randn(1, 1000, generator=g) * 0.5
        row[:, -8:] = INF  # the tail cannot be drawn
        if row.softmax(-1).cumsum(-1)[0, -1].item() < u_one:
            rows.append(row)
        if len(rows) == 4:
            break
    assert len(rows) == 4, "no float32 CDF ended below 1 - 2^-40 (the test's inputs): tell the staff"
    logits, u = torch.cat(rows), torch.full((4,), u_one, dtype=torch.float64)
    check_tokens(
        lab.draw(logits.clone(), u.clone()),
        logits,
        make_info([1.0] * 4, vocab=1000),
        "draw with u = 1 - 2^-40, above the total of these rows' float32 CDF (their last 8 tokens -inf)",
        "compare cdf with u * cdf[-1], not with u: a float32 CDF may end a little below 1, and a u above its total "
        "lands past the last drawable token",
        u=u,
    )


# ---- random filters -----------------------------------------------------------------------------------
def _random_case(seed: int, rows: int, vocab: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * (0.5 + 3 * torch.rand(rows, 1, generator=g))
    holes = torch.rand(rows, vocab, generator=g) < 0.2 * torch.rand(rows, 1, generator=g)
    holes[:, 0] = False  # every row keeps at least one finite logit
    logits = logits.masked_fill(holes, INF)
    temps = (0.3 + 1.5 * torch.rand(rows, generator=g)) * (torch.rand(rows, generator=g) > 0.2)
    top_k = torch.randint(1, vocab + 8, (rows,), generator=g).clamp(max=vocab)
    top_p = torch.where(torch.rand(rows, generator=g) < 0.3, 1.0, 0.05 + 0.95 * torch.rand(rows, generator=g))
    return logits, temps, top_k, top_p


@points(7)
def test_filters_random():
    """Random batches (vocab 2..200, -inf holes, per-row temperature, top-k, top-p, bfloat16 logits, rows of
    equally likely tokens on top-p's boundary): scale_logits, top_k_filter and top_p_filter give the engine's
    filter_logits."""
    lab.scale_logits(torch.zeros(1, 4), torch.ones(1))  # a stub fails here, before hypothesis runs
    _filters_random()


@settings(max_examples=60)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 12), vocab=st.integers(2, 200))
def _filters_random(seed, rows, vocab):
    logits, temps, top_k, top_p = _random_case(seed, rows, vocab)
    ones = [1.0] * rows
    check_tensor(
        lab.scale_logits(logits.clone(), temps),
        filter_logits(logits, make_info(temps, vocab=vocab)),
        f"scale_logits on a random [{rows}, {vocab}] batch, temperatures {temps.tolist()}",
        exact=True,
    )
    tied = (logits * 2).round() / 2  # top-k on logits with ties (top-p's boundary among ties is arbitrary)
    check_tensor(
        lab.top_k_filter(tied.clone(), top_k),
        filter_logits(tied, make_info(ones, top_k=top_k, vocab=vocab)),
        f"top_k_filter on a random [{rows}, {vocab}] batch of logits rounded to 0.5 (ties), top_k {top_k.tolist()}",
        exact=True,
        hint="keep the logits >= each row's k-th largest",
    )
    check_tensor(lab.top_p_filter(logits.clone(), top_p),
                 filter_logits(logits, make_info(ones, top_p=top_p, vocab=vocab)),
                 f"top_p_filter on a random [{rows}, {vocab}] batch, top_p {top_p.tolist()}", exact=True,
                 hint="keep each token whose more likely tokens sum to < p")  # fmt: skip
    check_scale_bfloat16(logits, temps, f"scale_logits on a random [{rows}, {vocab}] batch of bfloat16 logits")
    over = torch.where(top_k == vocab, top_k + seed % 5, top_k)  # k >= vocab keeps everything
    check_tensor(
        lab.top_k_filter(logits.clone(), over),
        filter_logits(logits, make_info(ones, top_k=top_k, vocab=vocab)),
        f"top_k_filter on a random [{rows}, {vocab}] batch, top_k {over.tolist()}",
        exact=True,
        hint="k >= vocab keeps every token",
    )
    equal, sizes, ms = random_tied_case(seed, rows, vocab)
    p = torch.tensor([m / n for n, m in zip(sizes, ms)])
    check_nucleus_sizes(lab.top_p_filter(equal.clone(), p), equal, p, ms, f"top_p_filter on random tied rows {sizes}")


@points(5)
def test_draw_random():
    """Random rows and uniforms: every draw follows the inverse-CDF rule (also on logits above 88, with u
    above a float32 CDF's total, and with u * total exactly on a CDF value)."""
    lab.draw(torch.zeros(1, 4), torch.full((1,), 0.5, dtype=torch.float64))  # a stub fails here
    _draw_random()


@settings(max_examples=60)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 40), vocab=st.integers(1, 300))
def _draw_random(seed, rows, vocab):
    logits, *_ = _random_case(seed, rows, vocab)
    info = make_info([1.0] * rows, seeds=[seed + r for r in range(rows)], steps=[seed % 97] * rows, vocab=vocab)
    check_tokens(lab.draw(logits.clone(), uniform(info.seeds, info.steps)), logits, info,
                 f"draw on a random [{rows}, {vocab}] batch", "the first index with cdf >= u * cdf[-1]")  # fmt: skip
    shifted = logits + 100.0
    check_tokens(lab.draw(shifted.clone(), uniform(info.seeds, info.steps)), shifted, info,
                 f"draw on a random [{rows}, {vocab}] batch of logits shifted by +100 (the same probabilities)",
                 "exp() overflows float32 past 88: use softmax (it subtracts the row's maximum first)")  # fmt: skip
    if vocab > 1:  # u above the total of a float32 CDF (about one row in three), the last token -inf
        tail, near = logits.clone(), torch.full((rows,), 1 - 2**-40, dtype=torch.float64)
        tail[:, -1] = INF
        check_tokens(lab.draw(tail.clone(), near.clone()), tail, info,
                     f"draw with u = 1 - 2^-40 on a random [{rows}, {vocab}] batch whose last token is -inf",
                     "compare cdf with u * cdf[-1], not with u: a float32 CDF may end below u", u=near)  # fmt: skip
    equal, sizes, ms = random_tied_case(seed, rows, vocab)
    check_draw_boundary(equal, sizes, ms, f"draw on random tied rows {sizes}")


# ---- the sampler ----------------------------------------------------------------------------------------
@points(5)
def test_greedy_rows():
    """Temperature-0 rows return the argmax, alone or beside sampled rows; top_k = 1 is greedy too."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(8, V, generator=g) * 2
    logits[1, :30] = INF
    info = make_info([0.0] * 8)
    got = lab.sample(logits.clone(), info)
    assert isinstance(got, torch.Tensor) and torch.equal(got, logits.argmax(-1)), (
        f"an all-greedy batch (temperature 0): expected the argmax {logits.argmax(-1).tolist()}, got "
        f"{got.tolist() if isinstance(got, torch.Tensor) else got}"
    )
    mixed = make_info([0.0, 1.0, 0.0, 0.8, 1.3, 0.0, 1.0, 0.9], top_k=[V, V, V, 1, V, V, 1, 1], top_p=[1.0] * 8)
    check_tokens(
        lab.sample(logits.clone(), mixed),
        logits,
        mixed,
        "a batch mixing greedy rows (temperature 0, and top_k = 1) with sampled rows",
        "greedy rows (temperature 0) take the argmax of their logits, whatever the other rows do; top_k = 1 leaves "
        "one token",
        sample_pitfalls(logits, mixed),
    )


def _mixed_batch(steps: int):
    g = torch.Generator().manual_seed(5)
    rows = 12
    logits = torch.randn(rows, V, generator=g) * 2.5
    temps = [0.6, 1.0, 1.4, 0.0, 0.8, 1.2, 1.0, 0.7, 2.0, 1.0, 0.9, 0.5]
    top_k = [V, 5, V, V, 20, 8, V, 3, V, 30, 12, V]
    top_p = [1.0, 1.0, 0.7, 1.0, 0.9, 0.6, 0.5, 1.0, 0.8, 0.95, 0.75, 0.9]
    seeds = [11, 7, 2**40 + 3, 5, 123456789, 0, 99, 31337, 2**62, 8, 42, 17]
    return logits, make_info(temps, top_k, top_p, seeds=seeds, steps=[steps + r % 3 for r in range(rows)])


@points(8)
def test_draws_follow_the_rule():
    """A batch of 12 rows, each with its own temperature, top-k, top-p, seed and step, over 8 steps: every
    token is the engine's draw."""
    for step in range(8):
        logits, info = _mixed_batch(step)
        check_tokens(
            lab.sample(logits.clone(), info),
            logits,
            info,
            f"LabSampler.sample on a batch of 12 rows with per-row parameters, steps {info.steps.tolist()}",
            "the order is temperature, then top-k, then top-p on what top-k kept, then draw with "
            "uniform(info.seeds, info.steps); each row with its own parameters",
            sample_pitfalls(logits, info),
        )


def _distribution(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens.clamp(0, vocab - 1), minlength=vocab).double() / len(tokens)


TVD_CASES = [  # (temperature, top_k, top_p)
    (1.0, V, 1.0),
    (0.5, V, 1.0),
    (2.0, 6, 1.0),
    (1.0, V, 0.8),
    (0.7, 10, 0.9),
]


@points(2)
@pytest.mark.parametrize("case", range(len(TVD_CASES)))
def test_sampled_distribution(case):
    """20,000 seeded draws of one row are distributed as softmax(filtered logits / T): total variation distance
    < 0.04 (a correct sampler's is about 0.015). Any correct sampler passes, whatever its draw rule."""
    temperature, top_k, top_p = TVD_CASES[case]
    n = 20_000
    g = torch.Generator().manual_seed(6)
    logits = (torch.randn(1, V, generator=g) * 1.5).repeat(n, 1)
    info = make_info([temperature] * n, [top_k] * n, [top_p] * n, seeds=range(n), steps=[3] * n)
    got = lab.sample(logits.clone(), info)
    assert isinstance(got, torch.Tensor) and got.shape == (n,), f"expected [{n}] token ids, got {got!r:.80}"
    one, row = rows_of(info, slice(0, 1)), logits[:1].double()
    exact = filter_logits(row, one).softmax(-1)[0]
    empirical = _distribution(got, V)
    tvd = 0.5 * (empirical - exact).abs().sum().item()
    if tvd < TVD_LIMIT:
        return
    gap = (empirical - exact).abs().argmax().item()
    message = (
        f"temperature {temperature}, top_k {top_k if top_k < V else 'off'}, top_p {top_p}: your {n} tokens are "
        f"{tvd:.3f} in total variation from the exact distribution softmax(filtered logits / T) (a correct sampler: "
        f"about 0.015, limit {TVD_LIMIT}). Largest gap: token {gap}, expected frequency {exact[gap].item():.4f}, "
        f"got {empirical[gap].item():.4f}"
    )
    if ((empirical > 0) & (exact == 0)).any():
        t = int(((empirical > 0) & (exact == 0)).nonzero()[0])
        message += f"; token {t} was drawn {int((got == t).sum())} times but the filters should have removed it"
    candidates = {
        "ignoring the temperature (or dividing the probabilities by it after the softmax: renormalising undoes it)":
            filter_logits(row, with_(one, temperatures=torch.ones(1))),
        "multiplying by the temperature instead of dividing":
            filter_logits(row, with_(one, temperatures=1 / one.temperatures)),
        "keeping k + 1 tokens in top-k": filter_logits(row, with_(one, top_k=one.top_k + 1)),
        "dropping the crossing token in top-p (keep a token when the mass before it is < p)":
            top_p_without_crossing(filter_logits(row, with_(one, top_p=torch.ones(1))), one.top_p),
        "top-p computed before the temperature":
            filter_logits(row, with_(one, temperatures=torch.ones(1))) / temperature,
    }  # fmt: skip
    for mistake, wrong_logits in candidates.items():
        wrong = wrong_logits.softmax(-1)[0]
        if 0.5 * (wrong - exact).abs().sum() > TVD_LIMIT and 0.5 * (empirical - wrong).abs().sum() < TVD_LIMIT:
            raise AssertionError(f"{message}\nthis is the distribution {mistake} gives")
    raise AssertionError(f"{message}\nusual cause: the order is temperature, top-k, then top-p, then the draw")


@points(5)
def test_infinite_logits():
    """Rows with -inf logits (a masked vocabulary), one with a single finite logit, beside greedy rows:
    no NaN, never a -inf token, every draw the engine's."""
    g = torch.Generator().manual_seed(7)
    rows = 8
    logits = torch.randn(rows, V, generator=g) * 2
    logits[0, 1:] = INF  # one finite token: always drawn
    logits[1, ::2] = INF
    logits[2, :60] = INF
    logits[3, 10:] = INF
    logits[5, 32:] = INF
    logits[7, 5:50] = INF
    info = make_info([1.0, 0.8, 1.5, 0.0, 1.0, 0.7, 1.1, 0.9], top_k=[V, 10, 2, V, 20, V, V, 4],
                     top_p=[0.9, 1.0, 0.5, 1.0, 0.8, 0.3, 0.95, 0.9], steps=[2] * rows)  # fmt: skip
    for _ in range(4):
        info = with_(info, steps=info.steps + 1)
        got = lab.sample(logits.clone(), info)
        check_tokens(
            got,
            logits,
            info,
            f"rows with -inf logits (step {int(info.steps[0])})",
            "a NaN in the filtered logits (masking by arithmetic, logits * keep: 0 * -inf is NaN; use masked_fill / "
            "torch.where), or a CDF that does not skip probability-0 tokens",
            sample_pitfalls(logits, info),
        )


@points(7)
def test_batch_invariance():
    """A row's token depends only on its logits, parameters, seed and step: the same alone, in a batch, and
    in the batch reversed."""
    for step in range(4):
        logits, info = _mixed_batch(step)
        rows = logits.shape[0]
        batched = lab.sample(logits.clone(), info)
        flip = torch.arange(rows - 1, -1, -1)
        reversed_ = lab.sample(logits[flip].clone(), rows_of(info, flip))[flip]
        for r in range(rows):
            alone = int(lab.sample(logits[r : r + 1].clone(), rows_of(info, slice(r, r + 1)))[0])
            got = (int(batched[r]), int(reversed_[r]))
            assert got == (alone, alone), (
                f"row {r} gave token {alone} alone, {got[0]} in a batch of {rows}, {got[1]} in it reversed: not "
                "batch-invariant (a random generator shared by the batch, or the row index as a seed?). A row's draw "
                "depends only on its own seed and step: u = uniform(info.seeds, info.steps). "
                f"Row {r}: {row_text(info, r)}"
            )


@points(7)
def test_sample_random():
    """Random batches (per-row temperature, top-k, top-p, seeds up to 2^62, steps, -inf holes, greedy rows):
    every token is the engine's."""
    lab.sample(torch.zeros(1, 4), make_info([1.0], vocab=4))  # a stub fails here
    _sample_random()


@settings(max_examples=60)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 16), vocab=st.integers(2, 300))
def _sample_random(seed, rows, vocab):
    logits, temps, top_k, top_p = _random_case(seed, rows, vocab)
    g = torch.Generator().manual_seed(seed)
    info = make_info(temps, top_k, top_p, vocab=vocab, seeds=torch.randint(0, 2**62, (rows,), generator=g),
                     steps=torch.randint(0, 4096, (rows,), generator=g))  # fmt: skip
    check_tokens(lab.sample(logits.clone(), info), logits, info, f"a random batch [{rows}, {vocab}]",
                 "see the other failing tests: they name the step", sample_pitfalls(logits, info))  # fmt: skip


# ---- the engine with your sampler -------------------------------------------------------------------
def _engine_tokens(model, prompts, params, components: dict | None) -> list[list[int]]:
    from minisgl import LLM

    llm = LLM(str(model), device="cpu", dtype="float32", attention_backend="torch", components=components or {})
    try:
        batch = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        alone = [o.token_ids for o in llm.generate(prompts[:1], params[:1], use_tqdm=False)]
        return batch + alone
    finally:
        llm.shutdown()


@points(12, timeout=180)
@engine
def test_engine_samples_with_your_sampler(tiny_llama):
    """The engine with components={"sampler": "lab02"} gives the reference engine's tokens for seeded
    requests (temperature, top-k, top-p, greedy) in one batch, and the first request alone gives the same
    tokens as inside the batch."""
    from minisgl import SamplingParams

    cls = lab.sampler_class()
    cls().sample(torch.zeros(1, 4), make_info([1.0], vocab=4))  # a stub fails here, before any engine is built
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(3, 49152, (n,), generator=g).tolist() for n in (9, 5, 12, 7, 6)]
    kw = dict(max_tokens=10, ignore_eos=True)
    params = [
        SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=1, **kw),
        SamplingParams(temperature=1.0, seed=2, **kw),
        SamplingParams(temperature=0.7, top_p=0.8, seed=2**40 + 1, **kw),
        SamplingParams(temperature=0.0, **kw),
        SamplingParams(temperature=1.3, top_k=8, seed=3, **kw),
    ]
    with lab.registered_sampler(cls) as components:
        try:
            got = _engine_tokens(tiny_llama, prompts, params, components)
        except (NotImplementedError, AssertionError) as e:
            raise type(e)(f"the engine failed with your sampler: {e}") from e
        except Exception as e:
            raise AssertionError(f"the engine failed with your sampler: {type(e).__name__}: {e}") from e
    want = _engine_tokens(tiny_llama, prompts, params, None)
    diff = first_token_difference(got[:-1], want[:-1])
    assert diff is None, (
        f"with your sampler the engine generated other tokens than the reference: {diff} (requests: 0 = T 0.8, "
        "top-k 40, top-p 0.9; 1 = T 1.0; 2 = T 0.7, top-p 0.8; 3 = greedy; 4 = T 1.3, top-k 8). Token 0 comes "
        "from the prefill batch, the others from decode batches: a difference from token 1 on points at the step"
    )
    assert got[-1] == got[0], (
        f"request 0 (seed 1) alone generated {got[-1]}, inside the batch {got[0]}: a seeded request must give the "
        "same tokens in any batch (draw with uniform(info.seeds, info.steps), per row)"
    )
