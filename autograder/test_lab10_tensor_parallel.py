"""Lab 10 (tensor-parallel layers): each layer at ``tp=1`` against a plain matmul / lookup (in this
process), then on 2 ranks over gloo, where every rank must give the single-rank result, then the
real engine at ``tp_size=2`` built from your layers. Run: ``python -m autograder lab10``.

The 2-rank checks run in one spawn of 2 processes (``autograder/tp_ranks.py``: the first test that
needs them pays a few seconds, the others read its verdicts); a rank that hangs or dies fails only
the check it was in. Each test first builds its layer at ``tp=1`` here, so an unfinished layer fails
at once, before any process is started.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from autograder import impl, tp_ranks
from autograder.adapters import lab10 as lab
from autograder.checks import Pitfall, check_tensor, first_token_difference
from autograder.engine_runs import engine_failure
from autograder.points import engine, points

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
            check_tensor(emb(ids), F.embedding(ids, table), what, **TOL, hint="the rows of the ids")
        else:
            head = lab.layer(name)(7, 8, tie_to=emb)
            check_tensor(head(x), x @ table.T, what, **TOL, hint="hidden @ weight.T")


def on_two_ranks(check: str) -> None:
    """The verdict of ``check`` on 2 gloo ranks (``tp_ranks.CHECKS``)."""
    verdict = tp_ranks.cached_checks(impl.lab_file(lab.STEM))[check]
    if verdict is not None:
        raise AssertionError(f"on 2 ranks (gloo): {verdict}")


# ---- one rank ----------------------------------------------------------------------------------------
@points(10)
def test_single_rank_layers():
    """At tp=1 every layer is the plain computation: [gate | up], [q | k | v] + bias, x W^T + b, lookup, logits."""
    for name in lab.CLASSES[1:]:
        single_rank(name)


# ---- two ranks ---------------------------------------------------------------------------------------
@points(10, timeout=150)
def test_merged_column_on_2_ranks():
    """[gate | up] on 2 ranks: rank r computes rows r*n/2 : (r+1)*n/2 of each projection, no communication."""
    single_rank("MergedColumnParallelLinear")
    on_two_ranks("merged_column")


@points(9, timeout=150)
def test_qkv_split_by_heads():
    """qkv with 4 heads and 2 KV heads on 2 ranks: 2 query heads and 1 KV head each."""
    single_rank("QKVParallelLinear")
    on_two_ranks("qkv_heads")


@points(8, timeout=150)
def test_qkv_replicates_kv_heads():
    """qkv with 4 heads and 1 KV head on 2 ranks (tp > KV heads): both ranks hold the KV head."""
    single_rank("QKVParallelLinear")
    on_two_ranks("qkv_replicated")


@points(10, timeout=150)
def test_row_parallel_on_2_ranks():
    """Row-parallel on 2 ranks: each multiplies its half of the input features; the all-reduce sums them."""
    single_rank("RowParallelLinear")
    on_two_ranks("row")


@points(6, timeout=150)
def test_row_parallel_bias_once():
    """Row-parallel with a bias on 2 ranks: the bias is in the result once, not once per rank."""
    single_rank("RowParallelLinear")
    on_two_ranks("row_bias")


@points(10, timeout=150)
def test_vocab_parallel_embedding():
    """An 11-token vocabulary on 2 ranks (6 + 5 rows, padded): each id's row comes from the rank that owns it."""
    single_rank("VocabParallelEmbedding")
    on_two_ranks("embedding")


@points(7, timeout=150)
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


@points(10, timeout=180)
@engine
def test_engine_tp2_llama(tiny_llama):
    """The engine at tp_size=2 on your layers generates TP=1's tokens (tiny Llama: 4 heads, 2 KV heads, untied)."""
    check_engine(tiny_llama, "tiny Llama")


@points(10, timeout=180)
@engine
def test_engine_tp2_qwen3(tiny_qwen3):
    """The same with a tiny Qwen3 (head_dim 32 != hidden / heads, q/k norms, tied embeddings)."""
    check_engine(tiny_qwen3, "tiny Qwen3")
