"""Lab 04 (attention over pages): the key mask, the metadata and the attention math against brute-force
oracles, the whole backend against the engine's ``TorchBackend`` on ragged batches, then the engine
running on your backend. Run: ``python -m autograder lab04``."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autograder.adapters import lab04 as lab
from autograder.checks import Pitfall, check_tensor, describe, first_token_difference, ulp
from autograder.engine_runs import generate_rounds
from autograder.points import engine, points
from minisgl.attention import TorchBackend
from minisgl.core import Batch, Req, SamplingParams
from minisgl.kvcache.pool import KVPool
from minisgl.kvcache.table import TensorReqTable
from minisgl.models.config import ModelConfig

CPU = torch.device("cpu")


# ---- brute-force oracles ----------------------------------------------------------------------------
def brute_mask(
    starts: list[int], ends: list[int], *, offset: bool = True, strict: bool = False, past_end: bool = False
) -> torch.Tensor:
    """The key mask one token at a time (``offset=False``/``strict=True``/``past_end=True``: three wrong
    answers; ``past_end``: each token also sees the key one past its position)."""
    rows = []
    for s, e in zip(starts, ends):
        for p in range(s, e):
            q = (p if offset else p - s) + past_end
            rows.append([(k < q if strict else k <= q) for k in range(max(ends))])
    return torch.tensor(rows, dtype=torch.bool).reshape(-1, max(ends))


def decode_only_new(starts: list[int], ends: list[int]) -> torch.Tensor:
    return torch.tensor([[k == e - 1 for k in range(max(ends))] for e in ends], dtype=torch.bool)


def mask_text(mask: torch.Tensor) -> str:
    return "\n".join("    " + "".join("x" if b else "." for b in row) for row in mask.tolist())


def check_mask(got, starts: list[int], ends: list[int]) -> None:
    want = brute_mask(starts, ends)
    what = f"key_mask(starts={starts}, ends={ends})"
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what}: expected a bool tensor, got {type(got).__name__}")
    decode = all(e - s == 1 for s, e in zip(starts, ends))
    if got.shape != want.shape or got.dtype != torch.bool:
        shortcut = (
            "\none row per request: the decode shortcut (one query per request, at ends[i] - 1) holds only when "
            "every request extends one token; this batch mixes decode rows and prefills"
            if not decode and got.ndim == 2 and got.shape[0] == len(starts)
            else ""
        )
        raise AssertionError(
            f"{what}: expected a bool tensor of shape {list(want.shape)} (one row per token of the flat batch, one "
            f"column per key position up to max(ends)), got {describe(got)}{shortcut}"
        )
    if torch.equal(got.cpu(), want):
        return
    wrongs = [
        (
            brute_mask(starts, ends, offset=False),
            "positions counted from the first new token: forgot the cached prefix",
        ),
        (brute_mask(starts, ends, strict=True), "`<` instead of `<=`: a token must see itself (key p = its position)"),
        (decode_only_new(starts, ends), "the decode row attends only the new token: it sees all keys 0..ends[i]-1"),
        (
            brute_mask(starts, ends, past_end=True),
            "a row also sees the key one past its position (key ends[i] for a decode row): `<=` where `<` belongs; "
            "key positions >= ends[i] are never seen",
        ),
        (
            torch.ones_like(want),
            "the padding keys are not masked: a request must never see key positions >= its own end",
        ),
    ]
    cause = next((why for wrong, why in wrongs if torch.equal(got.cpu(), wrong)), None)
    if cause is None and decode:
        cause = "in a decode batch row i is one query at position ends[i]-1, seeing keys 0..ends[i]-1"
    elif cause is None:
        cause = "the token at position p = starts[i] + t sees key positions 0..p (x = may attend)"
    raise AssertionError(
        f"{what}: wrong mask ({cause}).\nexpected (x = may attend):\n{mask_text(want)}\ngot:\n{mask_text(got.cpu())}"
    )


def exact_attention(
    q: torch.Tensor,
    k_slots: torch.Tensor,
    v_slots: torch.Tensor,
    kv_slots: torch.Tensor,
    token_req: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    head_of: Callable[[int, int, int], int] = lambda h, heads, kv: h // (heads // kv),
    softmax_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Attention one token and one head at a time, in float64 (``softmax_dtype``: a wrong answer that
    rounds the probabilities). ``mask=None``: every key position of ``kv_slots`` (a wrong answer)."""
    n, heads, dim = q.shape
    kv = k_slots.shape[1]
    out = torch.zeros(n, heads, dim, dtype=torch.float64)
    for t in range(n):
        keep = mask[t] if mask is not None else torch.ones(kv_slots.shape[1], dtype=torch.bool)
        slots = kv_slots[token_req[t]][keep.cpu()]
        for h in range(heads):
            g = head_of(h, heads, kv)
            keys, values = k_slots[slots, g].double(), v_slots[slots, g].double()
            p = torch.softmax(keys @ q[t, h].double() * scale, dim=0)
            if softmax_dtype is not None:
                p = torch.softmax((keys @ q[t, h].double() * scale).float(), dim=0).to(softmax_dtype).double()
            out[t, h] = p @ values
    return out.reshape(n, heads * dim)


# ---- a paged KV pool, a request table and a batch, without an engine -----------------------------------
@dataclass
class Scenario:
    pool: KVPool
    table: TensorReqTable
    batch: Batch
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    heads: int
    head_dim: int


def make_scenario(
    page_size: int,
    spans: list[tuple[int, int]],
    *,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    layers: int = 2,
    rows: list[int] | None = None,
    scale_qk: float = 1.0,
) -> Scenario:
    """Request ``i`` extends positions ``spans[i] = (start, end)`` over a cached prefix ``[0, start)`` whose
    K/V are random numbers in the pool. Pages are handed out in a shuffled order (slots are never
    positions); ``rows`` picks the request-table rows (default: as the table hands them out)."""
    g = torch.Generator().manual_seed(seed)
    max_len = max(e for _, e in spans) + 2  # room for the decode step after this batch
    num_pages = sum(-(-max_len // page_size) for _ in spans) + 3
    pool = KVPool(layers, num_pages, page_size, kv_heads, head_dim, dtype, CPU)
    pool.buffer.copy_(torch.randn(pool.buffer.shape, generator=g).to(dtype))  # stale data everywhere
    table = TensorReqTable(max(8, len(spans)), -(-max_len // page_size) * page_size, page_size, CPU)
    if rows is None:
        rows = [table.alloc_row() for _ in spans]
    perm = torch.randperm(num_pages, generator=g)
    reqs, out_loc, used = [], [], 0
    for (start, end), row in zip(spans, rows):
        npg = -(-max_len // page_size)
        table.map_pages(
            torch.tensor([row]), torch.tensor([0]), torch.tensor([npg * page_size]), perm[used : used + npg]
        )
        used += npg
        reqs.append(Req(0, [1] * end, SamplingParams(max_tokens=4), 0, table_idx=row))
        out_loc.append(table.slots(row, start, end))
    table.sync()
    phase = "decode" if all(e - s == 1 for s, e in spans) else "prefill"
    batch = Batch(reqs, phase, starts=[s for s, _ in spans], ends=[e for _, e in spans])
    batch.out_loc = torch.cat(out_loc)
    n = batch.num_tokens
    q = (torch.randn(n, heads, head_dim, generator=g) * scale_qk).to(dtype)
    k = (torch.randn(n, kv_heads, head_dim, generator=g) * scale_qk).to(dtype)
    v = torch.randn(n, kv_heads, head_dim, generator=g).to(dtype)
    return Scenario(pool, table, batch, q, k, v, heads, head_dim)


def next_decode(sc: Scenario) -> Scenario:
    """The decode step after ``sc.batch``: every request extends one more token (new q/k/v)."""
    g = torch.Generator().manual_seed(sum(sc.batch.ends))
    ends = [e + 1 for e in sc.batch.ends]
    batch = Batch(sc.batch.reqs, "decode", starts=list(sc.batch.ends), ends=ends)
    batch.out_loc = torch.cat([sc.table.slots(r.table_idx, e - 1, e) for r, e in zip(batch.reqs, ends)])
    n, kv, d, dt = len(ends), sc.k.shape[1], sc.head_dim, sc.q.dtype
    q = torch.randn(n, sc.heads, d, generator=g).to(dt)
    k, v = torch.randn(n, kv, d, generator=g).to(dt), torch.randn(n, kv, d, generator=g).to(dt)
    return Scenario(sc.pool, sc.table, batch, q, k, v, sc.heads, d)


def run_backend(factory, sc: Scenario, pool: KVPool, layer: int = 1) -> torch.Tensor:
    """``prepare_metadata`` then ``forward`` of one layer on a copy of the batch (each backend fills its own
    ``attn_metadata``)."""
    backend = factory(pool, sc.table, sc.heads, sc.head_dim)
    return forward_with(backend, sc, layer)


def forward_with(backend, sc: Scenario, layer: int = 1) -> torch.Tensor:
    batch = copy.copy(sc.batch)
    batch.attn_metadata = None
    backend.prepare_metadata(batch)
    return backend.forward(sc.q.clone(), sc.k.clone(), sc.v.clone(), layer, batch)


def stale_answer(sc: Scenario, layer: int = 1) -> torch.Tensor:
    """What attending before storing gives: the new tokens' slots still hold the pool's old values."""
    pool = sc.pool
    starts, ends = sc.batch.starts, sc.batch.ends
    rows = torch.tensor([r.table_idx for r in sc.batch.reqs])
    kv_slots = sc.table.page_table[rows, : max(ends)].long()
    token_req = torch.repeat_interleave(torch.arange(len(starts)), torch.tensor(ends) - torch.tensor(starts))
    out = exact_attention(
        sc.q, pool.k_slots(layer), pool.v_slots(layer), kv_slots, token_req, brute_mask(starts, ends), sc.head_dim**-0.5
    )
    return out.to(sc.q.dtype)


def stale_pitfall(stale: torch.Tensor) -> Pitfall:
    return Pitfall(
        "attending before storing the new K/V",
        "store k/v at batch.out_loc first (self.pool.store): the batch's own tokens are keys too",
        lambda: stale,
    )


def check_backend(sc: Scenario, what: str, *, layer: int = 1, atol: float = 1e-5) -> None:
    """Your backend and ``TorchBackend`` on copies of the same pool: same output, same K/V stored."""
    cls = lab.backend_class()
    stale = stale_answer(sc, layer)
    mine_pool, ref_pool = copy.deepcopy(sc.pool), copy.deepcopy(sc.pool)
    got = run_backend(cls, sc, mine_pool, layer)
    want = run_backend(TorchBackend, sc, ref_pool, layer)
    check_tensor(
        got,
        want,
        f"{what}: forward(q {describe(sc.q)}, layer {layer}) compared with TorchBackend",
        atol=atol,
        rtol=atol,
        hint="compare key_mask and paged_attention with their own tests first; forward stores, then attends",
        pitfalls=[stale_pitfall(stale)],
    )
    if not torch.equal(mine_pool.buffer, ref_pool.buffer):
        diff = (mine_pool.buffer != ref_pool.buffer).nonzero()[0].tolist()
        raise AssertionError(
            f"{what}: the KV pool after forward differs from TorchBackend's, first at buffer index {diff} "
            "[layer, K/V, page, offset, kv_head, dim]: store the new k and v of layer layer_id at slots batch.out_loc "
            "(self.pool.store(layer_id, batch.out_loc, k, v)), and write nothing else"
        )


# ---- key_mask ----------------------------------------------------------------------------------------
@points(8)
def test_key_mask_prefill():
    """Prefill rows see keys 0..their position, counting the cached prefix; padding stays hidden."""
    for starts, ends in [
        ([0], [4]),  # a fresh prompt: plain causal
        ([3], [6]),  # after a cached prefix of 3
        ([3, 0], [6, 2]),  # ragged: the second request is padded to 6 keys
        ([0, 5, 2], [3, 6, 4]),  # a decode row (5 -> 6) rides along with two prefills
        ([5, 0], [6, 3]),  # the decode row first: still not a decode batch
    ]:
        check_mask(lab.key_mask(torch.tensor(starts), torch.tensor(ends)), starts, ends)


@points(6)
def test_key_mask_decode():
    """A decode batch (one query per request) sees each request's keys 0..ends[i]-1, no padding."""
    for starts, ends in [([4], [5]), ([4, 0, 9], [5, 1, 10]), ([2, 6], [3, 7])]:
        check_mask(lab.key_mask(torch.tensor(starts), torch.tensor(ends)), starts, ends)


@points(6)
def test_key_mask_random():
    """Random ragged batches (cached prefixes, decode rows, all-decode batches) give the brute-force mask."""
    lab.key_mask(torch.tensor([0]), torch.tensor([2]))  # a stub fails here
    _key_mask_random()


@settings(max_examples=150)
@given(
    spans=st.lists(st.tuples(st.integers(0, 12), st.one_of(st.just(1), st.integers(1, 6))), min_size=1, max_size=5).map(
        lambda xs: [(s, s + n) for s, n in xs]
    )
)
def _key_mask_random(spans):
    starts, ends = [s for s, _ in spans], [e for _, e in spans]
    check_mask(lab.key_mask(torch.tensor(starts), torch.tensor(ends)), starts, ends)


# ---- prepare_metadata ---------------------------------------------------------------------------------
def check_metadata(md, sc: Scenario, what: str) -> None:
    starts, ends = sc.batch.starts, sc.batch.ends
    for field in ("kv_slots", "token_req", "mask"):
        assert isinstance(getattr(md, field, None), torch.Tensor), (
            f"{what}: batch.attn_metadata must be a PagedMetadata with tensor field {field!r}, got {type(md).__name__}"
        )
    rows = [r.table_idx for r in sc.batch.reqs]
    assert md.kv_slots.dtype == torch.int64 and md.kv_slots.shape == (len(rows), max(ends)), (
        f"{what}: kv_slots must be int64 [B={len(rows)}, max(ends)={max(ends)}], got {describe(md.kv_slots)}"
    )
    for i, (row, end) in enumerate(zip(rows, ends)):
        want = sc.table.page_table[row, :end].long()
        got = md.kv_slots[i, :end]
        if not torch.equal(got, want):
            positions = "; these are the key positions themselves" if torch.equal(got, torch.arange(end)) else ""
            for other in range(sc.table.max_rows):
                if other != row and torch.equal(got, sc.table.page_table[other, :end].long()):
                    positions = f"; that is row {other} of the page table: request {i} sits on row {row} (table_idx)"
            raise AssertionError(
                f"{what}: kv_slots[{i}, :{end}] = {got.tolist()}, expected {want.tolist()}{positions}: a key's slot is "
                f"page_table[row, position] with row = batch.reqs[{i}].table_idx (read the page table; slots are not "
                "positions)"
            )
    want_req = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor(ends) - torch.tensor(starts))
    assert md.token_req.shape == want_req.shape and torch.equal(md.token_req.long(), want_req), (
        f"{what}: token_req = {md.token_req.tolist()}, expected {want_req.tolist()} (the request of each token)"
    )
    assert md.token_req.dtype == torch.int64, f"{what}: token_req must be int64, got {describe(md.token_req)}"
    want_mask = brute_mask(starts, ends)
    assert md.mask.dtype == torch.bool, f"{what}: mask must be a bool tensor, got {describe(md.mask)}"
    assert md.mask.shape == want_mask.shape and torch.equal(md.mask, want_mask), (
        f"{what}: mask is not key_mask(starts, ends) of this batch (shape {list(md.mask.shape)}, expected "
        f"{list(want_mask.shape)})"
    )


@points(8)
def test_metadata():
    """prepare_metadata builds kv_slots through the page table, token_req and the mask, fresh for
    every batch: a prefill batch, then the decode batch after it, on one backend."""
    sc = make_scenario(4, [(3, 8), (0, 2), (5, 6)], rows=[3, 0, 5])  # rows as a busy table hands them out
    backend = lab.make_backend(copy.deepcopy(sc.pool), sc.table, sc.heads, sc.head_dim)
    first = copy.copy(sc.batch)
    backend.prepare_metadata(first)
    check_metadata(first.attn_metadata, sc, "a prefill batch [(3, 8), (0, 2), (5, 6)] on rows [3, 0, 5] (page_size 4)")
    dec = next_decode(sc)
    second = copy.copy(dec.batch)
    backend.prepare_metadata(second)
    if second.attn_metadata is first.attn_metadata:
        raise AssertionError(
            "the decode batch after it got the same metadata object as the prefill batch: the metadata is reused "
            "across batches; build a fresh PagedMetadata in every prepare_metadata call (lengths change every batch)"
        )
    try:
        check_metadata(second.attn_metadata, dec, "the decode batch after it")
    except AssertionError as e:
        raise AssertionError(f"{e}\n(the first batch's metadata was right: is it reused across batches?)") from None


# ---- paged_attention ----------------------------------------------------------------------------------
def attention_case(dtype: torch.dtype, seed: int, heads: int = 6, kv_heads: int = 2, head_dim: int = 16):
    """A ragged batch on a pool of one layer: q, k_slots, v_slots, metadata, and the oracle's inputs."""
    spans = [(5, 9), (0, 3), (11, 12)]
    sc = make_scenario(4, spans, heads=heads, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, seed=seed)
    rows = torch.tensor([r.table_idx for r in sc.batch.reqs])
    starts, ends = sc.batch.starts, sc.batch.ends
    kv_slots = sc.table.page_table[rows, : max(ends)].long()
    token_req = torch.repeat_interleave(torch.arange(len(starts)), torch.tensor(ends) - torch.tensor(starts))
    mask = brute_mask(starts, ends)
    return sc.q, sc.pool.k_slots(0), sc.pool.v_slots(0), kv_slots, token_req, mask


def attention_pitfalls(q, ks, vs, kv_slots, token_req, mask, scale) -> list[Pitfall]:
    def wrong(**kw):
        return lambda: exact_attention(q, ks, vs, kv_slots, token_req, kw.pop("mask", mask), **kw).to(q.dtype)

    return [
        Pitfall(
            "query head h reading KV head h % kv_heads",
            "consecutive query heads share a KV head: h reads KV head h // (heads // kv_heads)",
            wrong(scale=scale, head_of=lambda h, heads, kv: h % kv),
        ),
        Pitfall("a scale of 1/D", "multiply the scores by scale (1/sqrt(D)), once", wrong(scale=q.shape[-1] ** -1.0)),
        Pitfall("no scale at all", "multiply the scores by scale (1/sqrt(D))", wrong(scale=1.0)),
        Pitfall(
            "ignoring the mask (softmax over padding and future keys)",
            "masked_fill the scores with -inf where md.mask is False, before the softmax",
            wrong(scale=scale, mask=None),
        ),
    ]


@points(10)
def test_attention_float32():
    """paged_attention in float32 equals exact attention: GQA with 3 query heads per KV head, ragged
    requests, K/V gathered through the slot table."""
    q, ks, vs, kv_slots, token_req, mask = attention_case(torch.float32, seed=1)
    scale = q.shape[-1] ** -0.5
    got = lab.paged_attention(q.clone(), ks, vs, lab.metadata(kv_slots, token_req, mask), scale)
    want = exact_attention(q, ks, vs, kv_slots, token_req, mask, scale).float()
    check_tensor(
        got,
        want,
        f"paged_attention(q {describe(q)}, 6 heads over 2 KV heads) against exact attention",
        atol=1e-5,
        rtol=1e-5,
        hint="gather keys with k_slots[md.kv_slots[md.token_req]], mask, softmax over keys, weigh the values",
        pitfalls=attention_pitfalls(q, ks, vs, kv_slots, token_req, mask, scale),
    )


@points(8)
def test_attention_bfloat16():
    """In bfloat16 every output is within one unit in the last place of exact attention (scores, softmax
    and the weighted sum in float32, rounded once), at head_dim 16 and at head_dim 32, whose scale
    1/sqrt(32) is not a power of two (multiplying by it in bfloat16 rounds)."""
    q, ks, vs, kv_slots, token_req, mask = attention_case(torch.bfloat16, seed=2, heads=4, kv_heads=2)
    scale = q.shape[-1] ** -0.5
    got = lab.paged_attention(q.clone(), ks, vs, lab.metadata(kv_slots, token_req, mask), scale)
    exact = exact_attention(q, ks, vs, kv_slots, token_req, mask, scale)
    what = f"paged_attention(q {describe(q)}) against exact attention"
    check_tensor(
        got,
        exact.to(torch.bfloat16),
        what,
        atol=0.02,
        rtol=0.02,
        hint="compute in float32 and cast the result back to q.dtype",
        pitfalls=attention_pitfalls(q, ks, vs, kv_slots, token_req, mask, scale),
    )
    check_ulps(got, exact, what)
    q, ks, vs, kv_slots, token_req, mask = attention_case(torch.bfloat16, seed=3, heads=4, kv_heads=2, head_dim=32)
    scale = q.shape[-1] ** -0.5
    got = lab.paged_attention(q.clone(), ks, vs, lab.metadata(kv_slots, token_req, mask), scale)
    exact = exact_attention(q, ks, vs, kv_slots, token_req, mask, scale)
    check_ulps(got, exact, f"paged_attention(q {describe(q)}, scale 1/sqrt(32)) against exact attention")


def check_ulps(got: torch.Tensor, exact: torch.Tensor, what: str) -> None:
    """Every value of ``got`` (bfloat16) within one unit in the last place of the float64 ``exact`` (plus 1e-5,
    what float32 sums of a few hundred terms may lose where an output nearly cancels to 0)."""
    err = (got.double() - exact).abs()
    units = err / ulp(torch.maximum(got.double().abs(), exact.abs()), torch.bfloat16)
    units = torch.where(err <= 1e-5, 0.0, units)
    if units.max() > 1:
        idx = tuple((units > 1).nonzero()[0].tolist())
        raise AssertionError(
            f"{what}: {int((units > 1).sum())} of {units.numel()} values are more than one bfloat16 unit in the last "
            f"place from the exact result (up to {units.max().item():.1f} units; first at {list(idx)}: exact "
            f"{exact[idx].item():.6g}, got {got[idx].item():.6g})\nsomething was rounded to bfloat16 before the end "
            "(q * scale computed in bfloat16, the scores before the softmax, the probabilities, or the weighted "
            "sum): compute in float32 and round once, at the end"
        )


# ---- the backend against TorchBackend -----------------------------------------------------------------
@points(6)
@pytest.mark.parametrize("page_size", [1, 16])
def test_backend_prefill(page_size):
    """A ragged prefill batch (cached prefixes, a fresh prompt, a decode row), GQA: same output and same
    K/V stored as TorchBackend, in float32 and (within bfloat16 rounding) bfloat16; then a batch whose
    extends start and end on page boundaries."""
    lab.backend_class()
    spans = [(13, 21), (0, 5), (30, 31), (16, 17 + page_size)]
    check_backend(make_scenario(page_size, spans, seed=3), f"float32, page_size {page_size}, batch {spans}")
    sc = make_scenario(page_size, spans, seed=4, dtype=torch.bfloat16)
    check_backend(sc, f"bfloat16, page_size {page_size}, batch {spans}", atol=0.03)
    # on page boundaries (of 16-token pages): a prefix of exactly one page extended by one page, a fresh
    # prompt of one page, one token on the last slot of a page, one token on the first slot of a page
    spans = [(16, 32), (0, 16), (15, 16), (32, 33)]
    check_backend(make_scenario(page_size, spans, seed=6), f"float32, page_size {page_size}, batch {spans}")


@points(5)
@pytest.mark.parametrize("page_size", [1, 16])
def test_backend_decode(page_size):
    """A decode batch of ragged lengths (one request past a page boundary), then the next decode step on
    the same backend: same outputs and K/V as TorchBackend."""
    lab.backend_class()
    spans = [(16, 17), (2, 3), (40, 41)]
    sc = make_scenario(page_size, spans, seed=5)
    backend = lab.make_backend(sc.pool, sc.table, sc.heads, sc.head_dim)
    ref_pool = copy.deepcopy(sc.pool)
    ref = TorchBackend(ref_pool, sc.table, sc.heads, sc.head_dim)
    for step, s in enumerate([sc, next_decode(sc)]):
        stale = stale_answer(s)
        got, want = forward_with(backend, s), forward_with(ref, s)
        check_tensor(
            got,
            want,
            f"decode step {step} (page_size {page_size}, ends {s.batch.ends}) compared with TorchBackend",
            atol=1e-5,
            rtol=1e-5,
            hint="each decode row attends all keys 0..ends[i]-1 of its own request, none of the padding",
            pitfalls=[stale_pitfall(stale)],
        )
        assert torch.equal(s.pool.buffer, ref_pool.buffer), (
            f"decode step {step}: the KV pool differs from TorchBackend's: store k/v at batch.out_loc, nothing else"
        )


@points(10)
def test_backend_random():
    """Random ragged batches (page sizes 1, 4, 16; GQA groups 1 to 4; any request-table rows), each a prefill
    batch then the decode step after it on the same backend: the outputs and the pool equal TorchBackend's."""
    lab.backend_class()
    _backend_random()


@settings(max_examples=40)
@given(
    page_size=st.sampled_from([1, 4, 16]),
    heads=st.sampled_from([(4, 2), (6, 2), (4, 1), (3, 3), (8, 2)]),
    spans=st.lists(st.tuples(st.integers(0, 24), st.one_of(st.just(1), st.integers(1, 9))), min_size=1, max_size=4).map(
        lambda xs: [(s, s + n) for s, n in xs]
    ),
    seed=st.integers(0, 1000),
    rows=st.permutations(range(8)),
)
def _backend_random(page_size, heads, spans, seed, rows):
    sc = make_scenario(page_size, spans, heads=heads[0], kv_heads=heads[1], seed=seed, rows=rows[: len(spans)])
    mine = lab.make_backend(sc.pool, sc.table, sc.heads, sc.head_dim)
    ref_pool = copy.deepcopy(sc.pool)
    ref = TorchBackend(ref_pool, sc.table, sc.heads, sc.head_dim)
    for step, s in enumerate([sc, next_decode(sc)]):
        stale = stale_answer(s)
        spans_now = list(zip(s.batch.starts, s.batch.ends))
        what = f"page_size {page_size}, {heads[0]} heads / {heads[1]} KV heads, batch {spans_now}"
        check_tensor(
            forward_with(mine, s),
            forward_with(ref, s),
            f"{'the decode step after ' if step else ''}{what}",
            atol=1e-5,
            rtol=1e-5,
            hint="the fixed tests above name the usual causes",
            pitfalls=[stale_pitfall(stale)],
        )
        assert torch.equal(s.pool.buffer, ref_pool.buffer), f"{what}: the KV pool differs from TorchBackend's"


# ---- the engine on your backend ------------------------------------------------------------------------
def _rounds(model) -> list[list[list[int]]]:
    g = torch.Generator().manual_seed(0)
    vocab = ModelConfig.from_path(model).vocab_size
    ids = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    system = ids(37)
    return [
        [system + ids(5)],  # one prompt, in chunks of 16 tokens: each chunk attends the ones before
        [system + ids(9), ids(3), system + ids(20)],  # cached prefixes next to a fresh prompt, ragged decode
    ]


@points(6, timeout=180)
@engine
@pytest.mark.parametrize("page_size", [1, 16])
def test_engine_greedy_tokens(tiny_llama, page_size):
    """The engine with attention_backend=<your backend> (tiny Llama, 4 heads over 2 KV heads, prefix cache,
    chunked prefill of 16 tokens) generates the reference engine's greedy tokens."""
    cls = lab.backend_class()
    lab.key_mask(torch.tensor([0]), torch.tensor([2]))  # a stub fails here, before any engine is built
    rounds = _rounds(tiny_llama)
    args = dict(page_size=page_size, num_pages=512 // page_size, max_prefill_length=16, max_tokens=10)
    with lab.registered_backend(cls) as name:
        try:
            got, got_cached, _ = generate_rounds(tiny_llama, rounds, attention_backend=name, **args)
        except (NotImplementedError, AssertionError) as e:
            raise type(e)(f"the engine failed with your backend (page_size={page_size}): {e}") from e
        except Exception as e:
            raise AssertionError(
                f"the engine failed with your backend (page_size={page_size}): {type(e).__name__}: {e}"
            ) from e
    want, want_cached, _ = generate_rounds(tiny_llama, rounds, attention_backend="torch", **args)
    assert got_cached == want_cached and sum(map(sum, want_cached)) > 0, (got_cached, want_cached)
    diff = first_token_difference([t for r in got for t in r], [t for r in want for t in r])
    assert diff is None, (
        f"with your backend the engine generated other tokens than with TorchBackend (page_size={page_size}): "
        f"{diff}; the unit tests above locate the cause"
    )
