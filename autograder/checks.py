"""Assertions whose messages teach: what was expected, what came out, and the usual cause."""

from __future__ import annotations

import torch


def describe(t: torch.Tensor) -> str:
    return f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}"


def check_tensor(got, want: torch.Tensor, what: str, *, atol: float, rtol: float = 0.0, hint: str = "") -> None:
    """``got`` must be a tensor shaped and typed like ``want`` and close to it."""
    hint = f"\nusual cause: {hint}" if hint else ""
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what}: expected a torch.Tensor, got {type(got).__name__}")
    if got.shape != want.shape:
        raise AssertionError(
            f"{what}: expected shape {list(want.shape)}, got {list(got.shape)}"
            + ("\nusual cause: a reshape/transpose left a dimension out of place" if not hint else hint)
        )
    if got.dtype != want.dtype:
        raise AssertionError(f"{what}: expected dtype {want.dtype}, got {got.dtype} (cast the result back){hint}")
    g, w = got.detach().double(), want.detach().double()
    if torch.isnan(g).any() and not torch.isnan(w).any():
        idx = tuple(torch.nonzero(torch.isnan(g))[0].tolist())
        raise AssertionError(f"{what}: NaN at index {list(idx)} (expected {w[idx].item():.6g}){hint}")
    err = (g - w).abs()
    bad = err > atol + rtol * w.abs()
    if bad.any():
        idx = tuple(torch.nonzero(bad)[0].tolist())
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {w.numel()} values differ; max abs error {err.max().item():.3g} "
            f"(tolerance {atol:g}). First at index {list(idx)}: expected {w[idx].item():.6g}, "
            f"got {g[idx].item():.6g}{hint}"
        )


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
