"""Lab 16, hidden tests: what the docstring allows and the visible tests do not try: a group of query heads
that is not a power of two (the embedded model's 9 over 3) at head_dim 64, float16, more than 16 parts, and
one part over hundreds of keys. Each calls decode first, so a stub fails at once with its hint."""

from __future__ import annotations

import torch

from autograder.points import points
from autograder.test_lab16_flash_decoding import expect, expect_partial, make_case


@points(5)
def test_groups_of_three_at_head_dim_64():
    """9 query heads over 3 KV heads (3 per group: a tile's rows padded to a power of two), head_dim 64, in
    float32 and bfloat16, 1 and 4 parts."""
    c = make_case([13, 30], heads=(9, 3), dim=64, seed=200)
    expect(c, 1, "9 heads over 3")
    expect(c, 4, "9 heads over 3")
    expect(make_case([25], heads=(6, 2), dim=64, dtype=torch.bfloat16, page=16, seed=201), 4, "6 heads over 2, bf16")


@points(5)
def test_float16_many_parts_and_long_rows():
    """float16 (a dtype the contract allows), 20 parts of a request of 100 keys (the merge reads more than 16
    rows), and one part over 600 keys."""
    c = make_case([41, 3], heads=(4, 2), dtype=torch.float16, seed=202)
    expect(c, 2, "float16")
    expect_partial(make_case([100, 7], heads=(2, 1), seed=203), 20, "20 parts")
    expect(make_case([600], heads=(2, 1), page=16, seed=204), 1, "600 keys in one part")
