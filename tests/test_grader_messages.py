"""What a student reads when a lab test fails: ``autograder/checks.py`` (bit-for-bit checks of
low-precision results, pitfalls named by recomputing them) and ``autograder/explain.py`` (one
failure with its example, never a traceback or Hypothesis' exception group). Fast: no grading runs."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from autograder.checks import Pitfall, check_tensor, matches
from autograder.explain import example_line, explain

with warnings.catch_warnings():  # its @points marks are registered by the autograder's conftest, not this one
    warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
    from autograder.test_lab01_decoder import attention_pitfalls, ref_attention, ref_rms_norm, rms_norm_pitfalls


def rand(*shape, seed: int, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def failure_message(fn) -> str:
    with pytest.raises(AssertionError) as excinfo:
        fn()
    return str(excinfo.value)


# ---- exact (bit-for-bit) checks of low-precision results ------------------------------------------------
def test_exact_check_allows_only_rare_last_bit_roundings():
    want = rand(1000, seed=0, dtype=torch.bfloat16)
    bits = want.view(torch.int16).clone()
    bits[:10] += 1  # ten values (1%) one unit in the last place away: another float32 order's rounding
    check_tensor(bits.view(torch.bfloat16), want, "x", exact=True)
    bits[10] += 1  # an eleventh
    assert "11 of 1000 values differ" in failure_message(
        lambda: check_tensor(bits.view(torch.bfloat16), want, "x", exact=True)
    )
    bits = want.view(torch.int16).clone()
    bits[0] += 2  # two units, even once, is not a rounding difference
    assert "by up to 2 units" in failure_message(lambda: check_tensor(bits.view(torch.bfloat16), want, "x", exact=True))


def test_rms_norm_in_bfloat16_fails_although_it_is_close():
    x, w = rand(16, 64, seed=1, dtype=torch.bfloat16, scale=3.0), rand(64, seed=2, dtype=torch.bfloat16)
    want = ref_rms_norm(x, w, 1e-6)
    wrong = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))  # no float32 anywhere
    assert matches(wrong, want, atol=2e-2, rtol=2e-2), "the old tolerance let this through"
    msg = failure_message(
        lambda: check_tensor(wrong, want, "rms_norm", exact=True, pitfalls=rms_norm_pitfalls(x, w, 1e-6))
    )
    assert "this is exactly what computing the mean of squares in bfloat16" in msg, msg


def test_rms_norm_weight_order_is_named():
    x, w = rand(16, 64, seed=3, dtype=torch.bfloat16, scale=3.0), rand(64, seed=4, dtype=torch.bfloat16)
    h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    other_order = (w.float() * h).to(torch.bfloat16)
    msg = failure_message(
        lambda: check_tensor(
            other_order, ref_rms_norm(x, w, 1e-6), "rms_norm", exact=True, pitfalls=rms_norm_pitfalls(x, w, 1e-6)
        )
    )
    assert "multiplying by weight in float32 and casting to bfloat16 at the end" in msg, msg


def test_float32_failures_never_get_a_precision_hint():
    x, w = rand(4, 64, seed=5) * 1e-4, rand(64, seed=6)
    no_eps = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)))
    msg = failure_message(
        lambda: check_tensor(
            no_eps, ref_rms_norm(x, w, 1e-6), "rms_norm", atol=1e-5, rtol=1e-5, pitfalls=rms_norm_pitfalls(x, w, 1e-6)
        )
    )
    assert "leaving eps out" in msg and "bfloat16" not in msg and "float16" not in msg, msg
    assert all("float16" not in p.mistake for p in rms_norm_pitfalls(x, w, 1e-6))
    q, k = rand(3, 4, 8, seed=7), rand(5, 2, 8, seed=8)
    assert all("float16" not in p.mistake for p in attention_pitfalls(q, k, k, 0.3))


def test_a_bfloat16_attention_softmax_is_named():
    q = rand(4, 4, 16, seed=9, dtype=torch.bfloat16, scale=2.0)
    k, v = rand(9, 2, 16, seed=10, dtype=torch.bfloat16), rand(9, 2, 16, seed=11, dtype=torch.bfloat16)
    want = ref_attention(q, k, v, 0.25)
    keys, values = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = torch.einsum("thd,shd->hts", q, keys) * 0.25
    mask = torch.arange(9)[None, None, :] > torch.arange(5, 9)[None, :, None]
    low = torch.einsum("hts,shd->thd", scores.masked_fill(mask, float("-inf")).softmax(-1), values)
    msg = failure_message(
        lambda: check_tensor(low, want, "attention", exact=True, pitfalls=attention_pitfalls(q, k, v, 0.25))
    )
    assert "softmax in bfloat16" in msg, msg


def test_a_pitfall_that_raises_never_hides_the_failure():
    want = torch.zeros(3)

    def broken() -> torch.Tensor:
        raise RuntimeError("the diagnosis itself failed")

    msg = failure_message(
        lambda: check_tensor(
            torch.ones(3), want, "f(x)", atol=1e-6, hint="the usual cause", pitfalls=[Pitfall("a", "b", broken)]
        )
    )
    assert "3 of 3 values differ" in msg and "usual cause: the usual cause" in msg, msg


# ---- Hypothesis' failures, explained ---------------------------------------------------------------------
@settings(max_examples=200, derandomize=True, database=None, phases=[Phase.generate, Phase.shrink])
@given(n=st.integers(0, 1000))
def _two_distinct_bugs(n):
    if n > 500:
        raise AssertionError(f"f({n}): expected at most 500, got {n}")
    if n % 7 == 3:
        raise ValueError(f"f({n}) is broken")


def test_exception_group_becomes_its_smallest_failure():
    with pytest.raises(BaseExceptionGroup) as excinfo:
        _two_distinct_bugs()
    text = explain(excinfo, Path("/nonexistent"))
    assert "ExceptionGroup" not in text and "distinct failures" not in text, text
    shown = re.search(r"ValueError: f\((\d+)\) is broken", text)  # the ValueError's n is below 500
    assert shown and int(shown.group(1)) < 500, text
    assert f"smallest failing example (random test): n={shown.group(1)}\n" in text, text
    assert "the random test found 2 different failures; this is the smallest" in text, text
    assert "Traceback" not in text and len(text.split("\n")) <= 14


@settings(max_examples=50, derandomize=True, database=None)
@given(rows=st.integers(1, 9), name=st.sampled_from(["a", "b"]))
def _one_bug(rows, name):
    assert rows < 4, f"{rows} rows of {name}: expected shape [{rows}, 8], got [{rows}, 4]"


def test_falsifying_example_fits_on_one_line():
    with pytest.raises(AssertionError) as excinfo:
        _one_bug()
    text = explain(excinfo, Path("/nonexistent"))
    assert text.split("\n")[0] == "4 rows of a: expected shape [4, 8], got [4, 4]", text
    assert text.split("\n")[-1] == "smallest failing example (random test): rows=4, name='a'", text
    assert "Falsifying" not in text


def test_example_line_only_reads_hypothesis_notes():
    note = "Falsifying example: _rms_norm_random(\n    rows=2,\n    dtype=torch.bfloat16,\n)"
    assert example_line(note) == "smallest failing example (random test): rows=2, dtype=torch.bfloat16"
    # newer Hypothesis releases name it "Failing test case" and comment on values any value would do
    note = (
        "Failing test case: _rms_norm_random(\n    rows=2,\n"
        "    dtype=torch.bfloat16,  # or any other generated value\n)"
    )
    assert example_line(note) == "smallest failing example (random test): rows=2, dtype=torch.bfloat16"
    assert example_line("while running evict(3); operations (page_size=1), oldest first:") is None
