"""Lab 04, hidden tests: the backend's own ``scale``, scores far beyond ``exp``'s range, and the precision
contract in bfloat16 at head_dim 128 (a scale that is not a power of two) with 64-token pages and contexts
over several pages. Each calls the lab code first, so a stub fails at once with its hint."""

from __future__ import annotations

import copy

import torch

from autograder.adapters import lab04 as lab
from autograder.checks import check_tensor, describe
from autograder.points import points
from autograder.test_lab04_paged_attention import (
    brute_mask,
    check_ulps,
    exact_attention,
    forward_with,
    make_scenario,
)
from minisgl.attention import TorchBackend


@points(3)
def test_backend_uses_its_scale():
    """forward scales the scores by ``self.scale``, whatever it is (a model may set its own)."""
    sc = make_scenario(1, [(6, 10), (3, 4)], seed=11)
    mine = lab.make_backend(copy.deepcopy(sc.pool), sc.table, sc.heads, sc.head_dim)
    ref = TorchBackend(copy.deepcopy(sc.pool), sc.table, sc.heads, sc.head_dim)
    mine.scale = ref.scale = 0.09  # not 1/sqrt(16)
    check_tensor(
        forward_with(mine, sc),
        forward_with(ref, sc),
        "forward with backend.scale = 0.09 (head_dim 16) compared with TorchBackend",
        atol=1e-5,
        rtol=1e-5,
        hint="pass self.scale to the attention: the scale is the backend's attribute, not always 1/sqrt(head_dim)",
    )


@points(3)
def test_attention_large_scores():
    """Scores in the thousands (large q and k) still give a finite, exact softmax: subtract the row's
    maximum before exp (torch.softmax does)."""
    sc = make_scenario(4, [(9, 14), (0, 6)], seed=12, scale_qk=25.0)
    rows = torch.tensor([r.table_idx for r in sc.batch.reqs])
    starts, ends = sc.batch.starts, sc.batch.ends
    kv_slots = sc.table.page_table[rows, : max(ends)].long()
    token_req = torch.repeat_interleave(torch.arange(2), torch.tensor(ends) - torch.tensor(starts))
    # the new tokens' K are large too: store them as forward would
    ks, vs = sc.pool.k_slots(0).clone(), sc.pool.v_slots(0).clone()
    ks[sc.batch.out_loc], vs[sc.batch.out_loc] = sc.k, sc.v
    ks *= 25.0
    mask = brute_mask(starts, ends)
    scale = sc.head_dim**-0.5
    got = lab.paged_attention(sc.q.clone(), ks, vs, lab.metadata(kv_slots, token_req, mask), scale)
    want = exact_attention(sc.q, ks, vs, kv_slots, token_req, mask, scale).float()
    check_tensor(
        got,
        want,
        f"paged_attention(q {describe(sc.q)}) with scores up to ~{(25 * 25 * 16**0.5):.0f}",
        atol=1e-4,
        rtol=1e-4,
        hint="exp() of scores above ~88 overflows float32: use torch.softmax (or subtract each row's max first)",
    )


@points(4)
def test_bfloat16_head_dim_128_long_contexts():
    """bfloat16 with head_dim 128 (Qwen3's; its scale 1/sqrt(128) is not a power of two), 64-token pages,
    contexts over up to three pages, rows out of order: within one bfloat16 unit of exact attention."""
    spans = [(130, 141), (60, 61), (0, 40)]
    sc = make_scenario(64, spans, heads=4, kv_heads=2, head_dim=128, dtype=torch.bfloat16, rows=[5, 2, 7], seed=13)
    mine = lab.make_backend(sc.pool, sc.table, sc.heads, sc.head_dim)
    got = forward_with(mine, sc)
    rows = torch.tensor([5, 2, 7])
    starts, ends = sc.batch.starts, sc.batch.ends
    kv_slots = sc.table.page_table[rows, : max(ends)].long()
    token_req = torch.repeat_interleave(torch.arange(3), torch.tensor(ends) - torch.tensor(starts))
    exact = exact_attention(
        sc.q, sc.pool.k_slots(1), sc.pool.v_slots(1), kv_slots, token_req, brute_mask(starts, ends), 128**-0.5
    )
    check_ulps(got, exact, f"forward(q {describe(sc.q)}), page_size 64, batch {spans}")
