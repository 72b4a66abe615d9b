"""Lesson 10's tensor-parallel ranks. A notebook cannot spawn a function defined in a cell (the new
process imports the function by its module's name), so the worker lives here.

``run(world)`` starts ``world`` processes joined over gloo (``start(world)`` starts them in the background,
``.results()`` waits for them). Each builds the engine's parallel layers
(``minisgl.layers``) from the same full weights (``make_weights``: seeded, so every process and the
notebook draw the same ones), runs one small decoder block on them (embedding -> attention ->
MLP -> LM head) and saves what it computed and held, with the number of collectives it called.
``block`` is the same computation on one process with the full weights: the single-rank result.

``LESSON_LAYERS`` is the engine's layer set with a row-parallel layer that counts its calls (one
all-reduce each), picked by path in the engine: ``components={"tp_layers": "tp_demo:LESSON_LAYERS"}``.

The ``rank_*`` functions are what the lesson's exercises are checked against: the engine's own layers,
built as one rank of ``tp`` in this process (``as_rank``: building and loading a layer only asks
``get_tp_info()`` who it is), so they state no formula of their own.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

from minisgl.distributed import TPInfo, get_tp_info, set_tp_info
from minisgl.layers import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear, TPLayers

SIZES = dict(vocab=11, hidden=64, heads=4, kv_heads=2, head_dim=16, inter=96, tokens=6)


def make_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    s, g = SIZES, torch.Generator().manual_seed(seed)
    h, d = s["hidden"], s["head_dim"]

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) / shape[-1] ** 0.5

    return dict(
        embed=torch.randn(s["vocab"], h, generator=g),
        q=rand(s["heads"] * d, h),
        k=rand(s["kv_heads"] * d, h),
        v=rand(s["kv_heads"] * d, h),
        o=rand(h, s["heads"] * d),
        gate=rand(s["inter"], h),
        up=rand(s["inter"], h),
        down=rand(h, s["inter"]),
        ids=torch.randint(0, s["vocab"], (s["tokens"],), generator=g),
    )


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
    """Causal grouped-query attention over one sequence (no rotary: it acts on each head alone, so it
    changes nothing about how heads are split). ``q`` is ``[tokens, heads * d]``, ``k``/``v`` are
    ``[tokens, kv_heads * d]``; returns ``[tokens, heads * d]``."""
    n, d = q.shape[0], q.shape[1] // heads
    q = q.view(n, heads, d).transpose(0, 1)
    k = k.view(n, kv_heads, d).transpose(0, 1).repeat_interleave(heads // kv_heads, dim=0)
    v = v.view(n, kv_heads, d).transpose(0, 1).repeat_interleave(heads // kv_heads, dim=0)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(0, 1).reshape(n, heads * d)


def block(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The single-rank result: embedding, attention (+ residual), MLP (+ residual), logits."""
    s = SIZES
    x = F.embedding(w["ids"], w["embed"])
    a = attention(x @ w["q"].T, x @ w["k"].T, x @ w["v"].T, s["heads"], s["kv_heads"]) @ w["o"].T
    h = x + a
    m = (F.silu(h @ w["gate"].T) * (h @ w["up"].T)) @ w["down"].T
    h = h + m
    return dict(embedding=x, attention=a, mlp=m, logits=h @ w["embed"].T)


class CountingRow(RowParallelLinear):
    """The engine's row-parallel layer, counting its calls in this process (each is one all-reduce)."""

    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        CountingRow.calls += 1
        return super().forward(x)


LESSON_LAYERS = TPLayers(row=CountingRow)


# ---- the engine's answers to the lesson's exercises -------------------------------------------
@contextmanager
def as_rank(rank: int, tp: int) -> Iterator[None]:
    """Layers built (and loaded) inside are rank ``rank`` of ``tp``'s; the previous rank after."""
    saved = get_tp_info()
    set_tp_info(TPInfo(rank, tp))
    try:
        yield
    finally:
        set_tp_info(saved)


_BUILT: dict[tuple[str, int], tuple[int, int]] = {}  # (config, tp) -> (parameters, local KV heads)


def _rank0_sizes(cfg, tp: int) -> tuple[int, int]:
    """The parameters and the KV heads rank 0 of the engine's decoder holds at ``tp`` (remembered: the
    lesson asks for the same few configs many times)."""
    key = (repr(cfg), tp)
    if key not in _BUILT:
        from minisgl.models.decoder import DecoderForCausalLM

        # the meta device: shapes only, no memory (a 70B model's rank builds in milliseconds)
        with as_rank(0, tp), torch.device("meta"):
            model = DecoderForCausalLM(cfg)
        params = sum(p.numel() for p in model.parameters())  # a tied head is the embedding: counted once
        _BUILT[key] = params, model.model.layers[0].self_attn.qkv_proj.num_local_kv_heads
    return _BUILT[key]


def rank_params(cfg, tp: int) -> int:
    """The parameters rank 0 of the engine's decoder holds at ``tp`` (every rank holds as many)."""
    return _rank0_sizes(cfg, tp)[0]


def rank_kv_bytes(cfg, tp: int) -> int:
    """Bytes of K and V one rank keeps per token, in bfloat16: its KV heads, as the engine builds them."""
    from minisgl.kvcache import KVPool

    return KVPool.bytes_per_token(cfg.num_layers, _rank0_sizes(cfg, tp)[1], cfg.head_dim, torch.bfloat16)


def rank_weight(w: torch.Tensor, rank: int, tp: int, kind: str) -> torch.Tensor:
    """What rank ``rank`` of the engine's ``kind`` ("column" or "row") layer loads of the full ``w``."""
    out_features, in_features = w.shape
    with as_rank(rank, tp):
        if kind == "column":
            layer = MergedColumnParallelLinear(in_features, [out_features])
        else:
            layer = RowParallelLinear(in_features, out_features)
        layer.weight.weight_loader(layer.weight, w, 0)
    return layer.weight.data


def rank_kv_heads(rank: int, tp: int, num_kv_heads: int, num_heads: int | None = None) -> list[int]:
    """The KV heads rank ``rank`` of the engine's ``QKVParallelLinear`` loads: a k weight whose rows of
    head ``i`` hold ``i`` is read back from the rank's slice (``num_heads``: ``tp * num_kv_heads``
    unless given; it only has to divide by ``tp``)."""
    head_dim, hidden = 2, 4
    num_heads = num_heads or tp * num_kv_heads
    k = torch.arange(num_kv_heads).repeat_interleave(head_dim)[:, None].float().expand(-1, hidden)
    with as_rank(rank, tp):
        layer = QKVParallelLinear(hidden, head_dim, num_heads, num_kv_heads)
        layer.weight.weight_loader(layer.weight, k, 1)
    rows = layer.weight[layer.num_local_heads * head_dim :][: layer.num_local_kv_heads * head_dim, 0]
    return sorted({int(v) for v in rows})


def _rank(rank: int, world: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    import minisgl.distributed as dist
    from minisgl.layers import MergedColumnParallelLinear, ParallelLMHead, QKVParallelLinear, VocabParallelEmbedding
    from minisgl.layers.activation import silu_and_mul

    calls = {"all_reduce": 0, "all_gather": 0}

    class Counting(dist.TorchCommunicator):
        def all_reduce(self, x):
            calls["all_reduce"] += 1
            return super().all_reduce(x)

        def all_gather(self, x, dim=-1):
            calls["all_gather"] += 1
            return super().all_gather(x, dim)

    dist.COMMUNICATORS.register("lesson-counting", Counting)
    dist.init_distributed(rank, world, torch.device("cpu"), init, communicator="lesson-counting")
    s, w = SIZES, make_weights()
    h, d = s["hidden"], s["head_dim"]
    emb = VocabParallelEmbedding(s["vocab"], h)
    qkv = QKVParallelLinear(h, d, s["heads"], s["kv_heads"])
    o = RowParallelLinear(s["heads"] * d, h)
    gate_up = MergedColumnParallelLinear(h, [s["inter"], s["inter"]])
    down = RowParallelLinear(s["inter"], h)
    head = ParallelLMHead(s["vocab"], h, tie_to=emb)
    loads = [(emb.weight, "embed", None), (o.weight, "o", None), (down.weight, "down", None)]
    loads += [(qkv.weight, "q", 0), (qkv.weight, "k", 1), (qkv.weight, "v", 2)]
    loads += [(gate_up.weight, "gate", 0), (gate_up.weight, "up", 1)]
    for param, name, shard in loads:
        param.weight_loader(param, w[name], shard)  # this rank's slice of the full tensor
    with torch.no_grad():
        x = emb(w["ids"])
        local_q, local_kv = qkv.num_local_heads, qkv.num_local_kv_heads
        q, k, v = qkv(x).split([local_q * d, local_kv * d, local_kv * d], dim=-1)
        a = o(attention(q, k, v, local_q, local_kv))
        hid = x + a
        m = down(silu_and_mul(gate_up(hid)))
        logits = head(hid + m)
    held = {"embedding": emb, "qkv": qkv, "o_proj": o, "gate_up": gate_up, "down": down}
    shapes = {name: tuple(layer.weight.shape) for name, layer in held.items()}
    result = dict(embedding=x, attention=a, mlp=m, logits=logits, shapes=shapes, calls=calls, heads=(local_q, local_kv))
    torch.save(result, out)
    dist.destroy_distributed()


class Ranks:
    """``world`` gloo ranks running the block, started in the background (``start``): the notebook goes on
    while they spawn and import torch; ``results()`` waits for them."""

    def __init__(self, world: int, timeout: float):
        import torch.multiprocessing as mp

        from minisgl.process import free_port

        ctx = mp.get_context("spawn")
        init = f"tcp://127.0.0.1:{free_port()}"
        self.tmp = tempfile.mkdtemp()
        self.outs = [os.path.join(self.tmp, f"rank{r}.pt") for r in range(world)]
        self.procs = [ctx.Process(target=_rank, args=(r, world, init, self.outs[r])) for r in range(world)]
        self.started = time.perf_counter()
        self.deadline = time.monotonic() + timeout
        for p in self.procs:
            p.start()

    def results(self) -> list[dict]:
        """Each rank's results, in rank order (waits for the ranks; kills one that outlives the timeout)."""
        import shutil

        try:
            for p in self.procs:
                p.join(max(0.1, self.deadline - time.monotonic()))
            for p in self.procs:
                if p.is_alive():
                    p.kill()
                    p.join()
            bad = [(r, p.exitcode) for r, p in enumerate(self.procs) if p.exitcode != 0]
            if bad:
                raise RuntimeError(f"ranks that failed (rank, exit code): {bad}")
            return [torch.load(Path(out)) for out in self.outs]
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


def start(world: int = 2, timeout: float = 180.0) -> Ranks:
    """Start ``world`` gloo ranks running the block, in the background."""
    return Ranks(world, timeout)


def run(world: int = 2, timeout: float = 120.0) -> list[dict]:
    """Start ``world`` gloo ranks running the block; each rank's results, in rank order."""
    return start(world, timeout).results()
