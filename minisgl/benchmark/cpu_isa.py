"""The CPU kernels of one instruction-set level against torch, and bf16 weights against float32, taking
turns in one process (medians), on the embedded model:

    MINISGL_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python -m minisgl.benchmark.cpu_isa linear --rows 1,16,44,64
    ... python -m minisgl.benchmark.cpu_isa step --batch-size 1,64

``linear``: all of the model's products (30 layers' qkv, o, gate_up, down and the LM head) at a number
of rows, through the kernel (``small_linear``) and through ``F.linear``. ``step``: decode steps of a
batch of equal requests (32-token prompts, 16 steps), the milliseconds of a step (median of a run),
for each dtype, with the C++ decode layer (``cpp``) and with torch's ops alone (``torch``: the Python
layers, ``F.linear``). The other variables make torch use what an AVX2-only CPU gives it, so an
AVX-512 machine can stand in for one (its memory bandwidth, not its vector width, is then the same).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import time

import torch
import torch.nn.functional as F

from minisgl.env import ENV
from minisgl.kernels import jit
from minisgl.kernels import small_linear as sl

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def model_weights(dtype: torch.dtype) -> list[torch.Tensor]:
    """Random weights of the embedded model's shapes: 30 layers and the LM head (each its own memory)."""
    hidden, inter, qkv, vocab = 576, 1536, (9 + 2 * 3) * 64, 49152
    layer = [(qkv, hidden), (hidden, hidden), (2 * inter, hidden), (hidden, inter)]
    return [torch.randn(n, k, dtype=dtype) * 0.02 for _ in range(30) for n, k in layer] + [
        torch.randn(vocab, hidden, dtype=dtype) * 0.02
    ]


def bench_linear(rows: list[int], dtypes: list[str], repeats: int) -> None:
    print(f"level {jit.isa()}, torch capability {torch.backends.cpu.get_cpu_capability()}")
    for name in dtypes:
        weights = model_weights(DTYPES[name])
        for m in rows:
            xs = {k: torch.randn(m, k, dtype=DTYPES[name]) for k in {w.shape[1] for w in weights}}
            out = {"kernel": [], "torch": []}
            for _ in range(repeats):  # taking turns
                for how in out:
                    t = time.perf_counter()
                    for w in weights:
                        if how == "kernel":
                            y = torch.empty(m, w.shape[0], dtype=w.dtype)
                            jit.cpu_module().small_linear(xs[w.shape[1]], w, y, torch.get_num_threads())
                        else:
                            F.linear(xs[w.shape[1]], w)
                    out[how].append((time.perf_counter() - t) * 1e3)
            k, t = statistics.median(out["kernel"]), statistics.median(out["torch"])
            print(f"{name:8} rows {m:3}: kernel {k:7.2f} ms, torch {t:7.2f} ms, kernel/torch {k / t:.2f}")


def eltwise_ops(n: int, dt: torch.dtype, rope) -> dict[str, tuple]:
    """(kernel, torch) callables of each element-wise step on ``n`` tokens of the embedded model."""
    from minisgl.kernels import cpu_fused as cf
    from minisgl.layers.norm import rms_norm
    from minisgl.layers.rotary import apply_rotary

    x, w = torch.randn(n, 576, dtype=dt), torch.rand(576, dtype=dt) + 0.5
    gu, pos = torch.randn(n, 2 * 1536, dtype=dt), torch.randint(0, 8192, (n,))
    q, k = torch.randn(n, 9 * 64, dtype=dt), torch.randn(n, 3 * 64, dtype=dt)

    def torch_silu():
        gate, up = gu.chunk(2, dim=-1)
        return F.silu(gate) * up

    def torch_rope():
        cos, sin = rope.cos_sin[pos].to(dt).unsqueeze(1).chunk(2, dim=-1)
        return apply_rotary(q.view(n, 9, 64), cos, sin), apply_rotary(k.view(n, 3, 64), cos, sin)

    return {
        "rmsnorm": (lambda: cf.rmsnorm(x, w, 1e-5), lambda: rms_norm(x, w, 1e-5)),
        "silu_and_mul": (lambda: cf.silu_and_mul(gu), torch_silu),
        "rope": (lambda: cf.apply_rope_with_cos_sin_cache_inplace(pos, q, k, 64, rope.cos_sin, True), torch_rope),
    }


def bench_eltwise(tokens: list[int], dtypes: list[str], repeats: int) -> None:
    """The element-wise kernels (``cpu_fused``) against the layers' torch versions, taking turns."""
    from minisgl.layers.rotary import RotaryEmbedding

    print(f"level {jit.isa()}, torch capability {torch.backends.cpu.get_cpu_capability()}")
    rope = RotaryEmbedding(64, 8192, 100000.0)
    for name in dtypes:
        for n in tokens:
            for op, (kernel, ref) in eltwise_ops(n, DTYPES[name], rope).items():
                times: dict[str, list[float]] = {"kernel": [], "torch": []}
                for _ in range(repeats):
                    for how, fn in (("kernel", kernel), ("torch", ref)):
                        t = time.perf_counter()
                        fn()
                        times[how].append((time.perf_counter() - t) * 1e3)
                k_ms, t_ms = statistics.median(times["kernel"]), statistics.median(times["torch"])
                print(f"{name:8} {op:13} {n:5} tokens: kernel {k_ms:7.3f} ms, torch {t_ms:7.3f} ms")


@contextlib.contextmanager
def torch_only():
    """torch's ops alone: the Python layers (no C++ layer, no element-wise kernels), F.linear."""
    saved = {level: dict(rows) for level, rows in sl.MAX_ROWS.items()}
    ENV.fused_kernels = False
    for rows in sl.MAX_ROWS.values():
        rows.update({dt: 0 for dt in rows})
    try:
        yield
    finally:
        ENV.fused_kernels = True
        sl.MAX_ROWS.update(saved)


def step_ms(llm, batch: int) -> float:
    """The median milliseconds of a decode step of ``batch`` equal requests (prefill not counted)."""
    from minisgl import SamplingParams

    sched, marks = llm.scheduler, []
    launch = sched.launch

    def timed(b, info):
        t = time.perf_counter()
        out = launch(b, info)
        if b.is_decode and b.size == batch:
            marks.append(time.perf_counter() - t)
        return out

    rng = random.Random(0)
    prompts = [[rng.randint(100, 10000) for _ in range(32)] for _ in range(batch)]
    sched.flush_cache()
    sched.launch = timed
    try:
        llm.generate(prompts, SamplingParams(max_tokens=17, ignore_eos=True), use_tqdm=False)
    finally:
        del sched.launch
    return statistics.median(marks) * 1e3


# the embedded model's architecture (SmolLM2-135M), for --dummy-weight where its GGUF cannot be converted
SMOLLM2 = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
    eos_token_id=2,
)


def bench_step(batches: list[int], dtypes: list[str], variants: list[str], repeats: int, dummy: bool) -> None:
    from minisgl import LLM
    from minisgl.models import KNOWN_CONFIGS

    print(f"level {jit.isa()}, torch capability {torch.backends.cpu.get_cpu_capability()}")
    KNOWN_CONFIGS["SmolLM2-135M"] = SMOLLM2
    kw = dict(model="SmolLM2-135M", dummy_weight=True) if dummy else {}
    llms = {name: LLM(dtype=name, device="cpu", **kw) for name in dtypes}
    for batch in batches:
        runs: dict[tuple, list[float]] = {(d, v): [] for d in dtypes for v in variants}
        for _ in range(repeats):  # taking turns
            for d, v in runs:
                with torch_only() if v == "torch" else contextlib.nullcontext():
                    runs[d, v].append(step_ms(llms[d], batch))
        for (d, v), ms in runs.items():
            med = statistics.median(ms)
            rounds = ", ".join(f"{x:.1f}" for x in ms)
            print(f"batch {batch:3} {d:8} {v:5}: {med:7.2f} ms a step ({batch / med * 1e3:7.1f} tok/s)  [{rounds}]")
    for llm in llms.values():
        llm.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("linear", "step", "eltwise"))
    ap.add_argument("--tokens", default="1,64,8064", help="eltwise: rows")
    ap.add_argument("--rows", default="1,8,16,32,44,64", help="linear: rows of x")
    ap.add_argument("--batch-size", default="1,64", help="step: requests decoding together")
    ap.add_argument("--dtype", default="float32,bfloat16")
    ap.add_argument("--variants", default="cpp,torch", help="step: cpp (the C++ decode layer) and/or torch")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dummy-weight", action="store_true", help="step: random weights of the embedded model's shapes")
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    dtypes = args.dtype.split(",")
    if args.what == "eltwise":
        bench_eltwise([int(n) for n in args.tokens.split(",")], dtypes, args.repeats)
    elif args.what == "linear":
        bench_linear([int(r) for r in args.rows.split(",")], dtypes, args.repeats)
    else:
        sizes = [int(b) for b in args.batch_size.split(",")]
        bench_step(sizes, dtypes, args.variants.split(","), args.repeats, args.dummy_weight)


if __name__ == "__main__":
    main()
