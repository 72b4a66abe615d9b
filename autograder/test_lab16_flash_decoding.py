"""Lab 16 (flash-decoding in Triton: the split pass and the merge of the engine's decode attention): the
docstring's examples, the merge on its own, the partial buffers, fixed cases for each pitfall and random
batches against attention computed in torch (float64) from the same pool, the checks one argument at a
time, then the engine's ``triton`` backend decoding with your ``decode``. On a CPU the kernels run under
Triton's interpreter: the sizes are small. Run: ``python -m autograder lab16``; on a CUDA GPU also
``pytest autograder/test_gpu_lab16.py``."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

import torch

from autograder.adapters import lab16 as lab  # first: on a CPU it sets TRITON_INTERPRET before triton loads
from autograder.checks import first_token_difference
from autograder.engine_runs import engine_failure, generate_rounds
from autograder.points import engine, points
from minisgl.models.config import ModelConfig

DEVICE = lab.DEVICE
NAN = float("nan")
INF = float("inf")


@dataclass
class Case:
    q: torch.Tensor  # [B, H, D], stride(2) == 1
    k: torch.Tensor  # [S, KV, D]
    v: torch.Tensor
    table: torch.Tensor  # [R, W] int32
    rows: torch.Tensor  # [B]
    lens: torch.Tensor  # [B] int32
    scale: float
    what: str

    def args(self, splits: int) -> tuple:
        return self.q, self.k, self.v, self.table, self.rows, self.lens, self.scale, splits


def make_case(
    lens: list[int],
    *,
    heads: tuple[int, int] = (4, 2),
    dim: int = 16,
    page: int = 4,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    width: int | None = None,
    q_layout: str = "contiguous",
    gain: float = 1.0,
) -> Case:
    """A decode batch as the engine holds it: each request's positions on pages of ``page`` slots taken
    at random from a pool, its page-table row (a random one of ``B + 1`` rows) ``width`` positions wide
    (past its length: more slots of its pages, other requests' keys)."""
    g = torch.Generator().manual_seed(seed)
    H, KV = heads
    B = len(lens)
    W = width if width is not None else max(lens) + page
    per = -(-W // page)  # pages per table row
    num_rows = B + 1
    num_pages = num_rows * per + 3
    pages = torch.randperm(num_pages, generator=g)[: num_rows * per].view(num_rows, per)
    table = (pages[:, :, None] * page + torch.arange(page)).view(num_rows, -1)[:, :W].to(torch.int32).contiguous()
    rows = torch.randperm(num_rows, generator=g)[:B]
    S = num_pages * page
    k = torch.randn(S, KV, dim, generator=g).to(dtype)
    v = torch.randn(S, KV, dim, generator=g).to(dtype)
    qv = torch.randn(B, H, dim, generator=g) * gain
    q = layout(qv.to(dtype), q_layout, g)
    what = (
        f"{B} request(s) of lengths {lens} (page-table rows {rows.tolist()} of width {W}, pages of {page}), {H} query "
        f"heads over {KV} KV heads, head_dim {dim}, {str(dtype).replace('torch.', '')}"
        + (f", q {q_layout}" if q_layout != "contiguous" else "")
    )
    to = lambda t: t.to(DEVICE)  # noqa: E731
    return Case(to(q), to(k), to(v), to(table), to(rows), to(torch.tensor(lens, dtype=torch.int32)), dim**-0.5, what)


def layout(q: torch.Tensor, how: str, g: torch.Generator) -> torch.Tensor:
    """``q`` with the same values in another memory layout (stride(2) stays 1)."""
    B, H, D = q.shape
    if how == "contiguous":
        return q
    if how == "qkv rows":  # the engine's: each token's q is the front of its fused qkv row
        buf = torch.randn(B, (H + 4) * D, generator=g).to(q.dtype)
        view = buf[:, : H * D].view(B, H, D)
        view.copy_(q)
        return view
    if how == "head-major":  # an [H, B, D] tensor transposed: stride(1) is B * D, not D
        return q.transpose(0, 1).contiguous().transpose(0, 1)
    raise ValueError(how)


def scores_of(c: Case, *, lens=None, rows=None, kv_head=None, q=None, scale=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores ``[B, H, W]`` (masked with -inf past the length) and values ``[B, W, H, D]``, in float64; the
    keyword arguments give what a usual mistake computes."""
    q = (c.q if q is None else q).cpu().double()
    k, v, table = c.k.cpu().double(), c.v.cpu().double(), c.table.cpu().long()
    B, H, _ = q.shape
    KV = k.shape[1]
    heads = torch.arange(H) // (H // KV) if kv_head is None else kv_head
    slots = table[c.rows.cpu().long() if rows is None else rows]  # [B, W]
    keys, values = k[slots][:, :, heads], v[slots][:, :, heads]  # [B, W, H, D]
    s = torch.einsum("bhd,bwhd->bhw", q, keys) * (c.scale if scale is None else scale)
    n = c.lens.cpu() if lens is None else lens
    mask = torch.arange(table.shape[1])[None, :] < n[:, None]
    return s.masked_fill(~mask[:, None, :], -INF), values


def reference(c: Case, **mistake) -> torch.Tensor:
    s, values = scores_of(c, **mistake)
    return torch.einsum("bhw,bwhd->bhd", torch.softmax(s, -1), values)


def _tol(dtype: torch.dtype) -> float:
    return 2e-5 if dtype == torch.float32 else 1.5e-2  # bfloat16: a few of its roundings


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    tol = _tol(dtype)
    return bool(((got.cpu().double() - want).abs() <= tol + tol * want.abs()).all())


def diagnose(c: Case, got: torch.Tensor, splits: int) -> str:
    """What usually gives ``got`` on this case (the pitfalls of the docstring), in lines of at most ~200
    characters, the pitfall's name first."""
    B, H, D = c.q.shape
    KV = c.k.shape[1]
    dt = c.q.dtype
    got = got.cpu()
    if not torch.isfinite(got.float()).all():
        if splits > 1 and int(c.lens.min()) < splits:
            n = int(c.lens.min())
            return (
                f"NaN or inf with {splits} parts and a request of {n} key(s): check that the parts cover every key "
                f"exactly once (none dropped where {splits} does not divide the length),\n"
                "that an empty part writes lse = -inf and that the merge leaves its row out; or the softmax without "
                "its running maximum (exp of scores in the hundreds overflows float32)"
            )
        return (
            "the softmax without its running maximum: the output holds inf or NaN.\n"
            "exp() of a score of a few hundred overflows float32 (exp(89) is inf): subtract the running maximum "
            "inside exp"
        )
    wide = torch.full_like(c.lens.cpu(), c.table.shape[1])
    if (c.lens.cpu() < wide).any():
        if _close(got, reference(c, lens=wide), dt):
            return (
                f"past the length: your kernel attended to all {c.table.shape[1]} positions of each page-table "
                "row;\nrequest b attends to its first lens[b] positions only"
            )
        if _close(got, reference(c, lens=c.lens.cpu() + 1), dt):
            return (
                "past the length: your kernel attended to one key past the last (position lens[b]):\na comparison "
                "at the end of a range that lets its bound in"
            )
    if H != KV and _close(got, reference(c, kv_head=torch.arange(H) % KV), dt):
        return (
            f"grouped-query heads: query head h uses KV head h // (H / KV) (here H = {H}, KV = {KV}: heads "
            f"0..{H // KV - 1} share KV head 0); you used h % KV"
        )
    if B > 1 and not torch.equal(c.rows.cpu(), torch.arange(B)):
        if _close(got, reference(c, rows=torch.arange(B)), dt):
            return (
                f"one page-table row for all: request b's keys are in row rows[b] of page_table (here rows = "
                f"{c.rows.tolist()}), not in row b"
            )
    store = c.q.untyped_storage().nbytes() // c.q.element_size() - c.q.storage_offset()
    for strides, how in [((H * D, D, 1), "as if it were contiguous"), ((c.q.stride(0), D, 1), "with head h at h * D")]:
        reach = sum((n - 1) * s for n, s in zip(c.q.shape, strides))
        if strides != c.q.stride() and reach < store:
            seen = torch.as_strided(c.q, c.q.shape, strides, c.q.storage_offset())
            if _close(got, reference(c, q=seen), dt):
                return (
                    f"q's strides: q is a view here (strides {tuple(c.q.stride())}) and your kernel read it {how};\n"
                    "element (b, h, d) of q is at b * q.stride(0) + h * q.stride(1) + d"
                )
    if _close(got, reference(c, scale=1.0), dt):
        return "the scale: scores are scale * (q . k), and the kernel left the scale out"
    rescale = (
        "the running sum and accumulator must be rescaled whenever the running maximum grows (a later block of keys "
        "that scores higher)"
    )
    if splits > 1:
        short = [n for n in c.lens.tolist() if n % splits]
        return (
            f"with {splits} parts: check that the parts cover every key exactly once: none dropped where {splits} "
            f"does not divide the length{' (' + str(short[:3])[1:-1] + ')' if short else ''}, none read past its "
            "own end (which counts keys twice);\n"
            f"the merge's weights; and {rescale}"
        )
    return f"{rescale};\nfor each request b and query head h: the softmax over its first lens[b] keys, in float32"


def expect(c: Case, splits: int, why: str = "", out: torch.Tensor | None = None, partial=None) -> torch.Tensor:
    """Your decode on ``c`` equals the reference; returns what it returned."""
    got = lab.decode(*c.args(splits), out, partial)
    B, H, D = c.q.shape
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != (B, H, D) or got.dtype != c.q.dtype:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise AssertionError(
            f"decode returned {shape} {getattr(got, 'dtype', '')}, expected a [B, H, D] = {(B, H, D)} tensor of q's "
            f"dtype {c.q.dtype} ({c.what}, {splits} parts)"
        )
    want = reference(c)
    if not _close(got, want, c.q.dtype):
        err = torch.nan_to_num((got.cpu().double() - want).abs(), nan=INF)
        b, h, d = (int(i) for i in torch.unravel_index(err.argmax(), err.shape))
        raise AssertionError(
            f"{why + ': ' if why else ''}{diagnose(c, got, splits)}\n  out[{b}, {h}, {d}] = {got[b, h, d].item():.5g}, "
            f"expected {want[b, h, d].item():.5g}; the case: {c.what}, {splits} part(s)"
        )
    return got


# ---- the partial buffers ------------------------------------------------------------------------------
def garbage_partial(rows: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial buffers of ``rows`` rows filled with NaN: a part left unwritten shows."""
    return (
        torch.full((rows, dim), NAN, dtype=torch.float32, device=DEVICE),
        torch.full((rows,), NAN, dtype=torch.float32, device=DEVICE),
    )


def check_partial(c: Case, splits: int, part: torch.Tensor, lse: torch.Tensor, why: str) -> None:
    """The contract of the partial buffers after ``decode`` with ``splits > 1``: entry ``(b * H + h) * splits
    + i``; the parts' log-sum-exps (natural log) combine into the whole row's, ``-inf`` exactly for an empty
    part; their outputs weighted by ``exp(lse_i - lse)`` give the attention; rows past ``B * H * splits``
    untouched."""
    B, H, D = c.q.shape
    n = B * H * splits
    s, values = scores_of(c)
    full = torch.logsumexp(s, -1)  # [B, H]
    want = torch.einsum("bhw,bwhd->bhd", torch.softmax(s, -1), values)
    lse_all, part_all = lse.cpu().double(), part.cpu().double()
    if torch.isfinite(lse_all[n:]).any() or torch.isfinite(part_all[n:]).any():
        raise AssertionError(
            f"{why}: decode wrote rows past B * H * splits = {n} of the partial buffers (they hold "
            f"{lse.shape[0]} rows): only entries (b * H + h) * splits + i for b < B, h < H, i < splits are yours"
        )
    got = lse_all[:n].view(B, H, splits)
    parts = part_all[:n].view(B, H, splits, D)
    if torch.isnan(got).any() or (got == INF).any():
        b, h, i = (int(x) for x in torch.nonzero(torch.isnan(got) | (got == INF))[0])
        empty = "" if int(c.lens[b]) >= splits else f" (request {b} has {int(c.lens[b])} keys: some parts are empty)"
        raise AssertionError(
            f"{why}: an empty part must write lse = -inf (every part writes its lse), a part with keys the natural "
            f"log of its sum of exp(score):\n  lse[({b} * H + {h}) * splits + {i}] = {got[b, h, i].item()} (the buffer "
            f"was filled with NaN before the call){empty}\n  the case: {c.what}, {splits} parts"
        )
    for b in range(B):
        finite = int(torch.isfinite(got[b, 0]).sum())
        if finite > int(c.lens[b]):
            raise AssertionError(
                f"{why}: a part with no key must write lse = -inf: request {b} has {int(c.lens[b])} key(s) but "
                f"{finite} parts with a finite lse\n  the case: {c.what}, {splits} parts"
            )
    combined = torch.logsumexp(got, -1)
    tol = 1e-4 if c.q.dtype == torch.float32 else 2e-3
    if not bool(((combined - full).abs() <= tol * (1 + full.abs())).all()):
        b, h = (int(x) for x in torch.unravel_index((combined - full).abs().argmax(), full.shape))
        ratio = (combined[b, h] / full[b, h]).item() if full[b, h] != 0 else NAN
        base2 = torch.logsumexp(got * math.log(2), -1)
        hint = (
            "the log-sum-exp in base 2: lse must be the natural log of the sum of exp(score) over the part's keys "
            f"(yours are 1 / ln 2 = {1 / math.log(2):.4f} times too large)"
            if bool(((base2 - full).abs() <= tol * (1 + full.abs())).all())
            else "lse of a part: the natural log of the sum of exp(score) over its keys (the running maximum plus the "
            "log of the running sum); the parts must cover every key exactly once"
        )
        raise AssertionError(
            f"{why}: {hint}\n  the parts' lse of request {b}, head {h} combine to {combined[b, h]:.6g} (log of the "
            f"sum of their exp), the whole row's log-sum-exp is {full[b, h]:.6g} (ratio {ratio:.4f})\n"
            f"  the case: {c.what}, {splits} parts"
        )
    weights = torch.where(torch.isfinite(got), torch.exp(got - full[..., None]), 0.0)
    mixed = torch.einsum("bhs,bhsd->bhd", weights, torch.nan_to_num(parts) * torch.isfinite(got)[..., None])
    if not _close(mixed, want, c.q.dtype):
        raise AssertionError(
            f"{why}: the part rows, weighted by exp(lse_i - lse of the row), do not give the attention: each part's "
            "row must be the attention over its own keys\n  (its own softmax, divided by its own sum), at entry "
            f"(b * H + h) * splits + i\n  the case: {c.what}, {splits} parts"
        )


def expect_partial(c: Case, splits: int, why: str, spare: int = 5) -> None:
    """decode with given partial buffers (``spare`` rows more than needed, NaN) and a given ``out``."""
    B, H, D = c.q.shape
    part, lse = garbage_partial(B * H * splits + spare, D)
    out = torch.full(c.q.shape, 7.0, dtype=c.q.dtype, device=DEVICE)
    got = expect(c, splits, why, out=out, partial=(part, lse))
    if got.data_ptr() != out.data_ptr():
        raise AssertionError(
            f"{why}: decode returned a new tensor; with out given it writes out in place and returns it"
        )
    if splits == 1:
        if not (bool(torch.isnan(part).all()) and bool(torch.isnan(lse).all())):
            raise AssertionError(
                f"{why}: with splits == 1 nothing but out is written: decode wrote into the partial buffers it was "
                f"given (one part is the whole attention: no merge)\n  the case: {c.what}"
            )
        return
    check_partial(c, splits, part, lse, why)


# ---- the merge on its own -----------------------------------------------------------------------------
def merge_case(lse: list[list[list[float]]], seed: int, dim: int = 16):
    """Partial buffers for ``lse[b][h][i]`` (-inf: an empty part, whose row is NaN), random part rows,
    and the expected ``out``."""
    g = torch.Generator().manual_seed(seed)
    B, H, splits = len(lse), len(lse[0]), len(lse[0][0])
    lse_t = torch.tensor(lse, dtype=torch.float64)
    parts = torch.randn(B, H, splits, dim, generator=g, dtype=torch.float64)
    parts[torch.isinf(lse_t)] = NAN
    w = torch.softmax(lse_t, -1)
    want = torch.einsum("bhs,bhsd->bhd", w, torch.nan_to_num(parts))
    part = parts.view(-1, dim).float().to(DEVICE)
    return part, lse_t.view(-1).float().to(DEVICE), want, (B, H, dim, splits)


def expect_merge(lse: list, seed: int, why: str, dtype: torch.dtype = torch.float32) -> None:
    part, lse_t, want, (B, H, D, splits) = merge_case(lse, seed)
    out = torch.full((B, H, D), 7.0, dtype=dtype, device=DEVICE)
    lab.merge(part, lse_t, out, splits)
    if _close(out, want, dtype):
        return
    got = out.cpu().double()
    err = torch.nan_to_num((got - want).abs(), nan=INF)
    b, h, d = (int(i) for i in torch.unravel_index(err.argmax(), err.shape))
    row = lse_t.view(B, H, splits)[b, h].tolist()
    l2 = torch.tensor(row, dtype=torch.float64)
    parts = part.view(B, H, splits, D)[b, h].cpu().double()
    base2 = torch.softmax(l2 * math.log(2), -1) @ torch.nan_to_num(parts)
    if torch.isnan(got[b, h]).any() and any(x == -INF for x in row):
        hint = (
            "an empty part (lse = -inf) has a row of NaN here, and your merge let it into the sum: 0 * NaN is NaN.\n"
            "  Leave its row out (a masked load, or tl.where), not just its weight at 0"
        )
    elif not torch.isfinite(got[b, h]).all() or max(abs(x) for x in row if x != -INF) > 80:
        hint = (
            "the merge without the maximum: exp(lse) overflows float32 past 88 (and underflows to 0 below -103); "
            "weigh each part by exp(lse_i - max lse)"
        )
    elif torch.allclose(got[b, h], base2, atol=1e-4):
        hint = "the weights in base 2: lse is a natural log, so part i weighs exp(lse_i - max), not 2^(lse_i - max)"
    else:
        hint = (
            "out = the weighted mean of the parts' rows with weights exp(lse_i - max lse) (0 for an empty part), "
            "divided by the sum of the weights; entry (b * H + h) * splits + i"
        )
    raise AssertionError(
        f"{why}: {hint}\n  merge of lse {[round(x, 4) for x in row]} (request {b}, head {h}, {splits} parts): "
        f"out[{b}, {h}, {d}] = {got[b, h, d].item():.5g}, expected {want[b, h, d].item():.5g}"
    )


# ---- the docstring's examples -------------------------------------------------------------------------
def docstring_case() -> Case:
    D = 16
    k = torch.zeros(6, 1, D)
    v = torch.zeros(6, 1, D)
    k[4, 0, 0] = 1.0  # k0 at slot 4, k1 at slot 2 (zero)
    v[4, 0, 0] = 1.0
    v[2, 0, 1] = 1.0
    q = torch.zeros(1, 1, D)
    q[0, 0, 0] = math.log(3)
    table = torch.tensor([[4, 2, 0, 0]], dtype=torch.int32)
    to = lambda t: t.to(DEVICE)  # noqa: E731
    lens, rows = torch.tensor([2], dtype=torch.int32), torch.tensor([0])
    what = "the docstring's example (q = (ln 3), keys (1) and (0), values (1) and (0, 1))"
    return Case(to(q), to(k), to(v), to(table), to(rows), to(lens), 1.0, what)


@points(4)
def test_docstring_examples():
    """The docstring's two examples: out = (0.75, 0.25) with 1, 2 and 3 parts (the partial buffers with 2
    and 3), and the merge of ``lse = [ln 3, -inf, 0]`` and of the same plus 1000."""
    c = docstring_case()
    for splits in (1, 2, 3):
        got = expect(c, splits, "the docstring's example")
        assert abs(got[0, 0, 0].item() - 0.75) < 1e-5 and abs(got[0, 0, 1].item() - 0.25) < 1e-5, got[0, 0, :2]
    expect_partial(c, 2, "the docstring's example, partial buffers")
    expect_partial(c, 3, "the docstring's example, three parts (one empty at least)")
    for shift in (0.0, 1000.0):
        expect_merge([[[shift + math.log(3), -INF, shift]]], seed=0, why=f"the docstring's merge example (+{shift:g})")


# ---- the merge on its own -----------------------------------------------------------------------------
@points(5)
def test_merge_weighs_parts_by_their_lse():
    """Two requests, two heads, 4 parts of known log-sum-exps (natural log: a part whose lse is 1 more weighs
    e times more), and one part alone (``splits = 1``: out is its row)."""
    expect_merge(
        [[[0.0, 1.0, -0.5, 2.0], [3.0, 3.0, 3.0, 3.0]], [[-2.0, 0.7, 0.1, -1.3], [5.0, 1.0, 0.0, 2.5]]],
        seed=1,
        why="4 parts",
    )
    expect_merge([[[0.3]], [[-4.0]]], seed=2, why="one part per row")
    expect_merge([[[1.0, 0.0, 2.0]]], seed=3, why="a bfloat16 out", dtype=torch.bfloat16)


@points(5)
def test_merge_leaves_empty_parts_out():
    """Empty parts (``lse = -inf``, rows of NaN) first, in the middle and last, and a row with one part that
    has keys: the merge must leave them out, whatever their rows hold."""
    expect_merge(
        [[[-INF, 0.5, -INF, 1.5], [2.0, -INF, -INF, -INF]], [[-INF, -INF, -INF, 0.0], [0.1, 0.2, -INF, 0.3]]],
        seed=4,
        why="empty parts",
    )


@points(3)
def test_merge_with_large_lse():
    """Log-sum-exps in the hundreds and in the minus hundreds (scores of a sharp attention): ``exp`` of them
    overflows (underflows) float32 unless the row's maximum is subtracted first."""
    expect_merge([[[500.0, 501.0, 499.5]], [[-700.0, -701.5, -699.0]]], seed=5, why="large lse")


# ---- decode: the partial buffers ----------------------------------------------------------------------
@points(7)
def test_partial_buffers():
    """decode with given partial buffers (more rows than needed, filled with NaN) and a given ``out``: the
    entries ``(b * H + h) * splits + i``, each part's own attention and natural-log lse, ``-inf`` for the
    empty parts (a request of 2 keys in 5 parts), nothing written past ``B * H * splits`` rows; with one part,
    nothing written into them at all."""
    c = make_case([2, 37, 70, 9], heads=(4, 2), page=4, seed=10)
    for splits in (3, 5, 1):
        expect_partial(c, splits, f"{splits} part(s), partial buffers given")


# ---- decode: the fixed cases --------------------------------------------------------------------------
@points(6)
def test_grouped_query_heads():
    """1, 2, 4 and 8 query heads per KV head (query heads 0..H/KV-1 use KV head 0), with 1 and 3 parts."""
    for heads, splits in (((2, 2), 3), ((4, 2), 1), ((8, 2), 3), ((8, 1), 1)):
        expect(make_case([9, 40], heads=heads, seed=11 + heads[0]), splits, f"{heads[0]} heads over {heads[1]}")


@points(5)
def test_scattered_pages_and_table_rows():
    """Pages of 1 and of 16 slots scattered over the pool, each request's keys in page-table row ``rows[b]``
    (not row ``b``)."""
    expect(make_case([30, 5, 47], page=1, seed=20), 2, "pages of 1")
    expect(make_case([33, 16, 12], page=16, seed=21), 3, "pages of 16")


@points(6)
def test_ragged_lengths_and_part_counts():
    """Lengths 1, 5, 64 and 71 with 1, 2, 3, 5 and 7 parts: counts that do not divide the lengths, and more
    parts than keys (empty parts)."""
    c = make_case([1, 5, 64, 71], heads=(2, 1), seed=30)
    for splits in (1, 2, 3, 5, 7):
        expect(c, splits, f"{splits} parts")


@points(5)
def test_large_scores():
    """Scores in the hundreds (a sharp attention): ``exp`` of them overflows float32 unless the running
    maximum is subtracted."""
    expect(make_case([20, 45], gain=60.0, seed=40), 1, "large scores")
    expect(make_case([20, 45], gain=60.0, seed=41), 3, "large scores")


def rising_case(length: int, seed: int) -> Case:
    """Each key scores higher than the one before (``k_j`` along ``q``, growing with ``j``): the maximum grows
    with every block of keys."""
    c = make_case([length], heads=(2, 1), seed=seed)
    slots = c.table[c.rows[0], :length].long()
    direction = c.q[0, 0].float() / c.q[0, 0].float().norm()
    ramp = torch.linspace(0.0, 24.0, length, device=c.q.device)[:, None] * direction
    c.k[slots, 0] = (ramp * c.q.shape[2] ** 0.5).to(c.k.dtype)
    return replace(c, what=c.what + ", scores rising along the keys")


@points(5)
def test_rising_scores():
    """One request of 200 keys whose scores rise from the first key to the last, in 1 and 2 parts: every new
    block of keys raises the maximum, so the running sum and accumulator must be rescaled each time."""
    c = rising_case(200, seed=50)
    expect(c, 1, "rising scores")
    expect(c, 2, "rising scores")


@points(5)
def test_past_the_length_is_not_attended():
    """A page-table row wider than the request, whose slots past ``lens[b]`` hold keys that score high and
    large values: attending to them changes the output a lot."""
    c = make_case([3, 18], heads=(2, 2), width=40, seed=60)
    for b, n in enumerate(c.lens.tolist()):
        past = c.table[c.rows[b], n:].long()
        c.k[past] = c.q[b].mean(0).to(c.k.dtype) * 4
        c.v[past] = 50.0
    expect(c, 1, "past the length")
    expect(c, 2, "past the length")


@points(5)
def test_bfloat16():
    """bfloat16 q, K and V (float32 inside), 4 query heads per KV head, head_dim 32, 1 and 3 parts."""
    c = make_case([21, 7, 40], heads=(8, 2), dim=32, dtype=torch.bfloat16, seed=70)
    expect(c, 1, "bfloat16")
    expect(c, 3, "bfloat16")


@points(4)
def test_strided_q_and_a_given_out():
    """q as the front of each token's fused qkv row (``stride(0)`` larger than ``H * D``) and head-major
    (``stride(1)`` is ``B * D``); ``out`` given: written in place and returned."""
    expect(make_case([6, 19], q_layout="qkv rows", seed=80), 3, "q from fused qkv rows")
    c = make_case([6, 19], q_layout="head-major", seed=81)
    expect(c, 1, "q head-major")
    for splits in (1, 3):
        out = torch.full(c.q.shape, 7.0, dtype=c.q.dtype, device=DEVICE)
        got = expect(c, splits, "out given", out=out)
        assert got.data_ptr() == out.data_ptr() and _close(out, reference(c), c.q.dtype), (
            f"out given ({splits} parts): decode must write the given out in place and return it (it returned "
            f"{'another tensor' if got.data_ptr() != out.data_ptr() else 'out, but out does not hold the result'})"
        )


# ---- the checks, one argument at a time ---------------------------------------------------------------
def _valid() -> Case:
    return make_case([3, 4], heads=(4, 2), seed=90)


def expect_rejected(c: Case, what: str, hint: str, kinds, splits: int = 2, out=None, partial=None) -> None:
    try:
        lab.decode(*c.args(splits), out, partial)
    except kinds:
        return
    except NotImplementedError:
        raise  # a stub: its own message
    except Exception as e:  # noqa: BLE001  (what it raised instead is the message)
        raise AssertionError(
            f"decode with {what} raised {type(e).__name__} ({str(e).splitlines()[0][:120] if str(e) else ''}) instead "
            f"of {' or '.join(k.__name__ for k in kinds)}: {hint}"
        ) from None
    raise AssertionError(
        f"decode with {what} returned instead of raising {' or '.join(k.__name__ for k in kinds)}: {hint}"
    )


def expect_accepted(c: Case, what: str, hint: str, splits: int, out=None, partial=None) -> None:
    try:
        expect(c, splits, what, out=out, partial=partial)
    except (ValueError, TypeError) as e:
        raise AssertionError(f"decode with {what} raised {type(e).__name__} ({e}): {hint}") from None


@points(4)
def test_rejects_wrong_inputs():
    """TypeError for each wrong dtype and ValueError for each wrong shape or stride the contract lists, one
    argument wrong at a time (k_slots and v_slots each on their own; out compared dimension by dimension), for
    decode and for merge."""
    lab.decode(*_valid().args(1))  # a stub fails here, with its own message
    c = _valid()
    B, H, D = c.q.shape
    each = "each of k_slots and v_slots is checked on its own against q's dtype (does your check look at one of them?)"
    for case, what, hint in [
        (replace(c, q=c.q.double(), k=c.k.double(), v=c.v.double()), "float64 tensors", "q: float32/bf16/fp16"),
        (replace(c, k=c.k.bfloat16()), "a bfloat16 k_slots (q is float32)", each),
        (replace(c, v=c.v.bfloat16()), "a bfloat16 v_slots (q is float32)", each),
        (replace(c, table=c.table.long()), "an int64 page_table", "page_table must be int32"),
        (replace(c, lens=c.lens.long()), "int64 lens", "lens must be int32"),
        (replace(c, rows=c.rows.float()), "float rows", "rows must be int32 or int64"),
    ]:
        expect_rejected(case, what, hint, (TypeError,))
    bf16_out = torch.zeros(c.q.shape, dtype=torch.bfloat16, device=DEVICE)
    expect_rejected(c, "a bfloat16 out (q is float32)", "out must have q's dtype", (TypeError,), out=bf16_out)
    f64 = (torch.zeros(B * H * 2, D, device=DEVICE, dtype=torch.float64), torch.zeros(B * H * 2, device=DEVICE))
    expect_rejected(c, "a float64 part buffer", "the partial buffers must be float32", (TypeError,), partial=f64)
    strided = lambda x: torch.cat([x, x], -1)[..., ::2]  # noqa: E731  (the same values, stride 2)
    for case, what, hint in [
        (replace(c, q=c.q[0]), "a 2-D q", "q is [B, H, D]"),
        (replace(c, q=strided(c.q)), "a q with stride(2) == 2", "q.stride(2) must be 1"),
        (replace(c, v=c.v[:, :1]), "v_slots of another shape than k_slots", "k_slots and v_slots share one shape"),
        (replace(c, k=c.k[..., :8], v=c.v[..., :8]), "k/v of head_dim 8 (q's is 16)", "k_slots is [S, KV, D]"),
        (replace(c, k=strided(c.k)), "a non-contiguous k_slots", "k_slots must be contiguous"),
        (replace(c, q=c.q[:, :3]), "3 query heads over 2 KV heads", "H must be a multiple of KV"),
        (replace(c, table=c.table.t().contiguous().t()), "a column-major page_table", "page_table.stride(1) == 1"),
        (replace(c, lens=c.lens[:1]), "one length for two requests", "lens is [B]"),
        (replace(c, rows=c.rows[:1]), "one row for two requests", "rows is [B]"),
    ]:
        expect_rejected(case, what, hint, (ValueError,))
    dims = "out must have q's shape, each dimension (the same number of elements is not enough)"
    expect_rejected(c, "out of shape [B, D, H]", dims, (ValueError,), 1, out=torch.zeros(B, D, H, device=DEVICE))
    small = (torch.zeros(B * H * 2 - 1, D, device=DEVICE), torch.zeros(B * H * 2, device=DEVICE))
    expect_rejected(
        c, "a part buffer one row short", "each partial buffer needs B * H * splits rows", (ValueError,), partial=small
    )
    short = (torch.zeros(B * H * 2, D, device=DEVICE), torch.zeros(B * H * 2 - 1, device=DEVICE))
    expect_rejected(
        c, "an lse buffer one row short", "each partial buffer needs B * H * splits rows", (ValueError,), partial=short
    )
    wide = (torch.zeros(B * H * 2, D + 1, device=DEVICE), torch.zeros(B * H * 2, device=DEVICE))
    expect_rejected(c, "part rows of D + 1", "part is [N, D]", (ValueError,), partial=wide)
    merge_rejects()


def merge_rejects() -> None:
    """merge's own checks, one argument wrong at a time (2 requests, 2 heads, D = 16, 3 parts)."""
    part, lse, _, (B, H, D, splits) = merge_case([[[0.0, 1.0, 2.0]] * 2] * 2, seed=92)
    out = torch.zeros(B, H, D, device=DEVICE)
    for args, what, hint, kinds in [
        ((part, lse, out, 0), "splits = 0", "splits >= 1", (ValueError,)),
        (
            (part, lse[:-1], out, splits),
            "an lse buffer one row short",
            "each buffer needs B * H * splits rows",
            (ValueError,),
        ),
        (
            (part[:-1], lse, out, splits),
            "a part buffer one row short",
            "each buffer needs B * H * splits rows",
            (ValueError,),
        ),
        ((part.double(), lse, out, splits), "a float64 part buffer", "the buffers are float32", (TypeError,)),
        ((part, lse, out[0], splits), "a 2-D out", "out is [B, H, D]", (ValueError,)),
    ]:
        try:
            lab.merge(*args)
        except kinds:
            continue
        except NotImplementedError:
            raise  # a stub: its own message
        except Exception as e:  # noqa: BLE001
            raise AssertionError(
                f"merge with {what} raised {type(e).__name__} ({str(e).splitlines()[0][:120] if str(e) else ''}) "
                f"instead of {kinds[0].__name__}: {hint} (merge checks its own arguments)"
            ) from None
        raise AssertionError(
            f"merge with {what} returned instead of raising {kinds[0].__name__}: {hint} (merge checks its own "
            "arguments)"
        )


@points(3)
def test_checks_at_their_bounds():
    """The values on the contract's bounds pass: ``splits = 1``, head_dim 16, partial buffers of exactly ``B * H
    * splits`` rows, int32 rows; the ones just past them raise ValueError (``splits = 0``, head_dim 8 and 24)."""
    c = _valid()
    B, H, D = c.q.shape
    expect_accepted(c, "splits = 1", "splits >= 1: one part is valid (the engine's usual case)", 1)
    exact = (torch.zeros(B * H * 3, D, device=DEVICE), torch.zeros(B * H * 3, device=DEVICE))
    expect_accepted(
        c, "partial buffers of exactly B * H * splits rows", "N >= B * H * splits: N == is enough", 3, partial=exact
    )
    expect_rejected(c, "splits = 0", "splits >= 1", (ValueError,), splits=0)
    expect_accepted(replace(c, rows=c.rows.int()), "int32 rows (what a CUDA graph passes)", "rows: int32 or int64", 2)
    for dim in (8, 24):
        odd = make_case([3, 4], heads=(4, 2), dim=dim, seed=91)
        expect_rejected(odd, f"head_dim {dim}", "head_dim: a power of two, at least 16", (ValueError,), splits=1)


@points(2)
def test_a_refused_call_writes_nothing():
    """A call with a wrong argument (lens of ``B + 1`` entries) raises before anything is launched: ``out`` and
    the partial buffers are as they were."""
    c = _valid()
    B, H, D = c.q.shape
    out = torch.full(c.q.shape, 7.0, device=DEVICE)
    part, lse = garbage_partial(B * H * 2, D)
    bad = replace(c, lens=torch.cat([c.lens, c.lens[:1]]))
    expect_rejected(bad, "lens of B + 1 entries", "lens is [B]", (ValueError,), out=out, partial=(part, lse))
    assert bool((out == 7.0).all()) and bool(torch.isnan(lse).all()), (
        "the order of the checks: decode raised ValueError for lens of B + 1 entries after it had launched a kernel "
        "(out or the partial buffers changed). Check every argument first, then launch"
    )


# ---- random batches -----------------------------------------------------------------------------------
def random_case(rng: random.Random) -> tuple[Case, int]:
    heads = rng.choice([(1, 1), (2, 1), (4, 2), (8, 2), (4, 4), (8, 1)])
    page = rng.choice([1, 4, 16])
    lens = [rng.choice([1, 2, page, page + 1, rng.randint(1, 90)]) for _ in range(rng.randint(1, 3))]
    c = make_case(
        lens,
        heads=heads,
        dim=rng.choice([16, 32]),
        page=page,
        dtype=rng.choice([torch.float32, torch.bfloat16]),
        seed=rng.randrange(10**6),
        width=max(lens) + rng.choice([0, 3, 17]),
        q_layout=rng.choice(["contiguous", "qkv rows", "head-major"]),
        gain=rng.choice([1.0, 1.0, 8.0, 40.0]),  # 40: scores past exp's float32 range
    )
    return c, rng.choice([1, 2, 3, 4, 6])


@points(7)
def test_random_batches_match_torch():
    """18 random decode batches (1-3 requests of 1-90 keys, pages of 1, 4 or 16, 1-8 query heads per KV head,
    head_dim 16 or 32, float32 and bfloat16, strided q, large scores, 1-6 parts; half of them with ``out`` and
    NaN-filled partial buffers given, whose contract is checked too), then 10 random merges (empty parts of
    NaN rows, lse up to the hundreds)."""
    rng = random.Random(16)
    failures = []
    for i in range(18):
        c, splits = random_case(rng)
        try:
            if i % 2:
                expect_partial(c, splits, "random batch", spare=rng.choice([0, 3]))
            else:
                expect(c, splits, "random batch")
        except AssertionError as e:
            failures.append((c.q.numel() * c.table.shape[1], str(e)))
    for i in range(10):
        splits = rng.randint(1, 6)
        lse = [
            [[rng.choice([-INF, rng.uniform(-3, 3), rng.uniform(-300, 300)]) for _ in range(splits)] for _ in range(2)]
            for _ in range(rng.randint(1, 2))
        ]
        for row in (r for b in lse for r in b):
            if all(x == -INF for x in row):
                row[rng.randrange(splits)] = rng.uniform(-3, 3)  # at least one part with keys
        try:
            expect_merge(lse, seed=100 + i, why="random merge")
        except AssertionError as e:
            failures.append((splits, str(e)))
    if failures:
        failures.sort(key=lambda f: f[0])
        raise AssertionError(f"{len(failures)} of 28 random cases differ; the smallest:\n{failures[0][1]}")


# ---- the engine on your kernel ------------------------------------------------------------------------
PARTS = (2, 1, 3)  # the engine's CPU plan takes 1 part: the grader cycles through these instead


def _rounds(model, seed: int = 16) -> list[list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    vocab = ModelConfig.from_path(model).vocab_size
    ids = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    system = ids(13)
    return [
        [system + ids(1)],  # 14 tokens
        [system + ids(6), ids(2), system[:5] + ids(9)],  # three lengths at once, one cached prefix
    ]


def _engine_check(model, **args) -> None:
    """The engine's ``triton`` backend decoding through your ``decode`` gives the torch backend's tokens; every
    call is also compared with attention in torch on the engine's own tensors, in 2, 1 or 3 parts in turn."""
    lab.decode(*make_case([2], seed=99).args(2))  # a stub fails here with its message
    fn, calls = lab.kernel(), [0]

    def checked(q, k_slots, v_slots, page_table, rows, lens, scale, splits, out=None, partial=None):
        if partial is None:
            splits = PARTS[calls[0] % len(PARTS)]
        calls[0] += 1
        got = fn(q, k_slots, v_slots, page_table, rows, lens, scale, splits, out, partial)
        c = Case(
            q, k_slots, v_slots, page_table, rows, lens, scale, f"a decode step of the engine (lengths {lens.tolist()})"
        )
        if not isinstance(got, torch.Tensor) or not _close(got, reference(c), q.dtype):
            bad = got if isinstance(got, torch.Tensor) else torch.full(q.shape, NAN)
            raise AssertionError(
                f"inside the engine, {c.what}, {splits} parts: your decode's output differs: {diagnose(c, bad, splits)}"
            )
        return got

    rounds = _rounds(model)
    with lab.engine_decoding_with(checked), engine_failure(f"your decode kernel ({args})"):
        got, _, _ = generate_rounds(model, rounds, max_tokens=5, attention_backend="triton", **args)
    want, _, _ = generate_rounds(model, rounds, max_tokens=5, attention_backend="torch", **args)
    assert calls[0] > 0, "the engine never ran your decode (its triton backend decodes with it)"
    diff = first_token_difference([x for r in got for x in r], [x for r in want for x in r])
    assert diff is None, f"with your decode in the triton backend the engine generated other tokens: {diff}"


@points(5, timeout=120)
@engine
def test_engine_with_your_kernel(tiny_llama):
    """The engine (tiny Llama: 4 heads over 2, head_dim 16) on the triton backend, pages of 4, decodes with your
    kernel and generates the greedy tokens of the torch backend."""
    _engine_check(tiny_llama, page_size=4, num_pages=96)


@points(4, timeout=120)
@engine
def test_engine_qwen3_pages_of_16(tiny_qwen3):
    """The same with tiny Qwen3 (head_dim 32, q/k norms) on pages of 16."""
    _engine_check(tiny_qwen3, page_size=16, num_pages=24)
