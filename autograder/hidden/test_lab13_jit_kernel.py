"""Lab 13, hidden tests: two tensors with strides of their own (one contiguous, one not; a column
against every third id) and a broadcast tensor (stride 0). Each calls the kernel first, so a stub
fails at once with its hint."""

from __future__ import annotations

import torch

from autograder.adapters import lab13 as lab
from autograder.points import points
from minisgl.kvcache.radix import common_prefix_len


def _check(a: torch.Tensor, b: torch.Tensor, why: str) -> None:
    got = lab.prefix_len(a, b)
    want = common_prefix_len(a.tolist(), b.tolist())
    assert got == want, (
        f"prefix_len returned {got!r}, expected {want} ({why}; strides {a.stride(0)} and {b.stride(0)}): strides: "
        "each tensor has its own stride(0); element i of a is at a's data + i * a.stride(0), of b at b's data + "
        "i * b.stride(0), whatever the other tensor's layout"
    )


@points(5)
def test_each_tensor_its_own_stride():
    """One tensor contiguous and the other not, and two different strides."""
    x = torch.arange(300, 360, dtype=torch.int64)
    y = x.clone()
    y[24] = -3
    _check(x[:20].clone(), y[::2], "a contiguous against every second id of y; they differ at element 12")
    _check(y[::2], x[:20].clone(), "every second id of y against a contiguous copy; they differ at element 12")
    m = x.view(12, 5)  # column 0 is 300, 305, 310, ...
    _check(
        m[:, 0],
        x[::5].clone(),
        "a column of a 12x5 matrix against a contiguous copy",
    )
    _check(m[:, 0], y[::5], "a column (stride 5) against every fifth id (stride 5 of another tensor)")
    _check(x[::3], x[::3].clone()[:15], "stride 3 against a contiguous copy of its first 15 ids")


@points(5)
def test_broadcast_tensor():
    """A broadcast (``expand``) tensor has stride 0: every element is the same id."""
    sevens = torch.tensor([7], dtype=torch.int64).expand(50)
    b = torch.full((50,), 7, dtype=torch.int64)
    b[30] = 8
    _check(sevens, b, "fifty 7s (stride 0) against 7s with an 8 at element 30")
    _check(b, sevens, "7s with an 8 at element 30 against fifty 7s (stride 0)")
