"""Broken variants of solutions/lab15_verifier.py: one per pitfall its docstring names, one of each kind of
hole (``mutants.KINDS``), a correct one written another way (``EQUIVALENT``: the leading run found as the
first False's index, and the residual drawn by masking instead of scattering), and two that only the hidden
tests catch (``HIDDEN_MUTANTS``)."""

from mutants import Mutant

STEM = "lab15_verifier"

NOT_APPLICABLE: dict[str, str] = {}

_GREEDY_CASES = (
    "no_drafts",
    "all_accepted_bonus",
    "first_rejected",
    "later_match_after_rejection",
    "padding_where_target_likes_token_0",
    "last_rejected",
)
# every fixed greedy test whose bugs the random greedy batches also meet
RANDOMIZED = {
    "greedy_verdict": "greedy_random",
    **{f"greedy_verdict[{case}]": "greedy_random" for case in _GREEDY_CASES},
    "greedy_rows_independent": "greedy_random",
    "leading_accepted": "greedy_random",
}

_KEPT = "        kept = torch.arange(k, device=drafts.device)[None, :] < accepted[:, None]\n"
_ROLLBACK = "        return Rollback(n + accepted, n + accepted + 1)\n"
_STEPS = "        steps=(info.steps[:, None] + offsets[None, :]).reshape(-1),\n"
_IS_GREEDY = "            is_greedy = (info.temperatures == 0)[:, None]\n"

MUTANTS = [
    Mutant(
        "accept_test_in_float32",
        STEM,
        (
            (
                "            lucky = uniform(seeds ^ ACCEPT_SALT, steps) < p_x.double()\n",
                "            lucky = uniform(seeds ^ ACCEPT_SALT, steps).float() < p_x\n",
            ),
        ),
        must_fail=("sampled_accept_test",),
        hint="the accept test compares in float64",
        why="the uniform rounded to float32 before the comparison: where p(x) is that rounding, a draft the "
        "engine accepts is rejected (once a precision the contract stated and no test pinned)",
    ),
    Mutant(
        "residual_target_in_float64",
        STEM,
        (
            (
                "    target = u.to(cdf.dtype)[:, None] * cdf[:, -1:]\n    return torch.searchsorted(cdf, target)",
                "    target = u[:, None] * cdf[:, -1:].double()\n    return torch.searchsorted(cdf.double(), target)",
            ),
        ),
        must_fail=("draw_without",),
        hint="u is cast to float32",
        why="u scaled in float64: where float32 rounds u * total onto a CDF value, the draw is the next token",
    ),
    Mutant(
        "rejected_draft_emitted",
        STEM,
        ((_KEPT, _KEPT.replace("< accepted", "<= accepted")),),
        must_fail=("greedy_verdict[first_rejected]", "greedy_verdict[last_rejected]", "greedy_random"),
        hint="the rejected draft itself output",
        why="off by one in the accepted prefix: the rejected draft is output where the target's token goes",
    ),
    Mutant(
        "bonus_from_the_previous_position",
        STEM,
        (
            (
                "        tokens = plain.clone()  # the bonus, and a greedy row's correction, is the plain draw\n",
                "        tokens = torch.cat([plain[:, :k], plain[:, k - 1 : k]], dim=1)\n",
            ),
        ),
        must_fail=("greedy_verdict[all_accepted_bonus]", "greedy_random", "engine_greedy_tokens"),
        hint="the bonus token",
        why="the bonus after every accepted draft is taken from the last draft's position, not from row k",
    ),
    Mutant(
        "counts_every_pass",
        STEM,
        (("    return torch.cumprod(accept.long(), dim=1).sum(dim=1)\n", "    return accept.long().sum(dim=1)\n"),),
        must_fail=("leading_accepted", "greedy_verdict[later_match_after_rejection]", "greedy_random"),
        hint="only the leading run counts",
        why="drafts that pass after a rejection are counted (accept.sum())",
    ),
    Mutant(
        "padding_clamped_and_accepted",
        STEM,
        (
            ("        passes = drafts == plain[:, :k]\n", "        passes = x == plain[:, :k]\n"),
            ("        accepted = leading_accepted(real & passes)\n", "        accepted = leading_accepted(passes)\n"),
        ),
        must_fail=("greedy_verdict[padding_where_target_likes_token_0]", "greedy_random"),
        hint="padding (-1) accepted",
        why="-1 clamped to token 0 and judged like a draft: it passes where the target likes token 0",
    ),
    Mutant(
        "residual_keeps_the_draft",
        STEM,
        (("    residual = probs.scatter(1, x[:, None], 0.0)\n", "    residual = probs\n"),),
        must_fail=("draw_without", "sampled_residual", "engine_sampled_tokens"),
        hint="without removing the draft",
        why="after a rejection the token is drawn from p itself: x comes out more often than p(x)",
    ),
    Mutant(
        "residual_not_renormalised",
        STEM,
        (
            (
                "    target = u.to(cdf.dtype)[:, None] * cdf[:, -1:]\n",
                "    target = u.to(cdf.dtype)[:, None]\n",
            ),
        ),
        must_fail=("draw_without", "sampled_residual"),
        hint="u not scaled by the residual's total",
        why="u compared with the residual's CDF as if it summed to 1: the last tokens are drawn too often",
    ),
    Mutant(
        "accept_on_the_plain_stream",
        STEM,
        (
            (
                "            lucky = uniform(seeds ^ ACCEPT_SALT, steps) < p_x.double()\n",
                "            lucky = uniform(seeds, steps) < p_x.double()\n",
            ),
        ),
        must_fail=("sampled_accept_test", "engine_sampled_tokens"),
        hint="the salted stream",
        why="the accept test and the residual draw share one uniform: a rejection (u >= p(x)) biases the draw",
    ),
    Mutant(
        "every_position_the_same_step",
        STEM,
        ((_STEPS, "        steps=info.steps.repeat_interleave(k1),\n"),),
        must_fail=("per_position", "sampled_accept_test", "engine_sampled_tokens"),
        hint="steps[r] + j",
        why="every position of a row draws with the row's own step: the same uniform at every position",
    ),
    Mutant(
        "residual_at_the_bonus",
        STEM,
        (
            (
                "            tokens[:, :k] = torch.where(is_greedy | ~real, plain[:, :k], fixed)\n",
                "            tokens[:, :k] = torch.where(is_greedy, plain[:, :k], fixed)\n",
            ),
        ),
        must_fail=("sampled_accept_test",),
        hint="a residual drawn where a padded row has no draft left",
        why="a padded row whose drafts all pass gets a residual (without token 0) instead of the plain bonus draw",
    ),
    Mutant(
        "not_rolled_back",
        STEM,
        ((_ROLLBACK, "        return Rollback(n + drafted, n + drafted + 1)\n"),),
        must_fail=("rollback_values", "engine_greedy_tokens"),
        hint="not rolled back",
        why="the counters stay where the verify pass left them: rejected drafts count as the request's tokens",
    ),
    Mutant(
        "correction_counted_as_cached",
        STEM,
        ((_ROLLBACK, "        return Rollback(n + accepted + 1, n + accepted + 1)\n"),),
        must_fail=("rollback_values", "engine_greedy_tokens"),
        hint="the correction counted as cached",
        why="cached_len includes the correction, whose KV the pass never computed (it saw the rejected draft)",
    ),
    # ---- the kinds of hole (mutants.KINDS) --------------------------------------------------------------
    Mutant(
        "every_draft_accepted_refused",
        STEM,
        (("        if accepted > drafted:\n", "        if accepted >= drafted:\n"),),
        must_fail=("rollback_input_checks", "rollback_values"),
        hint="accepted == drafted (every draft accepted) is a valid step",
        why="the check refuses accepted == drafted, the step where every draft passed",
        kind="boundary",
    ),
    Mutant(
        "draw_past_an_exact_boundary",
        STEM,
        (
            (
                "    return torch.searchsorted(cdf, target).squeeze(1)",
                "    return torch.searchsorted(cdf, target, right=True).squeeze(1)",
            ),
        ),
        must_fail=("draw_without",),
        hint=">=, not >",
        why="the first i with cdf[i] > u * total: a u * total exactly on a CDF value draws the next token",
        kind="boundary",
    ),
    Mutant(
        "n_unchecked",
        STEM,
        (
            (
                "        if n < 1:\n"
                '            raise ValueError(f"n = {n}: a request has at least one token before a step")\n',
                "",
            ),
        ),
        must_fail=("rollback_input_checks",),
        hint="n = 0",
        why="the rollback checks accepted against drafted only; n = 0 (a request with no token) passes",
        kind="one_argument",
    ),
    Mutant(
        "greedy_by_the_batch",
        STEM,
        (
            (
                _IS_GREEDY,
                "            is_greedy = torch.full_like((info.temperatures == 0)[:, None], info.all_greedy)\n",
            ),
        ),
        must_fail=("mixed_batch",),
        hint="each row's own temperature",
        why="in a batch that is not all greedy, greedy rows get the sampled accept test (the aggregate, not each row)",
        kind="each_part",
    ),
    Mutant(
        "rows_position_major",
        STEM,
        (
            (
                "        temperatures=info.temperatures.repeat_interleave(k1),\n",
                "        temperatures=info.temperatures.repeat(k1),\n",
            ),
            ("        top_k=info.top_k.repeat_interleave(k1),\n", "        top_k=info.top_k.repeat(k1),\n"),
            ("        top_p=info.top_p.repeat_interleave(k1),\n", "        top_p=info.top_p.repeat(k1),\n"),
            ("        seeds=info.seeds.repeat_interleave(k1),\n", "        seeds=info.seeds.repeat(k1),\n"),
            (_STEPS, "        steps=(info.steps[None, :] + offsets[:, None]).reshape(-1),\n"),
        ),
        must_fail=("per_position", "mixed_batch", "engine_sampled_tokens"),
        hint="repeat_interleave",
        why="rows laid out position-major (repeat): row r * k1 + j gets another row's parameters",
        kind="order",
    ),
    Mutant(
        "verifier_derives_from_the_engine",
        STEM,
        (
            (
                "from minisgl.speculative.base import Rollback, Verdict, Verifier\n",
                "from minisgl.speculative.base import Rollback, Verdict, Verifier\n"
                "from minisgl.speculative.verify import DefaultVerifier\n",
            ),
            ("class LabVerifier(Verifier):\n", "class LabVerifier(DefaultVerifier):\n"),
        ),
        must_fail=("greedy_verdict[no_drafts]", "rollback_values"),
        hint="the engine's own",
        why="the verifier is the engine's DefaultVerifier under the lab's name",
        kind="engine_reference",
    ),
    Mutant(
        "leading_calls_the_engine",
        STEM,
        (
            (
                "    return torch.cumprod(accept.long(), dim=1).sum(dim=1)\n",
                "    from minisgl.speculative.verify import leading\n\n    return leading(accept)\n",
            ),
        ),
        must_fail=("leading_accepted", "greedy_random"),
        hint="the engine's own",
        why="leading_accepted delegates to the engine's leading",
        kind="engine_reference",
    ),
    Mutant(
        "top_p_position_major_visibly",
        STEM,
        (("        top_p=info.top_p.repeat_interleave(k1),\n", "        top_p=info.top_p.repeat(k1),\n"),),
        must_fail=("per_position",),
        hint="repeat_interleave",
        why="once a hidden-test-only bug (only the hidden sampled batches mixed top-p values): per_position's "
        "fixed case gives each row its own top_p now",
        kind="visible_on_cpu",
    ),
]

HIDDEN_MUTANTS = [
    Mutant(
        "salt_added",
        STEM,
        (("uniform(seeds ^ ACCEPT_SALT, steps)", "uniform(seeds + ACCEPT_SALT, steps)"),),
        must_fail=("top_p_and_large_seeds",),
        why="seed + ACCEPT_SALT equals seed ^ ACCEPT_SALT until bit 62 of the seed is set (visible seeds < 2^41)",
    ),
    Mutant(
        "residual_divided_by_its_total",
        STEM,
        (
            (
                "    cdf = residual.cumsum(dim=1)\n    target = u.to(cdf.dtype)[:, None] * cdf[:, -1:]\n",
                "    cdf = (residual / residual.sum(dim=1, keepdim=True)).cumsum(dim=1)\n"
                "    target = u.to(cdf.dtype)[:, None]\n",
            ),
        ),
        must_fail=("draw_without_all_the_mass",),
        why="renormalised by dividing: a row where x holds all the mass is 0 / 0 = NaN (the visible rows' sums are "
        "exact, so the division changes nothing there)",
    ),
]

EQUIVALENT = Mutant(
    "equivalent",
    STEM,
    (
        (
            "    return torch.cumprod(accept.long(), dim=1).sum(dim=1)\n",
            "    rejected = torch.cat([~accept, torch.ones(accept.shape[0], 1, dtype=torch.bool)], dim=1)\n"
            "    return rejected.long().argmax(dim=1)\n",
        ),
        (
            "    residual = probs.scatter(1, x[:, None], 0.0)\n",
            "    drop = torch.arange(probs.shape[1], device=probs.device)[None, :] == x[:, None]\n"
            "    residual = probs.masked_fill(drop, 0.0)\n",
        ),
    ),
    must_fail=(),
    why="the leading run as the index of the first rejection (argmax of a padded ~accept), the draft masked out",
)
