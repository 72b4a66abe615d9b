"""Broken variants of solutions/lab04_paged_attention.py: one per pitfall its docstring names, one per
class of hole of ``mutants.KINDS``, a correct one written another way (``EQUIVALENT``), and the
variants only the hidden tests catch."""

from mutants import Mutant

STEM = "lab04_paged_attention"

NOT_APPLICABLE = {
    "one_argument": "the contract states no input checks: key_mask, paged_attention, prepare_metadata and forward "
    "take what the engine hands them and validate no argument (nothing is specified to raise)",
}

# every fixed unit test -> the randomized test, which must fail with it
RANDOMIZED = {
    "key_mask_prefill": "key_mask_random",
    "key_mask_decode": "key_mask_random",
    "metadata": "backend_random",
    "attention_float32": "backend_random",
    "backend_prefill[1]": "backend_random",
    "backend_prefill[16]": "backend_random",
    "backend_decode[1]": "backend_random",
    "backend_decode[16]": "backend_random",
}

MUTANTS = [
    Mutant(
        "stores_after_attending",
        STEM,
        (
            (
                "        self.pool.store(layer_id, batch.out_loc, k, v)\n"
                "        k_slots, v_slots = self.pool.k_slots(layer_id), self.pool.v_slots(layer_id)\n"
                "        return paged_attention(q, k_slots, v_slots, batch.attn_metadata, self.scale)\n",
                "        k_slots, v_slots = self.pool.k_slots(layer_id), self.pool.v_slots(layer_id)\n"
                "        out = paged_attention(q, k_slots, v_slots, batch.attn_metadata, self.scale)\n"
                "        self.pool.store(layer_id, batch.out_loc, k, v)\n"
                "        return out\n",
            ),
        ),
        must_fail=(
            "backend_prefill[1]",
            "backend_prefill[16]",
            "backend_decode[1]",
            "backend_random",
            "engine_greedy_tokens[1]",
        ),
        hint="attending before storing the new K/V",
        why="the order the contract states (store, then attend) swapped: the batch's own tokens read the stale K/V "
        "of their slots",
        kind="order",
    ),
    Mutant(
        "mask_without_prefix_offset",
        STEM,
        (
            (
                "    positions = token_positions(starts, ends)\n",
                "    positions = token_positions(0 * starts, ends - starts)\n",
            ),
        ),
        must_fail=("key_mask_prefill", "key_mask_random", "backend_prefill[1]", "backend_random"),
        hint="forgot the cached prefix",
        why="positions counted from the first new token: a chunk after a cached prefix sees too few keys",
    ),
    Mutant(
        "mask_excludes_itself",
        STEM,
        (("    return kpos[None, :] <= positions[:, None]\n", "    return kpos[None, :] < positions[:, None]\n"),),
        must_fail=("key_mask_prefill", "key_mask_random", "backend_prefill[1]", "backend_random"),
        hint="a token must see itself",
        why="< instead of <=: a token does not see its own key (a fresh prompt's first token sees nothing: NaN)",
    ),
    Mutant(
        "decode_sees_padding",
        STEM,
        (
            (
                "        return kpos[None, :] < ends[:, None]\n",
                "        return torch.ones(len(ends), max_len, dtype=torch.bool)\n",
            ),
        ),
        must_fail=("key_mask_decode", "key_mask_random", "backend_decode[1]", "backend_random"),
        hint="the padding keys are not masked",
        why="a decode row's softmax runs over the padding of shorter requests",
    ),
    Mutant(
        "decode_sees_only_new_token",
        STEM,
        (("        return kpos[None, :] < ends[:, None]\n", "        return kpos[None, :] == ends[:, None] - 1\n"),),
        must_fail=(
            "key_mask_decode",
            "key_mask_random",
            "backend_decode[1]",
            "backend_random",
            "engine_greedy_tokens[1]",
        ),
        hint="attends only the new token",
        why="decode attends its own new token only, not the cached sequence",
    ),
    Mutant(
        "positions_as_slots",
        STEM,
        (
            (
                "        kv_slots = self.page_table[rows, : int(ends.max())].to(torch.int64)\n",
                "        kv_slots = torch.arange(int(ends.max()), device=device).expand(len(rows), -1)\n",
            ),
        ),
        must_fail=("metadata", "backend_prefill[1]", "backend_random", "engine_greedy_tokens[1]"),
        hint="these are the key positions themselves",
        why="the key positions are used as slots: the page table is never read",
    ),
    Mutant(
        "metadata_reused",
        STEM,
        (
            (
                "        batch.attn_metadata = PagedMetadata(kv_slots, token_req, key_mask(starts, ends).to(device))\n",
                "        if getattr(self, '_metadata', None) is None:\n"
                "            self._metadata = PagedMetadata(kv_slots, token_req, key_mask(starts, ends).to(device))\n"
                "        batch.attn_metadata = self._metadata\n",
            ),
        ),
        must_fail=("metadata", "backend_decode[1]", "backend_random", "engine_greedy_tokens[1]"),
        hint="reused across batches",
        why="the metadata of the first batch is kept for every later one",
    ),
    Mutant(
        "gqa_modulo",
        STEM,
        (
            (
                "    kv_head = torch.arange(heads, device=q.device) // (heads // kv_heads)",
                "    kv_head = torch.arange(heads, device=q.device) % kv_heads",
            ),
        ),
        must_fail=("attention_float32", "backend_prefill[1]", "backend_random", "engine_greedy_tokens[1]"),
        hint="h % kv_heads",
        why="query head h reads KV head h % kv_heads instead of h // group",
    ),
    Mutant(
        "scale_one_over_d",
        STEM,
        (
            (
                'torch.einsum("nhd,nlhd->nhl", q.float(), keys) * scale',
                'torch.einsum("nhd,nlhd->nhl", q.float(), keys) / dim',
            ),
        ),
        must_fail=("attention_float32", "backend_prefill[1]", "backend_random", "engine_greedy_tokens[1]"),
        hint="a scale of 1/D",
        why="scores divided by D instead of sqrt(D)",
    ),
    Mutant(
        "softmax_in_bfloat16",
        STEM,
        (("    probs = scores.softmax(dim=-1)\n", "    probs = scores.to(q.dtype).softmax(dim=-1).float()\n"),),
        must_fail=("attention_bfloat16",),
        hint="rounded to bfloat16",
        why="the scores are rounded to bfloat16 before the softmax: results several units off",
    ),
    Mutant(
        "rows_by_batch_index",
        STEM,
        (
            (
                "        rows = torch.tensor([req.table_idx for req in batch.reqs], dtype=torch.int64, device=device)",
                "        rows = torch.arange(len(batch.reqs), device=device)",
            ),
        ),
        must_fail=("metadata", "backend_random", "engine_greedy_tokens[1]"),
        hint="table_idx",
        why="request i is assumed to sit on table row i (true only while the table hands rows out in order)",
    ),
]

MUTANTS += [
    Mutant(
        "decode_sees_its_end",
        STEM,
        (("        return kpos[None, :] < ends[:, None]\n", "        return kpos[None, :] <= ends[:, None]\n"),),
        must_fail=("key_mask_decode", "key_mask_random", "backend_decode[1]", "backend_random"),
        hint="`<=` where `<` belongs",
        why="<= for <: a decode row also sees key position ends[i], one past its request's end (padding or "
        "another position's stale slot)",
        kind="boundary",
    ),
    Mutant(
        "decode_shortcut_for_any_decode_row",
        STEM,
        (
            (
                "    if bool(((ends - starts) == 1).all()):",
                "    if bool(((ends - starts) == 1).any()):",
            ),
        ),
        must_fail=("key_mask_prefill", "key_mask_random", "backend_prefill[1]", "backend_random"),
        hint="holds only when every request extends one token",
        why="the decode shortcut (one query per request) taken when any request extends one token, not each: a "
        "decode row riding with prefills gives a mask with one row per request",
        kind="each_part",
    ),
    Mutant(
        "derives_from_torch_backend",
        STEM,
        (
            (
                "class PagedAttentionBackend(AttentionBackend):\n",
                "from minisgl.attention.torch_backend import TorchBackend  # noqa: E402\n\n\n"
                "class PagedAttentionBackend(TorchBackend):\n",
            ),
        ),
        must_fail=("metadata", "backend_prefill[1]", "backend_random", "key_mask_prefill"),
        hint="the engine's own",
        why="the lab's backend derives from the engine's TorchBackend (its own methods unchanged)",
        kind="engine_reference",
    ),
    Mutant(
        "decode_through_the_engine_kernel",
        STEM,
        (
            (
                "        return paged_attention(q, k_slots, v_slots, batch.attn_metadata, self.scale)\n",
                "        md = batch.attn_metadata\n"
                "        if len(md.token_req) == md.kv_slots.shape[0]:  # a decode batch: the engine's kernel\n"
                "            from minisgl.kernels.paged_attention import paged_decode_attention_torch\n\n"
                "            lens = torch.tensor(batch.ends, dtype=torch.int32)\n"
                "            out = paged_decode_attention_torch(q, k_slots, v_slots, md.kv_slots, lens, self.scale)\n"
                "            return out.reshape(len(lens), -1)\n"
                "        return paged_attention(q, k_slots, v_slots, md, self.scale)\n",
            ),
        ),
        must_fail=("backend_decode[1]", "backend_random", "key_mask_prefill", "attention_float32"),
        hint="your code calls the engine's own",
        why="decode batches go through the engine's paged decode attention instead of the lab's own",
        kind="engine_reference",
    ),
    Mutant(
        "q_scaled_in_bfloat16_visibly",
        STEM,
        (
            (
                '    scores = torch.einsum("nhd,nlhd->nhl", q.float(), keys) * scale\n',
                '    scores = torch.einsum("nhd,nlhd->nhl", (q * scale).float(), keys)\n',
            ),
        ),
        must_fail=("attention_bfloat16",),
        hint="q * scale computed in bfloat16",
        why="q is scaled in bfloat16 before the float32 product: exact while the scale is a power of two; the "
        "visible bfloat16 test now runs head_dim 32 too (once only the hidden head_dim 128 test caught it)",
        kind="visible_on_cpu",
    ),
]

# correct, written the other way a student may (a loop over requests, SDPA with GQA): every point
EQUIVALENT = Mutant(
    "lab04_written_differently",
    STEM,
    (
        (
            "    n, heads, dim = q.shape\n"
            "    kv_heads = k_slots.shape[1]\n"
            "    slots = md.kv_slots[md.token_req]  # [N, L]: the slots of the keys each token may see\n",
            "    import torch.nn.functional as F\n\n"
            "    n, heads, dim = q.shape\n"
            "    out = q.new_empty(n, heads, dim)\n"
            "    for i in range(md.kv_slots.shape[0]):\n"
            "        rows = (md.token_req == i).nonzero().flatten()\n"
            "        if len(rows) == 0:\n"
            "            continue\n"
            "        keys, values = k_slots[md.kv_slots[i]].float(), v_slots[md.kv_slots[i]].float()  # [L, Hkv, D]\n"
            "        o = F.scaled_dot_product_attention(\n"
            "            q[rows].float().transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),\n"
            "            attn_mask=md.mask[rows], scale=scale, enable_gqa=True,\n"
            "        )\n"
            "        out[rows] = o.transpose(0, 1).to(q.dtype)\n"
            "    return out.reshape(n, heads * dim)\n"
            "    kv_heads = k_slots.shape[1]\n"
            "    slots = md.kv_slots[md.token_req]  # [N, L]: the slots of the keys each token may see\n",
        ),
    ),
    must_fail=(),
)

HIDDEN_MUTANTS = [
    Mutant(
        "scale_from_head_dim",
        STEM,
        (
            (
                "        return paged_attention(q, k_slots, v_slots, batch.attn_metadata, self.scale)\n",
                "        return paged_attention(q, k_slots, v_slots, batch.attn_metadata, q.shape[-1] ** -0.5)\n",
            ),
        ),
        must_fail=("backend_uses_its_scale",),
        why="1/sqrt(head_dim) instead of self.scale (the same value in every visible test)",
    ),
    Mutant(
        "naive_softmax",
        STEM,
        (
            (
                "    probs = scores.softmax(dim=-1)\n",
                "    probs = scores.exp() / scores.exp().sum(-1, keepdim=True)\n",
            ),
        ),
        must_fail=("attention_large_scores",),
        why="exp() without subtracting the row max overflows on scores above ~88",
    ),
    Mutant(
        "q_scaled_in_input_dtype",
        STEM,
        (
            (
                '    scores = torch.einsum("nhd,nlhd->nhl", q.float(), keys) * scale\n',
                '    scores = torch.einsum("nhd,nlhd->nhl", (q * scale).float(), keys)\n',
            ),
        ),
        must_fail=("bfloat16_head_dim_128_long_contexts",),
        why="q is scaled in bfloat16 before the float32 product: exact while the scale is a power of two (head_dim "
        "16 or 64, every visible test), off by several units at head_dim 128",
    ),
]
