"""Broken variants of solutions/lab09_cuda_graphs.py: one per pitfall its docstring names (sizes, bucket,
padding, capture order and pool, the eager fallback, the replay's output), one of each kind of
``mutants.KINDS`` that can occur here, a correct one written another way (``EQUIVALENT``), and two that the
hidden tests catch (``HIDDEN_MUTANTS``: stopping at the first candidate over the budget, which skipping
agrees with while costs grow with the batch; and no ``ValueError`` for a batch larger than every graph, which
the engine never sends). The visible tests now catch both too: ``sizes_under_budget`` and ``sizes_random``
draw costs that do not grow with the batch, ``bucket_refuses_a_batch_past_the_largest`` asks one past the
largest, and ``use_graph`` asks from an empty batch (n = 0) on."""

from mutants import Mutant

STEM = "lab09_cuda_graphs"

# every fixed test -> the randomized test, which must fail with it
RANDOMIZED = {
    "candidates": "sizes_random",
    "sizes_without_budget": "sizes_random",
    "sizes_under_budget": "sizes_random",
    "bucket_every_batch_size": "bucket_random",
    "bucket_refuses_a_batch_past_the_largest": "bucket_random",
    "pad_fills_rows": "padding_random",
    "padding_never_touches_real_kv": "padding_random",
}

_BUCKET = "        return sizes[bisect.bisect_left(sizes, n)]\n"
_LOOP = "        for bs in self.candidates(max_bs)[:-1]:\n"
_OUT = "        static.out_loc[n:bs].fill_(scratch_slot)\n"
_ROWS = "        static.table_idx[n:bs].fill_(dummy_row)\n"
_COPY = "        for buffer, rows in zip(static, batch):\n            buffer[:n].copy_(rows[:n])\n"
_IMPORT = "from minisgl.engine.graph import CaptureFn, GraphInputs, GraphPlan, GraphState\n"
_TAKEN = "        taken, spent = [max_bs], cost(max_bs)\n"
_ERROR = "        if n > sizes[-1]:\n"
_CAPTURE_ORDER = "        for bs in sorted(state.sizes, reverse=True):\n"
_POOL = "            if pool is None:\n                pool = graph.pool()\n"
_PHASE = '        if phase != "decode" or not sizes:\n'
_HOLDS = "        return 1 <= n <= sizes[-1]\n"
_SLICE = "        return state.outputs[bs][:n]\n"
_RAISE = _ERROR + '            raise ValueError(f"no graph holds a batch of {n}: the largest is {sizes[-1]}")\n'

NOT_APPLICABLE: dict[str, str] = {}

MUTANTS = [
    Mutant(
        "bucket_refuses_the_largest",
        STEM,
        ((_ERROR, "        if n >= sizes[-1]:\n"),),
        must_fail=("bucket_every_batch_size", "bucket_random"),
        hint="not n >= sizes[-1]",
        why="n >= sizes[-1] for n > sizes[-1]: a batch of exactly the largest size finds no graph",
        kind="boundary",
    ),
    Mutant(
        "sizes_budget_strict",
        STEM,
        (("            if spent + cost(bs) <= budget:\n", "            if spent + cost(bs) < budget:\n"),),
        must_fail=("sizes_under_budget", "sizes_random"),
        hint="not < budget",
        why="< budget for <= budget: a candidate that fills the budget exactly is dropped",
        kind="boundary",
    ),
    Mutant(
        "pad_forgets_positions",
        STEM,
        (
            (
                _COPY,
                "        static.input_ids[:n].copy_(batch.input_ids)\n"
                "        static.out_loc[:n].copy_(batch.out_loc)\n"
                "        static.table_idx[:n].copy_(batch.table_idx)\n",
            ),
        ),
        must_fail=("pad_fills_rows", "padding_never_touches_real_kv", "padding_random"),
        hint="each of the four buffers",
        why="three of the four buffers written: the rows keep an earlier batch's positions (wrong RoPE, wrong "
        "attention length)",
        kind="each_part",
    ),
    Mutant(
        "max_bs_taken_last",
        STEM,
        ((_TAKEN + _LOOP, "        taken, spent = [], 0\n        for bs in self.candidates(max_bs):\n"),),
        must_fail=("sizes_under_budget", "sizes_random"),
        hint="it is taken first",
        why="the candidates from the smallest up with max_bs last, not first: the small graphs spend the budget "
        "and the largest batches find no graph",
        kind="order",
    ),
    Mutant(
        "alias_of_the_engine",
        STEM,
        (
            (_IMPORT, "from minisgl.engine.graph import BucketPlan, CaptureFn, GraphInputs, GraphPlan, GraphState\n"),
            (_SLICE, _SLICE + "\n\nPaddedPlan = BucketPlan  # noqa: F811\n"),
        ),
        must_fail=("candidates", "sizes_random"),
        hint="the engine's own",
        why="the lab's name bound to the engine's BucketPlan",
        kind="engine_reference",
    ),
    Mutant(
        "bucket_lookup_fails_past_the_largest",
        STEM,
        ((_RAISE, ""),),
        must_fail=("bucket_refuses_a_batch_past_the_largest", "bucket_random"),
        hint="expected ValueError",
        why="no ValueError for a batch larger than every graph (an IndexError): once only a hidden test asked",
        kind="visible_on_cpu",
    ),
    Mutant(
        "bucket_bisect_right",
        STEM,
        ((_BUCKET, "        return sizes[min(bisect.bisect_right(sizes, n), len(sizes) - 1)]\n"),),
        must_fail=("bucket_every_batch_size", "bucket_random", "engine_runs_your_plan"),
        hint="bisect_left, not bisect_right",
        why="a batch whose size is captured runs in the next larger graph: padding waste",
    ),
    Mutant(
        "bucket_too_small",
        STEM,
        ((_BUCKET, "        return sizes[max(bisect.bisect_right(sizes, n) - 1, 0)]\n"),),
        must_fail=("bucket_every_batch_size", "bucket_random", "engine_runs_your_plan"),
        hint="bucket too small",
        why="the largest captured size <= n: the graph has fewer rows than the batch",
    ),
    Mutant(
        "bucket_largest",
        STEM,
        ((_BUCKET, "        return sizes[-1]\n"),),
        must_fail=("bucket_every_batch_size", "bucket_random", "engine_runs_your_plan"),
        hint="the largest graph, not the smallest",
        why="every batch runs in the largest graph: mostly padding",
    ),
    Mutant(
        "candidates_max_twice",
        STEM,
        (("list(range(self.STEP, max_bs, self.STEP))", "list(range(self.STEP, max_bs + 1, self.STEP))"),),
        must_fail=("candidates", "sizes_without_budget", "sizes_random"),
        hint="came twice",
        why="a max_bs that is a multiple of 16 is listed twice (and captured twice)",
    ),
    Mutant(
        "sizes_over_budget",
        STEM,
        (("        taken, spent = [max_bs], cost(max_bs)\n", "        taken, spent = [max_bs], 0\n"),),
        must_fail=("sizes_under_budget", "sizes_random"),
        hint="sizes over the budget",
        why="max_bs's own cost is not counted: the chosen graphs need more memory than the budget",
    ),
    Mutant(
        "sizes_max_bs_missing",
        STEM,
        (("        taken, spent = [max_bs], cost(max_bs)\n", "        taken, spent = [], cost(max_bs)\n"),),
        must_fail=("sizes_without_budget", "sizes_under_budget", "sizes_random", "engine_runs_your_plan"),
        hint="max_bs = 1 is missing",
        why="the largest batches find no graph",
    ),
    Mutant(
        "sizes_unsorted",
        STEM,
        (("        return sorted(taken)\n", "        return taken\n"),),
        must_fail=("sizes_without_budget", "sizes_random", "engine_runs_your_plan"),
        hint="out of order",
        why="max_bs first, then the rest: bucket() bisects a list that is not sorted",
    ),
    Mutant(
        "sizes_largest_first",
        STEM,
        ((_LOOP, "        for bs in reversed(self.candidates(max_bs)[:-1]):\n"),),
        must_fail=("sizes_under_budget", "sizes_random"),
        hint="large sizes were preferred",
        why="under a budget the large graphs are kept and the small ones, where launches matter most, dropped",
    ),
    Mutant(
        "pad_out_loc_stale",
        STEM,
        ((_OUT, ""),),
        must_fail=("pad_fills_rows", "padding_never_touches_real_kv", "padding_random"),
        hint="padding out_loc left at stale values",
        why="padding rows write their K/V into the slots an earlier batch's requests hold",
    ),
    Mutant(
        "pad_into_slot_zero",
        STEM,
        ((_OUT, "        static.out_loc[n:bs].fill_(0)\n"),),
        must_fail=("pad_fills_rows", "padding_never_touches_real_kv", "padding_random"),
        hint="padding into slot 0",
        why="padding rows overwrite the KV in slot 0, a real request's",
    ),
    Mutant(
        "pad_real_table_row",
        STEM,
        ((_ROWS, ""),),
        must_fail=("pad_fills_rows", "padding_never_touches_real_kv", "padding_random"),
        hint="padding rows given a real table row",
        why="padding rows keep an earlier batch's table rows: they read real requests' KV",
    ),
    Mutant(
        "pad_off_by_one",
        STEM,
        (
            (_OUT, "        static.out_loc[n + 1 : bs].fill_(scratch_slot)\n"),
            (_ROWS, "        static.table_idx[n + 1 : bs].fill_(dummy_row)\n"),
        ),
        must_fail=("pad_fills_rows", "padding_never_touches_real_kv", "padding_random"),
        hint="off by one in the pad range",
        why="the first padding row keeps an earlier batch's slot and row",
    ),
    Mutant(
        "pad_new_tensors",
        STEM,
        (
            (
                "            buffer[:n].copy_(rows[:n])\n",
                "            buffer = torch.cat([rows[:n], buffer[n:]])  # noqa: F841\n",
            ),
        ),
        must_fail=("pad_fills_rows", "padding_never_touches_real_kv", "padding_random"),
        hint="the static buffers were not written",
        why="new tensors bound to a local name: the graph reads the old buffers, which still hold the last batch",
    ),
    Mutant(
        "capture_smallest_first",
        STEM,
        ((_CAPTURE_ORDER, "        for bs in sorted(state.sizes):\n"),),
        must_fail=("capture",),
        hint="captured smallest first",
        why="graphs captured smallest first in one pool: every larger one adds its own blocks",
        kind="order",
    ),
    Mutant(
        "capture_a_pool_each",
        STEM,
        ((_POOL, ""),),
        must_fail=("capture",),
        hint="a pool of its own",
        why="pool=None at every capture: a memory pool per graph, their costs add up",
    ),
    Mutant(
        "use_graph_for_prefill",
        STEM,
        ((_PHASE, "        if not sizes:\n"),),
        must_fail=("use_graph", "engine_runs_your_plan"),
        hint="a prefill or mixed batch sent to a graph",
        why="only n and sizes checked, not the phase: a prefill batch replays a decode graph",
        kind="one_argument",
    ),
    Mutant(
        "use_graph_refuses_the_largest",
        STEM,
        ((_HOLDS, "        return 1 <= n < sizes[-1]\n"),),
        must_fail=("use_graph", "engine_runs_your_plan"),
        hint="sent to eager mode",
        why="n < sizes[-1] for n <= sizes[-1]: a batch of exactly the largest size runs eagerly",
        kind="boundary",
    ),
    Mutant(
        "use_graph_for_an_empty_batch",
        STEM,
        ((_HOLDS, "        return n <= sizes[-1]\n"),),
        must_fail=("use_graph",),
        hint="an empty batch (n = 0) sent to a graph",
        why="no lower bound on n: a decode batch of no requests is sent to a graph (once asked only from n = 1)",
        kind="boundary",
    ),
    Mutant(
        "sizes_stop_at_first_misfit",
        STEM,
        (
            (
                "                spent = spent + cost(bs)\n",
                "                spent = spent + cost(bs)\n            else:\n                break\n",
            ),
        ),
        must_fail=("sizes_under_budget", "sizes_random"),
        hint="stopped at the first candidate that does not fit",
        why="stops at the first candidate over the budget: a later, cheaper one is never taken (once only a hidden "
        "test drew costs that do not grow with the batch)",
        kind="visible_on_cpu",
    ),
    Mutant(
        "replay_returns_the_padding",
        STEM,
        ((_SLICE, "        return state.outputs[bs]\n"),),
        must_fail=("replay",),
        hint="the whole output returned",
        why="bs rows of logits for a batch of n: the padding rows' logits reach the sampler",
    ),
]

# correct, written another way: it must keep every point
EQUIVALENT = Mutant(
    "lab09_written_differently",
    STEM,
    (
        (
            "        small = [bs for bs in self.SMALL if bs < max_bs]\n"
            "        return small + list(range(self.STEP, max_bs, self.STEP)) + [max_bs]\n",
            "        out = sorted({*(s for s in self.SMALL if s < max_bs), *range(self.STEP, max_bs, self.STEP)})\n"
            "        out.append(max_bs)\n"
            "        return out\n",
        ),
        (
            "        taken, spent = [max_bs], cost(max_bs)\n"
            "        for bs in self.candidates(max_bs)[:-1]:\n"
            "            if spent + cost(bs) <= budget:\n"
            "                taken.append(bs)\n"
            "                spent = spent + cost(bs)\n"
            "        return sorted(taken)\n",
            "        left = budget - cost(max_bs)\n"
            "        keep = set()\n"
            "        for bs in self.candidates(max_bs)[:-1]:\n"
            "            if cost(bs) <= left:\n"
            "                keep.add(bs)\n"
            "                left -= cost(bs)\n"
            "        return sorted(keep) + [max_bs]\n",
        ),
        (_BUCKET, "        return next(s for s in sizes if s >= n)\n"),
        (
            "        for buffer, rows in zip(static, batch):\n            buffer[:n].copy_(rows[:n])\n",
            "        static.input_ids[:n] = batch.input_ids\n"
            "        static.positions[:n] = batch.positions\n"
            "        static.out_loc[:n] = batch.out_loc\n"
            "        static.table_idx[:n] = batch.table_idx[:n]\n",
        ),
        (_OUT, "        static.out_loc[n:bs] = scratch_slot\n"),
        (_CAPTURE_ORDER, "        for bs in reversed(state.sizes):\n"),
        (_POOL, "            pool = pool or graph.pool()\n"),
        (
            _PHASE + "            return False\n" + _HOLDS,
            '        return phase == "decode" and len(sizes) > 0 and 0 < n <= max(sizes)\n',
        ),
        (_SLICE, "        return state.outputs[bs].narrow(0, 0, n)\n"),
    ),
    must_fail=(),
)

HIDDEN_MUTANTS = [
    Mutant(
        "sizes_stop_at_first_misfit",
        STEM,
        (
            (
                "                spent = spent + cost(bs)\n",
                "                spent = spent + cost(bs)\n            else:\n                break\n",
            ),
        ),
        must_fail=("sizes_skip_what_does_not_fit",),
        why="stops at the first candidate over the budget: a later, cheaper one is never taken",
    ),
    Mutant(
        "bucket_without_error",
        STEM,
        ((_RAISE, ""),),
        must_fail=("bucket_refuses_a_batch_larger_than_every_graph",),
        why="a batch larger than every graph raises IndexError (or runs in a graph too small), not ValueError",
    ),
]
