"""Lab 10 (tensor-parallel layers): each layer at ``tp=1`` against a plain matmul / lookup (in this
process); what each rank of tp=2, 3 and 4 builds and loads, played one rank after another in this process
(a layer reads only ``get_tp_info()`` to build and load, so no process is needed); then on 2 ranks over
gloo, where every rank must give the single-rank result, then the real engine at ``tp_size=2`` built from
your layers. Run: ``python -m autograder lab10``.

The 2-rank checks run in one spawn of 2 processes (``autograder/tp_ranks.py``: the first test that
needs them pays a few seconds, the others read its verdicts); a rank that hangs or dies fails only
the check it was in. Each test first builds its layer at ``tp=1`` here, so an unfinished layer fails
at once, before any process is started.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from autograder import impl, tp_ranks
from autograder.adapters import lab10 as lab
from autograder.checks import Pitfall, check_tensor, first_token_difference
from autograder.engine_runs import engine_failure
from autograder.points import engine, points
from minisgl.distributed import TPInfo, get_tp_info, set_tp_info

TOL = dict(atol=1e-5, rtol=1e-5)


def single_rank(name: str) -> None:
    """Layer ``name`` of the lab at tp=1 (no process group: the collectives are identities) against
    the math it must do: a stub fails here, before anything is spawned."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 8, generator=g)
    what = f"{name} at tp=1"
    if name == "MergedColumnParallelLinear":
        a, b = torch.randn(6, 8, generator=g), torch.randn(4, 8, generator=g)
        layer = lab.layer(name)(8, [6, 4])
        layer.weight.weight_loader(layer.weight, a, 0)
        layer.weight.weight_loader(layer.weight, b, 1)
        got = layer(x)
        offset0 = Pitfall(
            "every shard written at offset 0 of the local weight (up overwrote gate)",
            "shard i goes to rows offsets[i] : offsets[i] + local_sizes[i]",
            lambda: torch.cat([x @ b.T, got[:, 4:]], -1),
        )
        check_tensor(got, x @ torch.cat([a, b]).T, what, **TOL, hint="gate's rows, then up's", pitfalls=[offset0])
    elif name == "QKVParallelLinear":
        q, k, v = torch.randn(8, 8, generator=g), torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
        layer = lab.layer(name)(8, 4, 2, 1, bias=True)
        for i, w in enumerate((q, k, v)):
            layer.weight.weight_loader(layer.weight, w, i)
            layer.bias.weight_loader(layer.bias, torch.full((w.shape[0],), float(i)), i)
        bias = torch.tensor([0.0] * 8 + [1.0] * 4 + [2.0] * 4)
        check_tensor(layer(x), x @ torch.cat([q, k, v]).T + bias, what, **TOL, hint="[q | k | v] rows, with the bias")
    elif name == "RowParallelLinear":
        w, b = torch.randn(5, 8, generator=g), torch.randn(5, generator=g)
        layer = lab.layer(name)(8, 5, bias=True)
        layer.weight.weight_loader(layer.weight, w, None)
        layer.bias.weight_loader(layer.bias, b, None)
        check_tensor(layer(x), x @ w.T + b, what, **TOL, hint="x W^T + b")
    else:
        table = torch.randn(7, 8, generator=g)
        emb = lab.layer("VocabParallelEmbedding")(7, 8)
        emb.weight.weight_loader(emb.weight, table, None)
        if name == "VocabParallelEmbedding":
            ids = torch.tensor([0, 6, 3, 3])
            first_dropped = Pitfall(
                "the first id of the rank's range (id == start) treated as another rank's: its row came out zero",
                "an id is this rank's when 0 <= id - start < local_vocab (>= 0, not > 0)",
                lambda: F.embedding(ids, table) * (ids != 0).unsqueeze(-1),
            )
            check_tensor(
                emb(ids), F.embedding(ids, table), what, **TOL, hint="the rows of the ids", pitfalls=[first_dropped]
            )
        else:
            head = lab.layer(name)(7, 8, tie_to=emb)
            check_tensor(head(x), x @ table.T, what, **TOL, hint="hidden @ weight.T")


@contextmanager
def as_rank(rank: int, size: int) -> Iterator[None]:
    """This process plays rank ``rank`` of ``size`` (``get_tp_info()``) inside the block: enough to build a layer
    and load its weights, which need no collective."""
    saved = get_tp_info()
    set_tp_info(TPInfo(rank, size))
    try:
        yield
    finally:
        set_tp_info(saved)


def on_two_ranks(check: str) -> None:
    """The verdict of ``check`` on 2 gloo ranks (``tp_ranks.CHECKS``)."""
    verdict = tp_ranks.cached_checks(impl.lab_file(lab.STEM))[check]
    if verdict is not None:
        raise AssertionError(f"on 2 ranks (gloo): {verdict}")


# ---- one rank ----------------------------------------------------------------------------------------
@points(6)
def test_single_rank_layers():
    """At tp=1 every layer is the plain computation: [gate | up], [q | k | v] + bias, x W^T + b, lookup, logits."""
    for name in lab.CLASSES[1:]:
        single_rank(name)


# ---- each rank of a larger group, played in this process ------------------------------------------------
KV_CASES = [  # (heads, KV heads, tp)
    (4, 1, 4),  # one KV head, replicated on all 4 ranks
    (8, 2, 4),  # two ranks per KV head: rank r holds KV head r // 2
    (6, 1, 3),  # tp=3: the one KV head on every rank
    (6, 3, 3),  # one KV head per rank, nothing replicated
]


@points(5)
def test_qkv_kv_heads_on_each_rank():
    """tp=3 and tp=4, rank by rank: each rank holds num_heads / tp query heads and KV head
    r * num_kv_heads // tp (the one its query heads attend with), replicated when tp > num_kv_heads."""
    single_rank("QKVParallelLinear")
    d = 4
    for heads, kv_heads, tp in KV_CASES:
        g = torch.Generator().manual_seed(100 + 10 * heads + kv_heads)
        q, k, v = (torch.randn(n * d, 16, generator=g) for n in (heads, kv_heads, kv_heads))
        local_q, local_kv = heads // tp, max(1, kv_heads // tp)
        for rank in range(tp):
            what = f"qkv with {heads} heads and {kv_heads} KV head(s) at tp={tp}, rank {rank}"
            first = rank * kv_heads // tp
            with as_rank(rank, tp):
                layer = lab.layer("QKVParallelLinear")(16, d, heads, kv_heads)
                got_kv, got_q = getattr(layer, "num_local_kv_heads", None), getattr(layer, "num_local_heads", None)
                if got_kv != local_kv:
                    raise AssertionError(
                        f"{what}: num_local_kv_heads is {got_kv}, expected {local_kv}"
                        + (
                            "\nKV heads not replicated: with tp > num_kv_heads each rank holds one KV head (at least 1)"
                            if kv_heads < tp
                            else ""
                        )
                    )
                if got_q != local_q:
                    raise AssertionError(f"{what}: num_local_heads is {got_q}, expected {local_q} (num_heads / tp)")
                for i, (w, name) in enumerate(((q, "q"), (k, "k"), (v, "v"))):
                    try:
                        layer.weight.weight_loader(layer.weight, w, i)
                    except Exception as e:
                        past = i > 0 and (rank + 1) * local_kv > kv_heads  # rank * local_kv would overrun
                        raise AssertionError(
                            f"{what}: loading {name} (shard {i}) raised {type(e).__name__}: {e}\nexpected KV head "
                            f"{first}"
                            + (
                                ": a slice past the checkpoint's KV heads (the replicated head looked up as rank * "
                                f"num_local_kv_heads = {rank * local_kv}); rank r's first KV head is "
                                "r * num_kv_heads // tp"
                                if past
                                else ""
                            )
                        ) from None
            kv = slice(first * d, (first + local_kv) * d)
            want = torch.cat([q[rank * local_q * d : (rank + 1) * local_q * d], k[kv], v[kv]])
            got = layer.weight.data
            if got.shape == want.shape and torch.equal(got, want):
                continue
            held = [
                h
                for h in range(kv_heads)
                if got.shape == want.shape and torch.equal(got[local_q * d : (local_q + 1) * d], k[h * d : (h + 1) * d])
            ]
            if held and held[0] == rank % kv_heads != first:
                hint = (
                    f"that is KV head rank % num_kv_heads = {held[0]}, not r * num_kv_heads // tp = {first}: "
                    "neighbouring ranks share a KV head (their query heads are neighbours), not r % num_kv_heads"
                )
            elif held and held[0] == rank * local_kv != first:
                hint = (
                    f"that is KV head rank * num_local_kv_heads = {held[0]}: past the checkpoint's KV heads on the "
                    "last ranks; rank r's first KV head is r * num_kv_heads // tp"
                )
            else:
                hint = "query heads [r * heads/tp, (r+1) * heads/tp), then KV head(s) from r * num_kv_heads // tp"
            raise AssertionError(
                f"{what}: should hold query heads {rank * local_q}..{(rank + 1) * local_q - 1} and KV head {first}; "
                f"it holds {'KV head ' + str(held[0]) if held else 'another slice'} (weight {list(got.shape)})\n{hint}"
            )


EMBEDDING_CASES = [(11, 2), (10, 3), (10, 4)]  # (vocabulary, tp): the last shard has 1, 2 and 2 padding rows


@points(4)
def test_embedding_shards_on_each_rank():
    """A vocabulary of 11 at tp=2 and of 10 at tp=3 and tp=4, rank by rank: rank r holds rows
    [r * L, (r+1) * L) of the table, L = ceil(vocab / tp), and its rows past the vocabulary are zero, whatever
    the parameter held before loading (torch.empty)."""
    single_rank("VocabParallelEmbedding")
    for vocab, tp in EMBEDDING_CASES:
        table = torch.randn(vocab, 6, generator=torch.Generator().manual_seed(vocab + tp))
        local = -(-vocab // tp)
        padded = torch.cat([table, torch.zeros(local * tp - vocab, 6)])
        for rank in range(tp):
            what = f"embedding of {vocab} ids at tp={tp}, rank {rank}"
            with as_rank(rank, tp):
                emb = lab.layer("VocabParallelEmbedding")(vocab, 6)
                if tuple(emb.weight.shape) != (local, 6):
                    raise AssertionError(
                        f"{what}: the local table is {list(emb.weight.shape)}, expected [{local}, 6]: local_vocab = "
                        f"ceil(vocab / tp) = {local} on every rank (the shard rounded down, vocab // tp, leaves the "
                        "last ids to nobody)"
                    )
                emb.weight.data.fill_(float("nan"))  # what uninitialized memory may hold: loading writes every row
                emb.weight.weight_loader(emb.weight, table, None)
            want, got = padded[rank * local : (rank + 1) * local], emb.weight.data
            if torch.equal(got, want):
                continue
            real = min(local, max(0, vocab - rank * local))  # rows of this shard inside the vocabulary
            if torch.equal(got[:real], want[:real]):
                raise AssertionError(
                    f"{what}: rows {rank * local + real}..{(rank + 1) * local - 1} are past the vocabulary and hold "
                    f"{got[real:, 0].tolist()} (first column), expected zeros: the padding rows left as they were "
                    "(the parameter starts as torch.empty). Zero the padding rows when loading"
                )
            raise AssertionError(
                f"{what}: the loaded rows differ from the table's rows {rank * local}..{rank * local + real - 1}: rank "
                "r holds rows start : start + local_vocab of the table (start = r * local_vocab), clipped to the "
                "vocabulary"
            )


DIVIDE_CASES = [  # (fused sizes, tp): each must divide by tp; the sum of the last two does
    ([6, 5], 2),
    ([5, 6], 2),
    ([7, 5], 2),
    ([8, 6, 2], 4),
]


@points(4)
def test_merged_column_refuses_a_size_that_does_not_divide():
    """MergedColumnParallelLinear at tp=2 and tp=4: ValueError as soon as one of its sizes does not divide by
    tp, even when their sum or the first size does; sizes that all divide build."""
    single_rank("MergedColumnParallelLinear")
    cls = lab.layer("MergedColumnParallelLinear")
    with as_rank(1, 2):
        layer = cls(16, [6, 4])
    assert tuple(layer.weight.shape) == (5, 16), (
        f"MergedColumnParallelLinear(16, [6, 4]) at tp=2 holds a weight of {list(layer.weight.shape)}, expected "
        "[5, 16] (3 rows of gate, 2 of up)"
    )
    for sizes, tp in DIVIDE_CASES:
        with as_rank(1, tp):
            try:
                layer = cls(16, sizes)
            except ValueError:
                continue
            except Exception as e:
                raise AssertionError(
                    f"MergedColumnParallelLinear(16, {sizes}) at tp={tp} raised {type(e).__name__}: {e}; expected "
                    "ValueError (a size that does not divide by tp)"
                ) from None
        bad = [n for n in sizes if n % tp]
        if sum(sizes) % tp == 0:
            cause = f"their sum ({sum(sizes)}) divides, but each fused size is split on its own: check each size"
        elif sizes[0] % tp == 0:
            cause = f"the first size ({sizes[0]}) divides, but every fused size is split: check each size"
        else:
            cause = "rounding down drops features silently: raise ValueError when a size does not divide"
        raise AssertionError(
            f"MergedColumnParallelLinear(16, {sizes}) at tp={tp} was built (local weight "
            f"{list(getattr(getattr(layer, 'weight', None), 'shape', []))}): {bad} do not split over {tp} ranks\n"
            f"{cause}"
        )


@points(2)
def test_heads_and_input_features_that_do_not_divide():
    """QKVParallelLinear with query heads that do not divide by tp, and RowParallelLinear with input features that
    do not, raise ValueError (rounding down would drop heads or features silently); ones that divide build."""
    single_rank("RowParallelLinear")
    qkv, row = lab.layer("QKVParallelLinear"), lab.layer("RowParallelLinear")
    with as_rank(1, 4):
        qkv(16, 4, 8, 2)  # 8 heads, 2 KV heads over 4 ranks: builds
        row(16, 5)
    cases = [
        ("QKVParallelLinear(16, 4, 6, 2) at tp=4", lambda: qkv(16, 4, 6, 2), "6 query heads over 4 ranks"),
        ("QKVParallelLinear(16, 4, 3, 3) at tp=2", lambda: qkv(16, 4, 3, 3), "3 query heads over 2 ranks"),
        ("RowParallelLinear(18, 5) at tp=4", lambda: row(18, 5), "18 input features over 4 ranks"),
        ("RowParallelLinear(15, 5) at tp=2", lambda: row(15, 5), "15 input features over 2 ranks"),
    ]
    for what, build, why in cases:
        tp = int(what.rsplit("=", 1)[1])
        with as_rank(tp - 1, tp):
            try:
                layer = build()
            except ValueError:
                continue
            except Exception as e:
                raise AssertionError(f"{what} raised {type(e).__name__}: {e}; expected ValueError ({why})") from None
        shape = list(getattr(getattr(layer, "weight", None), "shape", []))
        raise AssertionError(
            f"{what} was built (local weight {shape}): {why} do not split evenly; rounding down drops them "
            "silently: raise ValueError when a size does not divide"
        )


# ---- two ranks ---------------------------------------------------------------------------------------
@points(8, timeout=150)
def test_merged_column_on_2_ranks():
    """[gate | up] on 2 ranks: rank r computes rows r*n/2 : (r+1)*n/2 of each projection, no communication."""
    single_rank("MergedColumnParallelLinear")
    on_two_ranks("merged_column")


@points(8, timeout=150)
def test_qkv_split_by_heads():
    """qkv with 4 heads and 2 KV heads on 2 ranks: 2 query heads and 1 KV head each."""
    single_rank("QKVParallelLinear")
    on_two_ranks("qkv_heads")


@points(6, timeout=150)
def test_qkv_replicates_kv_heads():
    """qkv with 4 heads and 1 KV head on 2 ranks (tp > KV heads): both ranks hold the KV head."""
    single_rank("QKVParallelLinear")
    on_two_ranks("qkv_replicated")


@points(9, timeout=150)
def test_row_parallel_on_2_ranks():
    """Row-parallel on 2 ranks: each multiplies its half of the input features; the all-reduce sums them."""
    single_rank("RowParallelLinear")
    on_two_ranks("row")


@points(6, timeout=150)
def test_row_parallel_bias_once():
    """Row-parallel with a bias on 2 ranks: the bias is in the result once, not once per rank."""
    single_rank("RowParallelLinear")
    on_two_ranks("row_bias")


@points(8, timeout=150)
def test_vocab_parallel_embedding():
    """An 11-token vocabulary on 2 ranks (6 + 5 rows, padded): each id's row comes from the rank that owns it."""
    single_rank("VocabParallelEmbedding")
    on_two_ranks("embedding")


@points(6, timeout=150)
def test_lm_head_gathers_logits():
    """The LM head on 2 ranks, tied and untied: every rank gets all 11 logits per row."""
    single_rank("ParallelLMHead")
    on_two_ranks("lm_head")


# ---- the engine on your layers --------------------------------------------------------------------------
PROMPTS = [[5, 6, 7, 8, 9], [100] * 20, list(range(3, 40)), [7, 7, 9]]


def engine_tokens(model, **engine_args) -> list[list[int]]:
    from minisgl import LLM, SamplingParams

    llm = LLM(str(model), device="cpu", dtype="float32", page_size=4, **engine_args)
    try:
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=10, ignore_eos=True), use_tqdm=False)
        return [o.token_ids for o in outs]
    finally:
        llm.shutdown()


def check_engine(model, kind: str) -> None:
    for name in lab.CLASSES[1:]:
        single_rank(name)  # a stub fails here, before the engine starts its ranks
    lab.layers()
    want = engine_tokens(model)
    with engine_failure(f"your layers at tp_size=2 ({kind})"):
        got = engine_tokens(model, tp_size=2, components={"tp_layers": lab.ENGINE_NAME})
    diff = first_token_difference(got, want)
    assert diff is None, f"the engine at tp_size=2 on your layers ({kind}) generated other tokens than at tp=1: {diff}"


@points(9, timeout=180)
@engine
def test_engine_tp2_llama(tiny_llama):
    """The engine at tp_size=2 on your layers generates TP=1's tokens (tiny Llama: 4 heads, 2 KV heads, untied)."""
    check_engine(tiny_llama, "tiny Llama")


@points(9, timeout=180)
@engine
def test_engine_tp2_qwen3(tiny_qwen3):
    """The same with a tiny Qwen3 (head_dim 32 != hidden / heads, q/k norms, tied embeddings)."""
    check_engine(tiny_qwen3, "tiny Qwen3")
