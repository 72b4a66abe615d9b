"""Lab 13 (a C++ kernel through TVM FFI): edge cases and random arrays against the engine's Python
compare (``minisgl.kvcache.radix.common_prefix_len``), the speed check, then the engine's radix cache
comparing its keys with your kernel. Run: ``python -m autograder lab13``."""

from __future__ import annotations

import random
import time

import torch

from autograder.adapters import lab13 as lab
from autograder.checks import first_token_difference
from autograder.engine_runs import engine_failure, generate_rounds
from autograder.points import engine, points
from minisgl.kvcache.radix import common_prefix_len
from minisgl.models.config import ModelConfig

MASK32 = (1 << 32) - 1


def t(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def reference(a: torch.Tensor, b: torch.Tensor) -> int:
    return common_prefix_len(a.tolist(), b.tolist())


def _underlying(x: torch.Tensor, n: int, stride: int = 1) -> list[int] | None:
    """The ``n`` int64 values from ``x``'s first element on, read with ``stride`` (as if contiguous by
    default; None when its storage ends sooner)."""
    avail = x.untyped_storage().nbytes() // 8 - x.storage_offset()
    return torch.as_strided(x, (n,), (stride,)).tolist() if n == 0 or (n - 1) * stride < avail else None


def diagnose(a: torch.Tensor, b: torch.Tensor, got: object, want: int) -> str:
    """What usually gives ``got`` instead of ``want`` on these inputs (the pitfalls of the docstring)."""
    la, lb = len(a), len(b)
    n = min(la, lb)
    if not isinstance(got, int) or isinstance(got, bool):
        return f"prefix_len must return a Python int, got {type(got).__name__} (convert the result with int())"
    low = lambda x: [v & MASK32 for v in x.tolist()]  # noqa: E731
    if got == common_prefix_len(low(a), low(b)) != want:
        return (
            "int32 token ids: these ids differ only above bit 31, and your compare truncated them (use int64_t, "
            "never int or int32_t, for the elements)"
        )
    if not (a.is_contiguous() and b.is_contiguous()):
        sa, sb = a.stride(0), b.stride(0)
        ra, rb = _underlying(a, la), _underlying(b, lb)
        wrong = lambda x, y: x is not None and y is not None and got == common_prefix_len(x, y) != want  # noqa: E731
        if a.is_contiguous() != b.is_contiguous() and wrong(ra, rb):
            which = "b" if a.is_contiguous() else "a"
            return (
                f"strides: {which} is not contiguous (strides {sa} and {sb}) and your kernel read it as if it were: "
                "each tensor has its own layout, so a contiguous fast path needs both tensors contiguous; element "
                f"i of {which} is at its data + i * {which}.stride(0)"
            )
        if wrong(ra, rb):
            return (
                f"strides: these tensors are not contiguous (strides {sa} and {sb}) and your "
                "kernel read them as if they were; element i is at data + i * stride(0)"
            )
        if wrong(a.tolist(), rb) or wrong(ra, b.tolist()):
            return (
                f"strides: each tensor has its own layout (strides {sa} and {sb}): a contiguous fast path needs both "
                "tensors contiguous, and the other one is read with its own stride(0)"
            )
        if sa != sb and (wrong(a.tolist(), _underlying(b, lb, sa)) or wrong(_underlying(a, la, sb), b.tolist())):
            return (
                f"strides: each tensor has its own stride(0) (here {sa} and {sb}): element i of a is at a's data + "
                "i * a.stride(0), of b at b's data + i * b.stride(0); one stride was used for both"
            )
    if got > n:
        return (
            f"reading past the shorter array: the answer is at most min(len(a), len(b)) = {n}; past the end of the "
            "shorter tensor lies memory that is not its data (here it even continues the match)"
        )
    if want == n and n > 0 and got in (0, -1):
        return (
            f"no mismatch: the arrays agree on all {n} elements of the shorter one, so the answer is its length; "
            f"{got} looks like a 'not found' sentinel"
        )
    if want == n and got == n - 1:
        return "off by one at the end: the arrays agree on every element, and the count stopped one short"
    if got == want + 1:
        return "off by one at the end: the count includes the first mismatching element"
    if got == want - 1:
        return "off by one: the count stops one element before the first mismatch"
    return "compare element i of a with element i of b, for i < min(len(a), len(b)), and stop at the first difference"


def expect(a: torch.Tensor, b: torch.Tensor, why: str, want: int | None = None) -> None:
    want = reference(a, b) if want is None else want
    got = lab.prefix_len(a, b)
    if got != want:
        shown = lambda x: x.tolist() if len(x) <= 12 else f"{len(x)} ids {x[:6].tolist()}..."  # noqa: E731
        raise AssertionError(
            f"prefix_len({shown(a)}, {shown(b)}) returned {got!r}, expected {want} ({why}): {diagnose(a, b, got, want)}"
        )


# ---- fixed cases ------------------------------------------------------------------------------------
@points(7)
def test_docstring_examples():
    """The docstring's examples: a mismatch inside both arrays, and one array a prefix of the other."""
    a = t(5, 9, 2, 7, 7, 1)
    expect(a, t(5, 9, 2, 4), "the fourth ids differ", 3)
    expect(a, t(5, 9), "[5, 9] is a prefix of a", 2)
    expect(t(5, 9), a, "[5, 9] is a prefix of b", 2)


@points(6)
def test_empty_arrays():
    """An empty array shares a prefix of length 0 with anything."""
    expect(t(), t(), "both are empty", 0)
    expect(t(), t(1, 2, 3), "a is empty", 0)
    expect(t(1, 2, 3), t(), "b is empty", 0)


@points(8)
def test_full_match():
    """Equal arrays give their length; an array against a longer one that starts with it, its own."""
    x = torch.arange(100, 140, dtype=torch.int64)
    expect(x, x.clone(), "equal arrays of 40 ids", 40)
    expect(x[:1], x[:1].clone(), "equal arrays of one id", 1)
    expect(x[:17].clone(), x, "a (17 ids) is a prefix of b (40)", 17)
    expect(x, x[:17].clone(), "b (17 ids) is a prefix of a (40)", 17)


@points(6)
def test_mismatch_at_zero():
    """Arrays that differ in their first id share nothing."""
    expect(t(1, 2, 3), t(2, 2, 3), "the first ids differ", 0)
    expect(t(7), t(8, 9), "the first ids differ", 0)


@points(8)
def test_mismatch_at_the_last_element():
    """A mismatch at the last element of the shorter array is not a full match."""
    x = torch.arange(50, dtype=torch.int64)
    y = x.clone()
    y[-1] = -1
    expect(x, y, "they differ only in the last of 50 ids", 49)
    expect(x[:9].clone(), torch.cat([y[:8], t(99, 1, 2)]), "the 9th id differs, the last of the shorter", 8)


@points(8)
def test_stops_at_the_shorter_array():
    """The shorter array may be a view into a longer buffer whose hidden tail continues the match:
    that tail is not part of the array."""
    a = torch.arange(1000, 1030, dtype=torch.int64)
    buffer = a.clone()
    expect(a, buffer[:10], "b is the first 10 ids of a 30-id buffer equal to a", 10)
    expect(buffer[:1], a, "a is the first id of a 30-id buffer equal to b", 1)
    expect(buffer[:0], a, "a is an empty view of a 30-id buffer equal to b", 0)


@points(8)
def test_large_token_ids():
    """Token ids are 64-bit: ids above 2^31, and ids that differ only in their high bits."""
    big = t(2**31 + 5, 2**40 + 7, 2**62 + 11, 3)
    expect(big, big.clone(), "equal ids above 2^31", 4)
    expect(big, t(2**31 + 5, 2**40 + 7, 11, 3), "the third ids differ only above bit 31", 2)
    expect(t(1 + 2**32, 2), t(1, 2), "the first ids differ only in bit 32", 0)


@points(8)
def test_strided_views():
    """Non-contiguous tensors: every second id of a buffer, a column of a matrix, and two tensors of
    layouts of their own (one contiguous, the other not; two different strides)."""
    x = torch.arange(0, 40, dtype=torch.int64)
    y = x.clone()
    y[30] = -5  # element 15 of y[::2]
    expect(x[::2], y[::2], "every second id; they differ at element 15", 15)
    expect(x[1::2], y[1::2], "the odd positions are all equal", 20)
    m, n = x.view(10, 4), y.view(10, 4).clone()
    n[7, 2] = -1
    expect(m[:, 2], n[:, 2], "column 2 of two 10x4 matrices, differing in row 7", 7)
    # each tensor has its own stride: two different strides, then one contiguous and the other not
    w, v = torch.arange(240, dtype=torch.int64), torch.arange(240, dtype=torch.int64)
    w[1::2] = -1  # w[::2] is 0, 2, 4, ... as v[::2] is: b read with a's stride would match all along
    expect(w[:80:2], v[:120:3], "stride 2 (0, 2, 4, ...) against stride 3 (0, 3, 6, ...): they differ at element 1", 1)
    z = torch.arange(0, 80, 2, dtype=torch.int64)  # 0, 2, 4, ...: equal to x[::2] when contiguous
    expect(z[:20].clone(), y[::2], "a contiguous a against every second id of b; they differ at element 15", 15)
    expect(y[::2], z[:20].clone(), "every second id of a against a contiguous b; they differ at element 15", 15)


X64 = torch.arange(8, dtype=torch.int64)


def _wide(dtype: torch.dtype) -> torch.Tensor:
    """8 elements of ``dtype`` whose buffer holds at least 8 int64s: a kernel that reads it as int64
    (the bug under test) stays inside its memory."""
    return torch.arange(16, dtype=dtype)[:8]


def expect_rejected(a: torch.Tensor, b: torch.Tensor, what: str, hint: str) -> None:
    try:
        got = lab.prefix_len(a, b)
    except (ValueError, TypeError):
        return
    except Exception as e:  # noqa: BLE001  (what the kernel raised instead is the message)
        raise AssertionError(
            f"prefix_len of {what} raised {type(e).__name__} ({str(e).splitlines()[0][:120]}) instead of ValueError "
            f"or TypeError: {hint}"
        ) from None
    raise AssertionError(f"prefix_len of {what} returned {got!r} instead of raising ValueError or TypeError: {hint}")


@points(3)
def test_rejects_other_dtypes():
    """Anything but int64 raises ValueError or TypeError (an int32 tensor read as int64 gives nonsense),
    checked for each tensor on its own, on the whole dtype, and before any shortcut."""
    lab.build()
    dtype = "check a.dtype() == DLDataType{kDLInt, 64, 1} and TVM_FFI_THROW(TypeError) otherwise"
    each = "dtype: each tensor is checked on its own, a and b (is your check looking at one of them only?)"
    for a, b, what, hint in [
        (_wide(torch.int32), _wide(torch.int32), "two int32 tensors", f"dtype: {dtype}"),
        (_wide(torch.float32), _wide(torch.float32), "two float32 tensors", f"dtype: {dtype}"),
        (_wide(torch.int32), X64, "an int32 a (b is int64)", each),
        (X64, _wide(torch.int32), "an int32 b (a is int64)", each),
        (
            X64.double(),
            X64.double(),
            "two float64 tensors (64 bits, but not integers)",
            "dtype: compare the whole DLDataType (type code kDLInt, 64 bits, 1 lane), not its bits alone",
        ),
        (
            torch.empty(0, dtype=torch.int32),
            X64,
            "an empty int32 a",
            "check the inputs first, before a shortcut for empty arrays: an empty int32 tensor is still not int64",
        ),
    ]:
        expect_rejected(a, b, what, hint)


@points(3)
def test_rejects_other_shapes():
    """Anything but 1-D raises ValueError or TypeError: 2-D and 0-D tensors, each tensor on its own."""
    lab.build()
    each = "ndim: each tensor is checked on its own, a and b (is your check looking at one of them only?)"
    zero = "ndim: a 0-D tensor has no size(0); check ndim() == 1 (not ndim() <= 1) before reading its size"
    for a, b, what, hint in [
        (X64.view(2, 4), X64.view(2, 4), "two 2-D tensors", "ndim: check a.ndim() == 1 and b.ndim() == 1"),
        (X64.view(2, 4), X64, "a 2-D a (b is 1-D)", each),
        (X64, X64.view(2, 4), "a 2-D b (a is 1-D)", each),
        (torch.tensor(5), X64, "a 0-D a (b is 1-D)", zero),
        (X64, torch.tensor(5), "a 0-D b (a is 1-D)", zero),
    ]:
        expect_rejected(a, b, what, hint)


# ---- random arrays ----------------------------------------------------------------------------------
def random_pair(rng: random.Random) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Two arrays with a random shared prefix, stored in one of the ways the fixed cases try."""
    la, lb = rng.choice([0, 1, 2, 5, 17, 64, 65, 300]), rng.randint(0, 300)
    shared = rng.randint(0, min(la, lb))
    wide = rng.random() < 0.3  # ids that differ only above bit 31
    draw = lambda: rng.randrange(2**63) if rng.random() < 0.5 else rng.randrange(50_000)  # noqa: E731
    a = [draw() for _ in range(la)]
    b = a[:shared] + [draw() for _ in range(lb - shared)]
    if shared < min(la, lb):  # make the first mismatch a real one
        b[shared] = a[shared] ^ ((1 << 40) if wide else 1)
    ta, tb = torch.tensor(a, dtype=torch.int64), torch.tensor(b, dtype=torch.int64)
    layout = rng.choice(["contiguous", "strided", "view of a longer buffer"])
    if layout == "strided":  # each its own stride (1 for one of them at times)
        step_a, step_b = rng.choice([[2, 2], [3, 3], [1, 2], [2, 1], [2, 3], [3, 1]])
        sa, sb = torch.full((la * step_a,), -7, dtype=torch.int64), torch.full((lb * step_b,), -7, dtype=torch.int64)
        sa[::step_a], sb[::step_b] = ta, tb
        ta, tb = sa[::step_a], sb[::step_b]
        layout = f"strides {step_a} and {step_b}"
    elif layout == "view of a longer buffer":  # the shorter one continues like the longer one
        short, long = (ta, tb) if la <= lb else (tb, ta)
        short = torch.cat([short, long[len(short) :]])[: len(short)]
        ta, tb = (short, long) if la <= lb else (long, short)
    return ta, tb, layout


@points(12)
def test_random_arrays_match_python():
    """500 random pairs (lengths 0..300, ids up to 2^63, contiguous, strided or views of longer
    buffers) give exactly the Python compare's answer."""
    rng = random.Random(13)
    failures = []
    for _ in range(500):
        a, b, layout = random_pair(rng)
        try:
            expect(a, b, f"random arrays, {layout}")
        except AssertionError as e:
            failures.append((len(a) + len(b), str(e)))
    if failures:
        failures.sort()
        raise AssertionError(f"{len(failures)} of 500 random pairs differ; the smallest:\n{failures[0][1]}")


# ---- speed -----------------------------------------------------------------------------------------
def _best_us(fn, number: int, repeats: int = 10) -> float:
    """The fastest of ``repeats`` timings of ``number`` calls, per call in microseconds: another process
    can only add time to a timing, so the fastest one is the least disturbed."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, time.perf_counter() - start)
    return best / number * 1e6


@points(7)
def test_faster_than_python():
    """On two equal 32,768-token keys (the lesson's benchmark) your kernel is at least 5x faster than the
    engine's Python compare on lists (the reference kernel is 30-50x faster). Five rounds, each the best of
    ten timings of both, interleaved; the median round's speed-up counts."""
    n = 32_768
    a = torch.randint(0, 150_000, (n,), dtype=torch.int64)
    b = a.clone()
    la, lb = a.tolist(), b.tolist()
    expect(a, b, "two equal 32,768-token keys", n)  # points for speed only when the answer is right
    fn = lab.kernel()
    kernel = lambda: fn(a, b)  # noqa: E731
    python = lambda: common_prefix_len(la, lb)  # noqa: E731
    rounds = [(_best_us(kernel, number=4), _best_us(python, number=1)) for _ in range(5)]
    k_us, p_us = sorted(rounds, key=lambda r: r[1] / r[0])[len(rounds) // 2]  # the median round
    speedup = p_us / k_us
    assert speedup >= 5, (
        f"speed: prefix_len took {k_us:.0f} us on 32,768 tokens, the Python compare {p_us:.0f} us: {speedup:.1f}x "
        "faster, expected at least 5x. Is there a Python loop, .tolist() or a copy in prefix_len? The kernel "
        "should read the tensors in place"
    )


# ---- the engine on your kernel ------------------------------------------------------------------------
def _rounds(model, seed: int = 13) -> list[list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    vocab = ModelConfig.from_path(model).vocab_size
    ids = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    system, other = ids(40), ids(24)
    return [
        [system + ids(8)],  # fills the cache
        [system + ids(5), system[:20] + ids(12)],  # the whole system prompt, and a match ending inside it
        [other + ids(6), system + ids(3)],
        [other[:23] + ids(9), system + ids(8)],  # a mismatch at the last token of a cached key
    ]


@points(6, timeout=90)
@engine
def test_engine_with_your_kernel(tiny_llama):
    """The engine whose radix cache compares keys with your prefix_len (cache_type="lab13") generates
    the reference tokens and reuses as many cached prompt tokens as the engine's own cache."""
    lab.prefix_len(t(1, 2), t(1, 3))  # a stub (or a compile error) fails here, before any engine is built
    cls = lab.kernel_cache_class()
    rounds = _rounds(tiny_llama)
    args = dict(page_size=1, num_pages=512, debug_checks=True, attention_backend="torch")
    with lab.registered_cache(cls) as name, engine_failure("the radix cache comparing keys with your kernel"):
        got, got_cached, _ = generate_rounds(tiny_llama, rounds, cache_type=name, **args)
    want, want_cached, _ = generate_rounds(tiny_llama, rounds, cache_type="radix", **args)
    assert cls.calls > 0, "the engine never compared a key through your kernel (is the adapter's cache in use?)"
    for r, (g, w) in enumerate(zip(got_cached, want_cached)):
        assert g == w, (
            f"round {r}: the requests reused {g} cached prompt tokens with your kernel as the key compare, the "
            f"engine's own cache {w}: a wrong prefix length makes the cache split its keys at the wrong place"
        )
    diff = first_token_difference([x for r in got for x in r], [x for r in want for x in r])
    assert diff is None, f"with your kernel as the key compare the engine generated other tokens: {diff}"
