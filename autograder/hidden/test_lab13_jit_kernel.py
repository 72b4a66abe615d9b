"""Lab 13, hidden tests: head dims the visible tests do not try (80, not a multiple of 16, and 128) and
a q whose last dimension is strided (an ``[B, D, H]`` tensor transposed). Each calls the kernel first,
so a stub fails at once with its hint."""

from __future__ import annotations

import torch

from autograder.points import points
from autograder.test_lab13_jit_kernel import expect, make_case


@points(5)
def test_head_dims_80_and_128():
    """head_dim 80 (Phi-2's: five blocks of 16) and 128 (Qwen3's), in both dtypes."""
    expect(make_case([9, 21], heads=(4, 2), dim=80, seed=40), "head_dim 80")
    expect(make_case([13], heads=(8, 2), dim=128, page=16, dtype=torch.bfloat16, seed=41), "head_dim 128, bf16")
    expect(make_case([5, 30], heads=(2, 1), dim=72, seed=42), "head_dim 72")


@points(5)
def test_q_any_strides():
    """q from an ``[B, D, H]`` tensor transposed: stride(2) is H, not 1 (the docstring: q in any strides)."""
    expect(make_case([6, 11], heads=(4, 2), q_layout="dims transposed", seed=43), "q with stride(2) = H")
    expect(
        make_case([17], heads=(9, 3), dim=64, dtype=torch.bfloat16, q_layout="dims transposed", seed=44),
        "bf16 q with stride(2) = H",
    )
