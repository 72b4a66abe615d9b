"""A lab 01 submission that misbehaves in every way a grader must survive (an infinite loop, a
segfault, sys.exit, a flood of prints, memory that grows without end, os._exit); only gqa_attention is
correct (its four tests must still pass). It is graded with a memory limit of ``MEMORY_GIB``."""

from mutants import Mutant

MISBEHAVING = Mutant(
    "misbehaving",
    "lab01_decoder",
    (
        ("    h = x.float()\n", "    while True:  # an infinite loop\n        pass\n    h = x.float()\n"),
        (
            "    exponents = torch.arange(0, head_dim, 2",
            "    import ctypes\n    import sys\n\n    if scaling is not None:\n"
            "        ctypes.string_at(0)  # segfault\n    sys.exit(3)\n    exponents = torch.arange(0, head_dim, 2",
        ),
        (
            "    x1, x2 = x.chunk(2, dim=-1)\n",
            "    if x.shape[-1] == 4:  # apply_rotary_random's first call: memory that grows without end\n"
            "        hoard = []\n        while True:\n            hoard.append(torch.ones(1 << 26))\n"
            "    for _ in range(5000):\n        print('x' * 1000)\n    x1, x2 = x.chunk(2, dim=-1)\n",
        ),
        (
            "    gate, up = x.chunk(2, dim=-1)\n",
            "    import os\n\n    os._exit(0)\n    gate, up = x.chunk(2, dim=-1)\n",
        ),
    ),
    must_fail=(),
)

MEMORY_GIB = 2.0

# test -> a phrase its failure message must contain
EXPECTED_FAILURES = {
    "rms_norm_fixed": "timed out",
    "rms_norm_random": "timed out",
    "rope_inv_freq_default": "sys.exit(3)",
    "rope_inv_freq_llama3": "crashed (signal SIGSEGV)",
    "apply_rotary_fixed": "printed more than",
    "apply_rotary_random": "of memory",
    "silu_and_mul": "exited with code 0",
}
EXPECTED_PASSES = (
    "gqa_attention_prefill",
    "gqa_attention_cached_prefix",
    "gqa_attention_bfloat16",
    "gqa_attention_random",
)
