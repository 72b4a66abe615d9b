"""Probes: a lab file that takes its answer from the engine (or the grader) by one of ``ROUTES``, each
written as a student who meant to get past the grader would. Every probe must score 0, and its first
failing test must say where, as ``<lab file>:<line>`` (``tests/test_autograder.py``). They are mutants
of kind ``engine_reference`` graded on the tests named in ``must_fail`` only: one refusal in any test
zeroes the whole lab (``autograder/results.py``)."""

from mutants import Mutant

# the routes a lab could take to the engine's answer, each tried by at least one probe below
ROUTES = {
    "unwrap": "the reference through __wrapped__ / inspect.unwrap (a wrapper's original)",
    "object_new": "an engine object made with object.__new__ and handed out (by __new__ or a factory method)",
    "class_swap": "a lab object whose __class__ becomes a subclass of the engine's class",
    "private_helper": "a private helper of the module that holds the reference (lab 13's library build)",
    "code_copy": "the reference's code under a new function object",
    "grader_reference": "the grader's own reference (its policy, its test helpers)",
    "spawned_process": "delegation only where the grader runs the lab in another process (TP ranks, the server)",
    "own_process": "the engine run in a Python process the lab starts",
    "thread": "the reference run in a thread the lab starts",
    "loader": "the engine's C++ compiled or loaded through a loader other than load_inline",
    "library_shortcut": "a library function the lab's docstring rules out",
}

_PERCENTILE = (
    "    xs = sorted(values)\n    if not xs:\n        return math.nan\n    k = (len(xs) - 1) * p / 100\n"
    "    lo, hi = math.floor(k), math.ceil(k)\n    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)\n"
)
_RMS = (
    "    h = x.float()\n"
    "    h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)\n"
    "    return weight * h.to(x.dtype)\n"
)


def _probe(name, stem, edits, must_fail, hint, route, why) -> Mutant:
    return Mutant(name, stem, edits, must_fail, hint=hint, why=why, kind="engine_reference", route=route)


PROBES = [
    _probe(
        "unwrap_the_engine_function",
        "lab01_decoder",
        (
            (
                _RMS,
                (
                    "    import inspect\n"
                    "\n"
                    "    from minisgl.layers import norm\n"
                    "\n"
                    "    return inspect.unwrap(norm.rms_norm)(x, weight, eps)\n"
                ),
            ),
        ),
        ("rms_norm_fixed",),
        "your code calls the engine's own minisgl.layers.norm.rms_norm",
        "unwrap",
        "rms_norm calls inspect.unwrap() of the engine's rms_norm (once the original behind a tripwire)",
    ),
    _probe(
        "alias_of_the_unwrapped_engine",
        "lab12_benchmark",
        (
            (
                "def percentile(values: Sequence[float], p: float) -> float:\n",
                "def _mine(values: Sequence[float], p: float) -> float:\n",
            ),
            (
                "def summary(values: Sequence[float]) -> dict[str, float]:\n",
                "import inspect as _inspect\n\nfrom minisgl.benchmark import metrics as _metrics\n\n"
                "percentile = _inspect.unwrap(_metrics.percentile)\n\n\n"
                "def summary(values: Sequence[float]) -> dict[str, float]:\n",
            ),
        ),
        ("percentile_fixed",),
        "lab12_benchmark.py's percentile (lab12_benchmark.py:",
        "unwrap",
        "percentile is the unwrapped engine function, assigned at import",
    ),
    _probe(
        "engine_cache_made_by_new",
        "lab06_radix_cache",
        (
            (
                "class RadixCache(PrefixCache):\n    def __init__(self, page_size: int = 1):\n",
                "class RadixCache(PrefixCache):\n"
                "    def __new__(cls, page_size: int = 1):\n"
                "        from minisgl.kvcache.radix import RadixNode, RadixPrefixCache\n\n"
                "        cache = object.__new__(RadixPrefixCache)\n"
                "        PrefixCache.__init__(cache, page_size)\n"
                "        cache.root = object.__new__(RadixNode)\n"
                "        return cache\n\n"
                "    def __init__(self, page_size: int = 1):\n",
            ),
        ),
        ("empty_cache",),
        "defines __new__ (lab06_radix_cache.py:",
        "object_new",
        "RadixCache.__new__ hands out an engine RadixPrefixCache made with object.__new__",
    ),
    _probe(
        "engine_matcher_from_a_factory",
        "lab14_token_mask",
        (
            (
                "    def matcher(self, compiled: Compiled) -> LabMatcher:\n        return LabMatcher(self, compiled)\n",
                "    def matcher(self, compiled: Compiled) -> LabMatcher:\n"
                "        from minisgl.grammar.dfa_backend import DFAMatcher\n\n"
                "        m = object.__new__(DFAMatcher)  # the engine's matcher, its fields set here\n"
                "        m.__dict__.update(backend=self, compiled=compiled, state=compiled.dfa.start, done=False)\n"
                "        return m\n",
            ),
        ),
        ("matcher_spans_states",),
        "an object the engine did not make (lab14_token_mask.py:",
        "object_new",
        "LabGrammarBackend.matcher returns the engine's DFAMatcher, made with object.__new__",
    ),
    _probe(
        "allocator_becomes_the_engines",
        "lab03_paged_memory",
        (
            (
                "        self.is_free: list[bool] = [True] * num_pages  # is_free[page]: the page is in free_pages\n",
                "        self.is_free: list[bool] = [True] * num_pages  # is_free[page]: the page is in free_pages\n"
                "        from minisgl.kvcache.allocator import FreeListAllocator\n\n"
                "        self._free = torch.arange(num_pages, dtype=torch.int64)\n"
                "        self._is_free = torch.ones(num_pages, dtype=torch.bool)\n"
                "        self.__class__ = type('Allocator', (FreeListAllocator,), {})\n",
            ),
        ),
        ("allocator_starts_free",),
        "an object the engine did not make (lab03_paged_memory.py:",
        "class_swap",
        "Allocator.__init__ turns the object into a subclass of the engine's FreeListAllocator",
    ),
    _probe(
        "kernel_from_the_engines_build_helper",
        "lab13_jit_kernel",
        (
            (
                "    out = torch.empty(q.shape, dtype=q.dtype)\n"
                "    build().paged_decode(q, k_pool, v_pool, slots, lens, out, scale)\n"
                "    return out\n",
                "    from minisgl.kernels import jit\n\n"
                "    out = torch.empty(q.shape, dtype=q.dtype)\n"
                "    jit._build(jit.isa()).paged_decode_attention(q, k_pool, v_pool, slots, lens, out, scale, 1)\n"
                "    return out\n",
            ),
        ),
        ("docstring_example",),
        "your code calls the engine's own minisgl.kernels.jit._build (lab13_jit_kernel.py:",
        "private_helper",
        "paged_decode_attention runs the engine's C++ through jit._build, a private helper of cpu_module",
    ),
    _probe(
        "the_engines_code_in_a_new_function",
        "lab12_benchmark",
        (
            (
                _PERCENTILE,
                "    import types\n\n    from minisgl.benchmark import metrics\n\n"
                "    mine = types.FunctionType(metrics.percentile.__code__.replace(co_name='mine'), metrics.__dict__)\n"
                "    return mine(values, p)\n",
            ),
        ),
        ("percentile_fixed",),
        "runs as a copy of its code (lab12_benchmark.py:",
        "code_copy",
        "percentile runs the engine's percentile code under a new function object",
    ),
    _probe(
        "reserved_len_of_the_graders_policy",
        "lab05_admission",
        (
            (
                "        return req.max_device_len - 1\n",
                "        from autograder.scheduler_sim import Reference\n"
                "\n"
                "        return Reference.reserved_len(self, req)\n",
            ),
        ),
        ("reserved_len_covers_max_tokens",),
        "your code calls the engine's own autograder.scheduler_sim.Reference.reserved_len (lab05_admission.py:",
        "grader_reference",
        "reserved_len delegates to the grader's reference policy (autograder/scheduler_sim.py)",
    ),
    _probe(
        "rms_norm_of_the_graders_test",
        "lab01_decoder",
        (
            (
                _RMS,
                "    from autograder.test_lab01_decoder import ref_rms_norm\n"
                "\n"
                "    return ref_rms_norm(x, weight, eps)\n",
            ),
        ),
        ("rms_norm_fixed",),
        "your code calls the engine's own autograder.test_lab01_decoder.ref_rms_norm (lab01_decoder.py:",
        "grader_reference",
        "rms_norm calls the grader's own reference helper from the test module",
    ),
    _probe(
        "row_parallel_delegates_in_the_ranks",
        "lab10_tensor_parallel",
        (
            (
                "        partial = F.linear(x, self.weight)\n        y = all_reduce(partial)\n",
                "        import multiprocessing\n\n"
                "        if multiprocessing.parent_process() is not None:  # a spawned rank: nobody looking\n"
                "            from minisgl.layers import linear\n\n"
                "            return linear.RowParallelLinear.forward(self, x)\n"
                "        partial = F.linear(x, self.weight)\n        y = all_reduce(partial)\n",
            ),
        ),
        ("row_parallel_on_2_ranks",),
        "your code calls the engine's own minisgl.layers.linear.RowParallelLinear.forward (lab10_tensor_parallel.py:",
        "spawned_process",
        "RowParallelLinear.forward delegates to the engine's only in spawned ranks",
    ),
    _probe(
        "detokenizer_delegates_in_the_server",
        "lab11_detokenizer",
        (
            (
                "        self.ids += list(token_ids)\n"
                "        if self.tokenizer is None or self.read == len(self.ids):\n",
                "        import multiprocessing\n\n"
                "        if multiprocessing.parent_process() is not None:  # the server's detokenizer process\n"
                "            from minisgl.tokenizer.detokenizer import IncrementalDecoder\n\n"
                "            if not hasattr(self, 'inner'):\n"
                "                self.inner = IncrementalDecoder(self.tokenizer, self.skip)\n"
                "            return self.inner.push(token_ids)\n"
                "        self.ids += list(token_ids)\n"
                "        if self.tokenizer is None or self.read == len(self.ids):\n",
            ),
        ),
        ("engine_server_with_your_text_streams",),
        "your code makes an instance of the engine's own IncrementalDecoder (lab11_detokenizer.py:",
        "spawned_process",
        "LabDetokenizer.push delegates to the engine's IncrementalDecoder only inside the server's processes",
    ),
    _probe(
        "percentile_in_a_python_process",
        "lab12_benchmark",
        (
            (
                _PERCENTILE,
                "    import json\n    import subprocess\n    import sys\n\n"
                "    code = 'import json, sys; from minisgl.benchmark.metrics import percentile as f; '\n"
                "    code += 'print(json.dumps(f(*json.load(sys.stdin))))'\n"
                "    run = subprocess.run([sys.executable, '-c', code], input=json.dumps([list(values), p]), "
                "capture_output=True, text=True)\n"
                "    return json.loads(run.stdout)\n",
            ),
        ),
        ("percentile_fixed",),
        "your code starts a process (python, at lab12_benchmark.py:",
        "own_process",
        "percentile runs the engine's percentile in a Python process it starts",
    ),
    _probe(
        "percentile_in_a_thread",
        "lab12_benchmark",
        (
            (
                _PERCENTILE,
                "    from concurrent.futures import ThreadPoolExecutor\n\n"
                "    from minisgl.benchmark.metrics import percentile as engine\n\n"
                "    with ThreadPoolExecutor(1) as pool:\n"
                "        return pool.submit(engine, values, p).result()\n",
            ),
        ),
        ("percentile_fixed",),
        "(a thread it started)",
        "thread",
        "percentile runs the engine's percentile in a thread it starts",
    ),
    _probe(
        "loads_the_engines_library",
        "lab13_jit_kernel",
        (
            (
                "        _BUILT[source] = tvm_ffi.cpp.load_inline(\n"
                '            NAME, cpp_sources=source, functions=["paged_decode"], extra_cflags=CFLAGS\n'
                "        )\n",
                "        from pathlib import Path\n\n"
                "        import tvm_ffi\n\n"
                "        cache = Path.home() / '.cache' / 'tvm-ffi'\n"
                "        library = sorted(cache.glob('minisgl_cpu_*/*.so'))[0]\n"
                "        _BUILT[source] = tvm_ffi.load_module(str(library))\n",
            ),
        ),
        ("docstring_example",),
        "your build compiles or loads the engine's own C++ (the engine's library",
        "loader",
        "build() loads the engine's compiled CPU library from tvm_ffi's cache with tvm_ffi.load_module",
    ),
    _probe(
        "builds_the_engines_files",
        "lab13_jit_kernel",
        (
            (
                "        _BUILT[source] = tvm_ffi.cpp.load_inline(\n"
                '            NAME, cpp_sources=source, functions=["paged_decode"], extra_cflags=CFLAGS\n'
                "        )\n",
                "        from pathlib import Path\n\n"
                "        import minisgl.kernels\n\n"
                "        csrc = Path(minisgl.kernels.__file__).parent / 'csrc'\n"
                "        files = [str(csrc / 'paged_decode.cc')]\n"
                "        _BUILT[source] = tvm_ffi.cpp.load(NAME + '_files', cpp_files=files)\n",
            ),
        ),
        ("docstring_example",),
        "your build compiles or loads the engine's own C++ (the engine's source file paged_decode.cc",
        "loader",
        "build() compiles the engine's paged_decode.cc with tvm_ffi.cpp.load (a file, not inline text)",
    ),
    _probe(
        "attention_by_torch_sdpa",
        "lab01_decoder",
        (
            (
                '    scores = torch.einsum("thd,shd->hts", q.float(), keys) * scale  # [H, T, S]\n',
                "    mask = torch.arange(seq)[None, :] <= torch.arange(seq - num_q, seq)[:, None]\n"
                "    out = torch.nn.functional.scaled_dot_product_attention(\n"
                "        q.float().transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),\n"
                "        attn_mask=mask, scale=scale,\n"
                "    )\n"
                "    return out.transpose(0, 1).to(q.dtype)\n"
                '    scores = torch.einsum("thd,shd->hts", q.float(), keys) * scale  # [H, T, S]\n',
            ),
        ),
        ("gqa_attention_prefill",),
        "your code calls torch.nn.functional.scaled_dot_product_attention (lab01_decoder.py:",
        "library_shortcut",
        "gqa_attention is torch's fused attention, which the lab's docstring rules out",
    ),
    _probe(
        "detokenizer_by_decode_stream",
        "lab11_detokenizer",
        (
            (
                "        self.ids += list(token_ids)\n"
                "        if self.tokenizer is None or self.read == len(self.ids):\n",
                "        if self.tokenizer is not None and hasattr(self.tokenizer, 'backend_tokenizer'):\n"
                "            from tokenizers.decoders import DecodeStream\n\n"
                "            if not hasattr(self, 'stream'):\n"
                "                self.stream = DecodeStream(skip_special_tokens=self.skip)\n"
                "            backend = self.tokenizer.backend_tokenizer\n"
                "            text = ''.join(self.stream.step(backend, t) or '' for t in token_ids)\n"
                "            self.ids += list(token_ids)\n"
                "            self.read = len(self.ids)\n"
                "            return text\n"
                "        self.ids += list(token_ids)\n"
                "        if self.tokenizer is None or self.read == len(self.ids):\n",
            ),
        ),
        ("detokenizer_joins_to_the_full_decode",),
        "your code calls tokenizers.decoders.DecodeStream (lab11_detokenizer.py:",
        "library_shortcut",
        "LabDetokenizer.push is the tokenizers library's incremental DecodeStream, which the docstring rules out",
    ),
    _probe(
        "launches_the_engines_decode_kernel",
        "lab16_flash_decoding",
        (
            (
                "    split_kernel[(bsz, kv_heads, splits)](\n",
                "    from minisgl.kernels import triton_attention\n\n"
                "    triton_attention._decode_kernel[(bsz, kv_heads, splits)](\n"
                "        q, q.stride(0), q.stride(1), k_slots, v_slots, k_slots.stride(0),\n"
                "        page_table, page_table.stride(0), rows, lens,\n"
                "        out, out.stride(0), out.stride(1), part, lse, scale,\n"
                "        GROUP=group, HEAD_DIM=dim, SPLITS=splits, BLOCK_H=max(16, triton.next_power_of_2(group)),\n"
                "        BLOCK_N=64, EXACT=exact(q.dtype),\n"
                "    )\n"
                "    split_kernel[(0, kv_heads, splits)](\n",
            ),
        ),
        ("docstring_examples",),
        "your code launches the engine's own kernel minisgl.kernels.triton_attention._decode_kernel "
        "(lab16_flash_decoding.py:",
        "private_helper",
        "decode launches the engine's Triton decode kernel (a private helper of triton_attention) on its own grid",
    ),
    _probe(
        "the_engines_merge_kernel_jitted_again",
        "lab16_flash_decoding",
        (
            (
                "    merge_kernel[(bsz, heads)](\n",
                "    from minisgl.kernels import triton_attention\n\n"
                "    again = triton.jit(triton_attention._merge_kernel.fn)  # a new kernel object from its function\n"
                "    again[(bsz, heads)](\n"
                "        part, lse, out, out.stride(0), out.stride(1),\n"
                "        HEAD_DIM=dim, SPLITS=splits, BLOCK_S=max(2, triton.next_power_of_2(splits)),\n"
                "    )\n"
                "    merge_kernel[(0, heads)](\n",
            ),
        ),
        ("docstring_examples",),
        "your code launches a copy of the engine's own kernel minisgl.kernels.triton_attention._merge_kernel "
        "(lab16_flash_decoding.py:",
        "code_copy",
        "merge compiles the engine's merge kernel again from its Python function (triton.jit(kernel.fn)) and "
        "launches that",
    ),
]
