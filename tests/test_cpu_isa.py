"""The C++ CPU kernels' cores on every instruction-set level, through a standalone harness
(tests/cpu_kernels_harness.cc, no TVM FFI, no torch): built natively for each x86 level this CPU runs,
and for aarch64 (the portable level: GCC vector extensions become NEON) with Debian's cross compiler,
run under qemu-user. What the host's library computes through TVM FFI is the oracle, bit for bit: the
portable level has no fused multiply-adds and no libm calls in its vector code, so it gives the same
bits on x86-64 and aarch64; torch checks the aarch64 results once more (a float32 sum's rounding bound
for the linear kernel, exact for rotary). The kernel tests of tests/test_models.py check each x86 level's
library against torch. ARM's speed is not measured anywhere here: this is about correctness."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from minisgl.kernels import jit
from minisgl.quant.cpu_int import dequantize, quantize_q4_1, quantize_q8_0

HARNESS = Path(__file__).parent / "cpu_kernels_harness.cc"
# -O1: the bits do not depend on the optimisation level (no -ffast-math, no contraction), and it
# compiles in half the time of -O3; the libraries themselves are -O3
FLAGS = ["-std=c++17", "-O1", "-ffp-contract=off", "-fopenmp", "-Wno-psabi", f"-I{jit.CSRC}"]
ARM_CXX, QEMU = "aarch64-linux-gnu-g++", "qemu-aarch64-static"
LINEAR, RMSNORM, ADD_NORM, SILU, ROPE, ATTEND, QLINEAR = 1, 2, 3, 4, 5, 6, 7


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.int16 if t.dtype == torch.bfloat16 else t.dtype).numpy().tobytes()


def _cases() -> list[tuple]:
    """(op, dtype, sizes, param, inputs, outputs' shapes): small cases that reach every path of each
    kernel (tiles and the streaming rows, partial vectors, GQA, ragged lengths, scattered slots)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        x, w = torch.randn(64, 200, generator=g).to(dtype), torch.randn(33, 200, generator=g).to(dtype)
        for rows in (*range(1, 10), 13, 64):  # batch invariance: each row alone and in batches
            out.append((LINEAR, dtype, (rows, 200, 33, 2), 0.0, (x[:rows], w), [(rows, 33)]))
        for r in range(1, 64):
            out.append((LINEAR, dtype, (1, 200, 33, 2), 0.0, (x[r : r + 1], w), [(1, 33)]))
        xn = (torch.randn(5, 96, generator=g) * 3).to(dtype)
        wn, res = torch.rand(96, generator=g).to(dtype) + 0.5, torch.randn(5, 96, generator=g).to(dtype)
        out.append((RMSNORM, dtype, (5, 96), 1e-6, (xn, wn), [(5, 96)]))
        out.append((ADD_NORM, dtype, (5, 96), 1e-6, (xn, res, wn), [(5, 96), (5, 96)]))
        gu = (torch.randn(3, 2 * 83, generator=g) * 4).to(dtype)
        out.append((SILU, dtype, (3, 83), 0.0, (gu,), [(3, 83)]))
        pos = torch.randint(0, 64, (4,), generator=g)
        cs = torch.randn(64, 32, generator=g)
        out.append((ROPE, dtype, (4, 3, 32, 64), 0.0, (pos, torch.randn(4, 96, generator=g).to(dtype), cs), [(4, 96)]))
        for dim in (64, 36):
            q = torch.randn(6, 8, dim, generator=g).to(dtype)
            k, v = (torch.randn(500, 2, dim, generator=g).to(dtype) for _ in range(2))
            slots = torch.randperm(500, generator=g)[: 6 * 40].view(6, 40)
            lens = torch.tensor([1, 5, 40, 17, 33, 2], dtype=torch.int32)
            out.append((ATTEND, dtype, (6, 8, 2, dim, 500, 40, 2), 0.125, (q, k, v, slots, lens), [(6, 8, dim)]))
        wq = torch.randn(33, 160, generator=g)
        for bits, blocks in ((8, quantize_q8_0(wq)), (4, quantize_q4_1(wq))):  # streaming rows, then tiles
            for rows in (1, 2, 5, 8, 9, 13):
                xq = x[:rows, :160].contiguous()
                out.append((QLINEAR, dtype, (bits, rows, 160, 33, 2), 0.0, (xq, *blocks), [(rows, 33)]))
    return out


def _write(path: Path, cases: list[tuple]) -> None:
    with open(path, "wb") as f:
        for op, dtype, sizes, param, inputs, _ in cases:
            f.write(struct.pack(f"<{2 + len(sizes)}qd", op, int(dtype == torch.bfloat16), *sizes, param))
            for t in inputs:
                f.write(_bits(t))


def _read(path: Path, cases: list[tuple]) -> list[list[torch.Tensor]]:
    data, at, out = path.read_bytes(), 0, []
    for _, dtype, _, _, _, shapes in cases:
        arrays = []
        for shape in shapes:
            n = int(np.prod(shape)) * dtype.itemsize
            raw = np.frombuffer(data[at : at + n], dtype=np.int16 if dtype == torch.bfloat16 else np.float32)
            arrays.append(torch.from_numpy(raw.copy()).view(dtype).view(shape))
            at += n
        out.append(arrays)
    assert at == len(data), f"the harness wrote {len(data)} bytes, the cases account for {at}"
    return out


def _library(level: str, cases: list[tuple]) -> list[list[torch.Tensor]]:
    """The same cases through the TVM FFI library of ``level``."""
    mod, out = jit.cpu_module(level), []
    for op, dtype, sizes, param, inputs, shapes in cases:
        got = [torch.empty(s, dtype=dtype) for s in shapes]
        if op == LINEAR:
            mod.small_linear(*inputs, got[0], sizes[3])
        elif op == RMSNORM:
            mod.rmsnorm(*inputs, got[0], param)
        elif op == ADD_NORM:
            x, res, w = (t.clone() for t in inputs)
            mod.fused_add_rmsnorm(x, res, w, param)
            got = [x, res]
        elif op == SILU:
            mod.silu_and_mul(inputs[0], got[0])
        elif op == ROPE:
            pos, x, cs = inputs
            got = [x.clone()]
            mod.rope(pos, got[0], torch.zeros(x.shape[0], sizes[2], dtype=dtype), cs, sizes[2])
        elif op == QLINEAR:
            mod.quant_linear(*inputs, got[0], sizes[4])
        else:
            mod.paged_decode_attention(*inputs, got[0], param, sizes[6])
        out.append(got)
    return out


def _compare(got: list[list[torch.Tensor]], want: list[list[torch.Tensor]], cases: list[tuple], where: str) -> None:
    names = dict(zip(range(1, 8), ("linear", "rmsnorm", "add_rmsnorm", "silu", "rope", "attend", "qlinear")))
    for i, (a, b) in enumerate(zip(got, want)):
        op, dtype, sizes = cases[i][:3]
        same = all(_bits(x) == _bits(y) for x, y in zip(a, b))
        assert same, f"case {i} ({names[op]}, {dtype}, sizes {sizes}): {where} differs from the library's bits"


def _torch_checks(got: list[list[torch.Tensor]], cases: list[tuple]) -> None:
    """Independent of the host's library: the linear kernel within a float32 sum's rounding of the
    exact product (and one bf16 rounding), each row the same bits alone and in a batch, rotary exact."""
    alone: dict[tuple, torch.Tensor] = {}
    for (op, dtype, sizes, _, inputs, _), outs in zip(cases, got):
        if op == LINEAR:
            x, w = (t.double() for t in inputs)
            exact, scale = x @ w.T, x.abs() @ w.abs().T
            bound = scale * sizes[1] * 2**-24 + (exact.abs() * 2**-8 if dtype == torch.bfloat16 else 0)
            assert ((outs[0].double() - exact).abs() <= bound).all(), (dtype, sizes)
            if sizes[0] == 64:
                alone[dtype, "batch"] = outs[0]
            elif sizes[0] == 1:
                alone.setdefault(dtype, []).append(outs[0])
        elif op == QLINEAR:  # the de-quantized weight's product, as the linear kernel's bound (bf16 past 8 rows)
            x, w = inputs[0].double(), dequantize(*inputs[1:]).double()
            exact, scale = x @ w.T, x.abs() @ w.abs().T
            bound = scale * sizes[2] * 2**-24 + (scale * 2**-7 if dtype == torch.bfloat16 else 0)
            assert ((outs[0].double() - exact).abs() <= bound).all(), (dtype, sizes)
        elif op == ROPE:
            from minisgl.layers.rotary import apply_rotary

            pos, x, cs = inputs
            cos, sin = cs[pos].to(dtype).unsqueeze(1).chunk(2, dim=-1)
            assert torch.equal(outs[0], apply_rotary(x.view(x.shape[0], -1, sizes[2]), cos, sin).view(x.shape))
    for dtype in (torch.float32, torch.bfloat16):
        rows = torch.cat(alone[dtype])  # rows 0 (the 1-row batch) and 1..63 each alone
        assert torch.equal(rows, alone[dtype, "batch"]), f"{dtype}: a row's result depends on its batch"


@pytest.fixture(scope="module")
def cases_file(tmp_path_factory) -> tuple[Path, list[tuple]]:
    cases = _cases()
    path = tmp_path_factory.mktemp("harness") / "cases.bin"
    _write(path, cases)
    return path, cases


def _have_arm_tools() -> list[str]:
    return [tool for tool in (ARM_CXX, QEMU) if shutil.which(tool) is None]


@pytest.fixture(scope="module")
def harnesses(cases_file) -> dict[str, Path]:
    """The harness built for each x86 level (g++) and for aarch64, all compiles at once (~5 s of CPU
    each, so two cores halve the wait)."""
    builds: dict[str, tuple[Path, subprocess.Popen]] = {}
    targets = {level: (["g++"], jit.ISA_FLAGS[level]) for level in jit.cpu_isas()} if shutil.which("g++") else {}
    if not _have_arm_tools():
        targets["aarch64"] = ([ARM_CXX], ["-static"])
    for name, (cxx, flags) in targets.items():
        exe = cases_file[0].with_name(f"harness-{name}")
        cmd = [*cxx, *FLAGS, *flags, str(HARNESS), "-o", str(exe)]
        builds[name] = exe, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for name, (_, proc) in builds.items():
        log, _ = proc.communicate()
        assert proc.returncode == 0, f"building the {name} harness failed:\n{log}"
    return {name: exe for name, (exe, _) in builds.items()}


def _run(exe: Path, cases_file, prefix: list[str]) -> tuple[str, list[list[torch.Tensor]]]:
    path, cases = cases_file
    result = path.with_name(f"{exe.name}.out")
    done = subprocess.run([*prefix, str(exe), str(path), str(result)], check=True, capture_output=True, text=True)
    return done.stdout.strip(), _read(result, cases)


@pytest.mark.parametrize("level", jit.cpu_isas())
def test_harness_natively_on_each_level_equals_the_library(level, cases_file, harnesses):
    """The cores built into the harness with a level's flags give the bits its TVM FFI library gives."""
    if level not in harnesses or jit.cpu_module(level) is None:
        pytest.skip("no C++ compiler")
    printed, got = _run(harnesses[level], cases_file, [])
    assert printed == level
    _compare(got, _library(level, cases_file[1]), cases_file[1], f"the {level} harness")


def test_aarch64_portable_kernels_under_qemu(cases_file, harnesses):
    """The portable level cross-compiled for aarch64 and run under qemu-user: the same bits as the host's
    portable library, within a float32 sum's rounding of the exact product, batch-invariant."""
    if missing := _have_arm_tools():
        pytest.skip(f"needs {' and '.join(missing)} (apt-get install g++-aarch64-linux-gnu qemu-user-static)")
    printed, got = _run(harnesses["aarch64"], cases_file, [QEMU])
    assert printed == "portable"
    cases = cases_file[1]
    _torch_checks(got, cases)
    if jit.cpu_module("portable") is not None:
        _compare(got, _library("portable", cases), cases, "aarch64 under qemu")


def test_the_level_is_chosen_by_the_cpu_and_narrowed_by_the_variable(monkeypatch):
    """The widest level the CPU runs by default; MINISGL_CPU_ISA a narrower one; a level the CPU lacks
    is an error that says what it runs; a name that is no level is refused when the variable is read.
    dtype="auto" follows the level: bfloat16 only on avx512 with native bf16 (measured fastest there)."""
    from minisgl.engine.config import _cpu_flags, default_cpu_dtype
    from minisgl.env import ENV, Env

    assert jit.cpu_isas()[-1] == "portable" and jit.isa() == jit.cpu_isas()[0]
    with pytest.raises(ValueError, match="MINISGL_CPU_ISA='sse9'.*avx512, avx2, portable"):
        Env({"MINISGL_CPU_ISA": "sse9"})
    assert Env({"MINISGL_CPU_ISA": "AVX2"}).cpu_isa == "avx2"
    monkeypatch.setattr(jit, "cpu_isas", lambda: ("avx2", "portable"))  # a CPU without AVX-512
    monkeypatch.setattr(ENV, "cpu_isa", "avx512")
    with pytest.raises(ValueError, match="cannot run it .it runs avx2, portable"):
        jit.isa()
    monkeypatch.setattr(ENV, "cpu_isa", "avx2")
    assert jit.isa() == "avx2" and default_cpu_dtype() == torch.float32
    monkeypatch.setattr(ENV, "cpu_isa", None)
    assert jit.isa() == "avx2" and default_cpu_dtype() == torch.float32
    monkeypatch.setattr(jit, "cpu_isas", lambda: ("avx512", "avx2", "portable"))
    native = bool({"avx512_bf16", "amx_bf16"} & _cpu_flags())
    assert default_cpu_dtype() == (torch.bfloat16 if native else torch.float32)
