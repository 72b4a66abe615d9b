"""Broken variants of solutions/lab01_decoder.py: one per pitfall its docstring names, one of each kind of
grader hole (``mutants.KINDS``), and a correct one written another way (``EQUIVALENT``)."""

from mutants import Mutant

STEM = "lab01_decoder"

# every fixed unit test -> the randomized test of the same function, which must fail with it
RANDOMIZED = {
    "rms_norm_fixed": "rms_norm_random",
    "rms_norm_low_precision": "rms_norm_random",
    "rope_inv_freq_default": "rope_inv_freq_random",
    "rope_inv_freq_llama3": "rope_inv_freq_random",
    "apply_rotary_fixed": "apply_rotary_random",
    "gqa_attention_prefill": "gqa_attention_random",
    "gqa_attention_cached_prefix": "gqa_attention_random",
    "gqa_attention_bfloat16": "gqa_attention_random",
}

_ALL_FLOAT32 = (  # attention_in_bfloat16: none of q, k, v is converted to float32
    ("keys = k.float().repeat_interleave(group, dim=1)", "keys = k.repeat_interleave(group, dim=1)"),
    ("values = v.float().repeat_interleave(group, dim=1)", "values = v.repeat_interleave(group, dim=1)"),
    ('torch.einsum("thd,shd->hts", q.float(), keys)', 'torch.einsum("thd,shd->hts", q, keys)'),
)

MUTANTS = [
    Mutant(
        "rms_norm_without_eps",
        STEM,
        (("h.pow(2).mean(dim=-1, keepdim=True) + eps)", "h.pow(2).mean(dim=-1, keepdim=True))"),),
        must_fail=("rms_norm_fixed", "rms_norm_random"),
        hint="eps goes inside the square root",
        why="eps dropped: rows of tiny values are scaled up to unit norm",
    ),
    Mutant(
        "rms_norm_in_low_precision",
        STEM,
        (("    h = x.float()\n", "    h = x\n"),),
        must_fail=("rms_norm_low_precision", "rms_norm_random"),
        hint="computing the mean of squares in bfloat16",
        why="no float32: the mean of squares and the normalisation run in bfloat16 (float16 overflows)",
    ),
    Mutant(
        "rms_norm_weight_in_float32",
        STEM,
        (("    return weight * h.to(x.dtype)\n", "    return (weight.float() * h).to(x.dtype)\n"),),
        must_fail=("rms_norm_low_precision", "rms_norm_random"),
        hint="multiplying by weight in float32 and casting to bfloat16 at the end",
        why="the other order: the weight multiply in float32, one cast at the end",
    ),
    Mutant(
        "rms_norm_casts_too_early",
        STEM,
        (
            (
                "    h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)\n",
                "    h = x * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps).to(x.dtype)\n",
            ),
        ),
        must_fail=("rms_norm_low_precision", "rms_norm_random"),
        hint="casting back to bfloat16 too early",
        why="the rsqrt factor is cast to bfloat16 and multiplies x in bfloat16",
    ),
    Mutant(
        "rope_fixed_base",
        STEM,
        (("inv_freq = 1.0 / (base**exponents)", "inv_freq = 1.0 / (10000.0**exponents)"),),
        must_fail=("rope_inv_freq_default", "rope_inv_freq_random", "engine_tiny_qwen3"),
        hint="a hard-coded base 10000",
        why="the frequency base is hard-coded to Llama-2's 10000 instead of the model's rope_theta",
    ),
    Mutant(
        "rope_blend_swapped",
        STEM,
        (
            (
                "blended = (1 - s) * inv_freq / scaling.factor + s * inv_freq",
                "blended = s * inv_freq / scaling.factor + (1 - s) * inv_freq",
            ),
        ),
        must_fail=("rope_inv_freq_llama3", "rope_inv_freq_random"),
        hint="swapping the blend's weights",
        why="Llama-3 scaling's middle band blends the wrong way round",
    ),
    Mutant(
        "rotary_adjacent_pairs",
        STEM,
        (
            (
                "    x1, x2 = x.chunk(2, dim=-1)\n"
                "    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)\n",
                "    x1, x2 = x[..., 0::2], x[..., 1::2]\n"
                "    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)\n",
            ),
        ),
        must_fail=("apply_rotary_fixed", "apply_rotary_random"),
        hint="rotating adjacent pairs (x[2i], x[2i+1])",
        why="the GPT-J / Meta layout instead of HF's rotate-half pairs",
    ),
    Mutant(
        "rotary_sin_sign",
        STEM,
        (
            (
                "torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)",
                "torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)",
            ),
        ),
        must_fail=("apply_rotary_fixed", "apply_rotary_random"),
        hint="the sign of sin flipped",
        why="rotates by minus the angle",
    ),
    Mutant(
        "attention_not_causal",
        STEM,
        (
            (
                'scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))',
                "scores = scores  # no mask",
            ),
        ),
        must_fail=("gqa_attention_prefill", "gqa_attention_cached_prefix", "gqa_attention_random"),
        hint="attention without the causal mask",
        why="every query sees the whole sequence, future tokens included",
    ),
    Mutant(
        "attention_mask_offset",
        STEM,
        (("q_pos = torch.arange(seq - num_q, seq, device=q.device)", "q_pos = torch.arange(num_q, device=q.device)"),),
        must_fail=("gqa_attention_cached_prefix", "gqa_attention_random", "engine_tiny_llama"),
        hint="they are the last T positions",
        why="the queries are masked as if they were positions 0..T-1, not the last T of the sequence",
    ),
    Mutant(
        "attention_heads_modulo",
        STEM,
        (
            ("keys = k.float().repeat_interleave(group, dim=1)", "keys = k.float().repeat(1, group, 1)"),
            ("values = v.float().repeat_interleave(group, dim=1)", "values = v.float().repeat(1, group, 1)"),
        ),
        must_fail=("gqa_attention_prefill", "gqa_attention_random"),
        hint="pairing query head h with KV head h % KV",
        why="query head h reads KV head h % KV instead of h // (H // KV)",
    ),
    Mutant(
        "attention_in_bfloat16",
        STEM,
        _ALL_FLOAT32,
        must_fail=("gqa_attention_bfloat16", "gqa_attention_random"),
        hint="softmax in bfloat16",
        why="scores, softmax and the weighted sum in the input dtype",
    ),
    Mutant(
        "rotary_overwrites_its_input",
        STEM,
        (
            (
                "    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)\n",
                "    return x.copy_(torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1))\n",
            ),
        ),
        must_fail=("apply_rotary_fixed", "apply_rotary_random"),
        hint="apply_rotary changed its input x in place",
        why="the right rotation, written over the caller's x (the contract: no function changes its inputs)",
    ),
    Mutant(
        "swiglu_halves_swapped",
        STEM,
        (("    gate, up = x.chunk(2, dim=-1)\n", "    up, gate = x.chunk(2, dim=-1)\n"),),
        must_fail=("silu_and_mul",),
        hint="applying silu to the second half",
        why="silu applied to the up projection instead of the gate",
    ),
]

# one of each kind of hole a careful student finds in a grader (mutants.KINDS)
NOT_APPLICABLE = {
    "one_argument": "the five functions' contracts have no input checks: nothing in them raises or refuses an "
    "argument (S >= T and H % KV == 0 are the caller's promises, which the engine keeps)",
}
MUTANTS += [
    Mutant(
        "attention_mask_hides_the_own_key",
        STEM,
        (
            (
                'scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))',
                'scores.masked_fill(k_pos[None, None, :] >= q_pos[None, :, None], float("-inf"))',
            ),
        ),
        must_fail=("gqa_attention_cached_prefix", "gqa_attention_prefill", "gqa_attention_random"),
        hint="a mask that hides each query's own key",
        why="keys < S - T + t instead of <=: a query never sees its own position (a fresh prompt's first is NaN)",
        kind="boundary",
    ),
    Mutant(
        "rms_norm_one_mean_for_the_whole_tensor",
        STEM,
        (("h.pow(2).mean(dim=-1, keepdim=True) + eps)", "h.pow(2).mean() + eps)"),),
        must_fail=("rms_norm_fixed", "rms_norm_random"),
        hint="one mean of squares for the whole tensor instead of each row's",
        why="the mean of squares over every value (the aggregate) instead of each row's: rows of another "
        "magnitude than the rest come out scaled wrong",
        kind="each_part",
    ),
    Mutant(
        "attention_probs_cast_before_v",
        STEM,
        (
            (
                '    out = torch.einsum("hts,shd->thd", scores.softmax(dim=-1), values)\n',
                '    out = torch.einsum("hts,shd->thd", scores.softmax(dim=-1).to(q.dtype), values.to(q.dtype))\n',
            ),
        ),
        must_fail=("gqa_attention_bfloat16", "gqa_attention_random"),
        hint="casting the probabilities to bfloat16 before @ v",
        why="HF's eager order: the probabilities rounded to q.dtype before the weighted sum, not once at the end",
        kind="order",
    ),
    Mutant(
        "rms_norm_by_the_engine",
        STEM,
        (
            (
                "from minisgl.models.config import RopeScaling\n",
                "from minisgl.layers.norm import rms_norm as engine_rms_norm\nfrom minisgl.models.config import "
                "RopeScaling\n",
            ),
            (
                "    h = x.float()\n    h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)\n"
                "    return weight * h.to(x.dtype)\n",
                "    return engine_rms_norm(x, weight, eps)\n",
            ),
        ),
        must_fail=("rms_norm_fixed", "silu_and_mul", "gqa_attention_prefill"),
        hint="the engine's own",
        why="rms_norm delegates to the engine's: the lab scores 0",
        kind="engine_reference",
    ),
    Mutant(
        "silu_and_mul_by_the_cpu_kernel",
        STEM,
        (
            (
                "    gate, up = x.chunk(2, dim=-1)\n    return gate * torch.sigmoid(gate) * up\n",
                "    from minisgl.kernels.jit import cpu_module\n\n"
                "    out = torch.empty(*x.shape[:-1], x.shape[-1] // 2, dtype=x.dtype)\n"
                "    cpu_module().silu_and_mul(x.reshape(-1, x.shape[-1]).contiguous(), out.view(-1, out.shape[-1]))\n"
                "    return out\n",
            ),
        ),
        must_fail=("silu_and_mul", "rms_norm_fixed"),
        hint="the engine's own",
        why="silu_and_mul calls the engine's C++ kernel through its loader: the lab scores 0",
        kind="engine_reference",
    ),
    Mutant(
        "silu_and_mul_by_the_engines_chosen_kernels",
        STEM,
        (
            (
                "    gate, up = x.chunk(2, dim=-1)\n    return gate * torch.sigmoid(gate) * up\n",
                "    from minisgl.kernels import jit\n\n"
                "    out = torch.empty(*x.shape[:-1], x.shape[-1] // 2, dtype=x.dtype)\n"
                "    lib = jit.kernels().lib\n"
                "    lib.silu_and_mul(x.reshape(-1, x.shape[-1]).contiguous(), out.view(-1, out.shape[-1]))\n"
                "    return out\n",
            ),
        ),
        must_fail=("silu_and_mul", "rms_norm_fixed"),
        hint="the engine's own",
        why="silu_and_mul calls the C++ kernels the engine chose (jit.kernels()): the lab scores 0",
        kind="engine_reference",
    ),
    Mutant(
        "attention_ignores_scale",
        STEM,
        (("keys) * scale  # [H, T, S]", "keys) * q.shape[-1] ** -0.5  # [H, T, S]"),),
        must_fail=("gqa_attention_prefill", "gqa_attention_random"),
        hint="1 / sqrt(head_dim) instead of the scale argument",
        why="1/sqrt(head_dim) instead of the scale argument; once a hidden-only bug (every visible scale was that)",
        kind="visible_on_cpu",
    ),
    Mutant(
        "attention_naive_softmax",
        STEM,
        (("scores.softmax(dim=-1)", "(scores.exp() / scores.exp().sum(-1, keepdim=True))"),),
        must_fail=("gqa_attention_bfloat16", "gqa_attention_random"),
        hint="exp() without subtracting each row's maximum",
        why="exp() without subtracting the row max overflows on scores above ~88; once a hidden-only bug",
        kind="visible_on_cpu",
    ),
]

# correct, written the other ways a student may: it must keep every point
EQUIVALENT = Mutant(
    "lab01_written_differently",
    STEM,
    (
        (
            "    h = x.float()\n    h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)\n",
            "    h = x.to(torch.float32)\n    h = h / torch.sqrt((h * h).sum(-1, keepdim=True) / h.shape[-1] + eps)\n",
        ),
        (
            "    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim\n"
            "    inv_freq = 1.0 / (base**exponents)\n",
            "    inv_freq = torch.tensor([base ** (-2 * i / head_dim) for i in range(head_dim // 2)], "
            "dtype=torch.float32)\n",
        ),
        (
            "    x1, x2 = x.chunk(2, dim=-1)\n"
            "    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)\n",
            "    half = x.shape[-1] // 2\n"
            "    x1, x2, c, s = x[..., :half].float(), x[..., half:].float(), cos.float(), sin.float()\n"
            "    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)\n",
        ),
        (
            '    scores = torch.einsum("thd,shd->hts", q.float(), keys) * scale  # [H, T, S]\n',
            "    scores = (q.float().transpose(0, 1) @ keys.permute(1, 2, 0)) * scale  # [H, T, S]\n",
        ),
        (
            '    out = torch.einsum("hts,shd->thd", scores.softmax(dim=-1), values)\n',
            "    weights = (scores - scores.amax(-1, keepdim=True)).exp()\n"
            "    out = ((weights / weights.sum(-1, keepdim=True)) @ values.transpose(0, 1)).transpose(0, 1)\n",
        ),
        ("    return gate * torch.sigmoid(gate) * up\n", "    return torch.nn.functional.silu(gate) * up\n"),
    ),
    must_fail=(),
)
