"""Assertions whose messages teach: what was expected, what came out, and the usual cause.

A failing tensor check names the specific mistake when it can: each test passes the wrong answers
its function is known to produce (``pitfalls``: the mistake, its fix, and a way to compute what it
outputs), and when the student's output *is* one of them, the message says so ("this is exactly
what computing the mean of squares in bfloat16 gives: ...") instead of a generic hint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from minisgl.engine.sample import SamplingInfo


class Pitfall(NamedTuple):
    """A known wrong answer: the mistake ("leaving eps out"), its fix, and a function computing
    what that mistake outputs on the test's input (``None`` when it cannot happen there)."""

    mistake: str
    fix: str
    answer: Callable[[], torch.Tensor | None]


ROUNDING_SHARE = 0.01  # share of values an ``exact`` check lets be one unit in the last place off


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def describe(t: torch.Tensor) -> str:
    return f"{list(t.shape)} {dtype_name(t.dtype)}"


def ulp(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` numbers at ``|t|`` (float64): one unit in the last place."""
    info = torch.finfo(dtype)
    _, exponent = torch.frexp(t.detach().double().abs().clamp_min(info.tiny))
    return torch.ldexp(torch.full_like(t, info.eps, dtype=torch.float64), exponent - 1)


def _failure(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float, exact: bool) -> str | None:
    """Why ``got`` (shaped and typed like ``want``) is not close enough to it, or None."""
    g, w = got.detach().double(), want.detach().double()
    if torch.isnan(g).any() and not torch.isnan(w).any():
        idx = tuple(torch.nonzero(torch.isnan(g))[0].tolist())
        return f"NaN at index {list(idx)} (expected {w[idx].item():.6g})"
    if exact:
        differ = (g != w) & ~(torch.isnan(g) & torch.isnan(w))
        if not differ.any():
            return None
        units = torch.where(differ, (g - w).abs() / ulp(torch.maximum(g.abs(), w.abs()), want.dtype), 0.0)
        allowed = max(1, int(ROUNDING_SHARE * w.numel()))
        if int(differ.sum()) <= allowed and units.max() <= 1:
            return None  # the rounding of float32 math done in another order than the reference's
        idx = tuple(torch.nonzero(differ)[0].tolist())
        most = units.max().item()
        return (
            f"{int(differ.sum())} of {w.numel()} values differ from the reference, by up to {most:.3g} "
            f"unit{'s' * (most != 1)} in the last place of {dtype_name(want.dtype)} (a correct float32 computation, "
            f"rounded once, matches all but a few to the last bit). First at index {list(idx)}: "
            f"expected {w[idx].item():.6g}, got {g[idx].item():.6g}"
        )
    err = (g - w).abs()
    bad = err > atol + rtol * w.abs()
    if not bad.any():
        return None
    idx = tuple(torch.nonzero(bad)[0].tolist())
    return (
        f"{int(bad.sum())} of {w.numel()} values differ; max abs error {err.max().item():.3g} "
        f"(tolerance {atol:g}). First at index {list(idx)}: expected {w[idx].item():.6g}, got {g[idx].item():.6g}"
    )


def matches(got, want: torch.Tensor, *, atol: float = 0.0, rtol: float = 0.0, exact: bool = False) -> bool:
    """Whether ``check_tensor`` with the same arguments would pass."""
    return (
        isinstance(got, torch.Tensor)
        and got.shape == want.shape
        and got.dtype == want.dtype
        and _failure(got, want, atol, rtol, exact) is None
    )


def check_tensor(
    got,
    want: torch.Tensor,
    what: str,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    exact: bool = False,
    hint: str = "",
    pitfalls: Sequence[Pitfall] = (),
) -> None:
    """``got`` must be a tensor shaped and typed like ``want`` and close to it: within ``atol +
    rtol * |want|``, or with ``exact`` equal to the last bit except at most 1% of the values (at
    least one) one unit in the last place off — what a float32 computation in another order than
    the reference's gives after rounding to a low-precision ``want.dtype``; computing in that
    low precision instead is off in far more places. On failure the message names the
    pitfall whose wrong answer ``got`` matches, else gives the generic ``hint``."""
    usual = f"\nusual cause: {hint}" if hint else ""
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what}: expected a torch.Tensor, got {type(got).__name__}")
    if got.shape != want.shape:
        raise AssertionError(
            f"{what}: expected shape {list(want.shape)}, got {list(got.shape)}"
            + (usual or "\nusual cause: a reshape/transpose left a dimension out of place")
        )
    if got.dtype != want.dtype:
        raise AssertionError(f"{what}: expected dtype {want.dtype}, got {got.dtype} (cast the result back){usual}")
    failure = _failure(got, want, atol, rtol, exact)
    if failure is None:
        return
    raise AssertionError(f"{what}: {failure}{_diagnose(got, pitfalls, atol, rtol, exact) or usual}")


def _diagnose(got: torch.Tensor, pitfalls: Sequence[Pitfall], atol: float, rtol: float, exact: bool) -> str | None:
    """Names the pitfall whose wrong answer ``got`` matches; of several, the one it equals in the
    most values. Small inputs can make two mistakes round alike: the message then says so."""
    found: list[tuple[int, Pitfall]] = []
    for pitfall in pitfalls:
        try:
            wrong = pitfall.answer()
        except Exception:  # a diagnosis must never hide the failure it explains
            continue
        if matches(got, wrong, atol=atol, rtol=rtol, exact=exact):
            found.append((int((got.detach() != wrong.detach()).sum()), pitfall))
    if not found:
        return None
    closest = min(n for n, _ in found)
    best = [p for n, p in found if n == closest]
    text = f"\nthis is exactly what {best[0].mistake} gives: {best[0].fix}"
    if len(best) > 1:
        text += f"\n(on this input, so does {' or '.join(p.mistake for p in best[1:])})"
    return text


def first_token_difference(got: list[list[int]], want: list[list[int]]) -> str | None:
    """A sentence locating the first differing token, or None when equal."""
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            j = next((k for k, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            return (
                f"prompt {i}, generated token {j}: expected {w[j] if j < len(w) else 'end of output'}, "
                f"got {g[j] if j < len(g) else 'end of output'} (expected {w}, got {g})"
            )
    return None


def sampling_info(temps, top_k=None, top_p=None, seeds=None, steps=None, *, vocab: int) -> SamplingInfo:
    """A batch's parameters as the engine builds them (top_k = vocab and top_p = 1 when disabled)."""
    n = len(temps)
    temps = torch.as_tensor(temps, dtype=torch.float32)
    top_k = torch.as_tensor([vocab] * n if top_k is None else top_k, dtype=torch.int64)
    top_p = torch.as_tensor([1.0] * n if top_p is None else top_p, dtype=torch.float32)
    seeds = torch.as_tensor(list(range(1, n + 1)) if seeds is None else seeds, dtype=torch.int64)
    steps = torch.as_tensor([0] * n if steps is None else steps, dtype=torch.int64)
    return SamplingInfo(
        temperatures=temps,
        top_k=top_k,
        top_p=top_p,
        seeds=seeds,
        steps=steps,
        all_greedy=bool((temps == 0).all()),
        need_top_k=bool((top_k < vocab).any()),
        need_top_p=bool((top_p < 1.0).any()),
    )


def chi2_bound(df: int, significance: float = 1e-3) -> float:
    """The chi-square statistic that ``df`` degrees of freedom exceed with probability ``significance``
    (scipy's ``chi2.ppf(1 - significance, df)``, to 1e-9): bisection on the survival function, which is
    the regularized upper incomplete gamma function ``Q(df / 2, x / 2)``."""
    sf = lambda x: float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(x / 2)))
    lo, hi = 0.0, float(df) + 10.0
    while sf(hi) > significance:
        hi *= 2
    while hi - lo > 1e-9 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sf(mid) > significance else (lo, mid)
    return hi
