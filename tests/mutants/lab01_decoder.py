"""Broken variants of solutions/lab01_decoder.py."""

from mutants import Mutant

MUTANTS = [
    Mutant(
        "rms_norm_without_eps",
        "lab01_decoder",
        (("h.pow(2).mean(dim=-1, keepdim=True) + eps)", "h.pow(2).mean(dim=-1, keepdim=True))"),),
        must_fail=("rms_norm_fixed",),
        why="eps dropped: rows of tiny values are scaled up to unit norm",
    ),
    Mutant(
        "rope_fixed_base",
        "lab01_decoder",
        (("inv_freq = 1.0 / (base**exponents)", "inv_freq = 1.0 / (10000.0**exponents)"),),
        must_fail=("rope_inv_freq_default", "rope_inv_freq_random", "engine_tiny_qwen3"),
        why="the frequency base is hard-coded to Llama-2's 10000 instead of the model's rope_theta",
    ),
    Mutant(
        "attention_not_causal",
        "lab01_decoder",
        (
            (
                'scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))',
                "scores = scores  # no mask",
            ),
        ),
        must_fail=("gqa_attention_prefill", "gqa_attention_cached_prefix", "engine_tiny_llama"),
        why="every query sees the whole sequence, future tokens included",
    ),
]
