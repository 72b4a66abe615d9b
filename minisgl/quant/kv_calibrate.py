"""FP8 KV scales, calibrated at load (``--kv-cache-dtype fp8_e4m3``).

An FP8 (e4m3) value has 3 mantissa bits and a normal range of 2^-6..448. Stored as they are, values
past 448 saturate and values under 2^-6 lose bits (subnormals), so each KV head of each layer gets a
scale ``s`` (``KVPool.k_scale``, ``v_scale``) and stores ``x / s``, with ``s`` the smallest power of
two that maps the largest |x| seen on a calibration text into range. What no scale changes is the
rounding to 3 mantissa bits (up to 1/16 of each value): on the embedded model, whose K/V were mostly in
range already, calibration moved the quality benchmark little (docs/fp8.md).

The calibration is one prefill pass of a fixed English text through the engine's own model and
attention backend, with the pool in ``calibrating`` mode: each layer's store first sets the scales
from the K/V it receives, then stores with them, so later layers see the attention a calibrated
cache gives. Values larger than the calibration's saturate at +-448 * s (the power of two leaves
1-2x of headroom). Weights without a tokenizer (``--dummy-weight``) calibrate on seeded random ids.
"""

from __future__ import annotations

import logging

import torch

from minisgl.attention.context import forward_context
from minisgl.core import Batch, Req, SamplingParams

logger = logging.getLogger(__name__)

# Plain prose of mixed topics, distinct from the quality benchmark's passage (minisgl/benchmark/quality.py)
TEXT = (
    "The river rose slowly through the night, and by morning the low fields beside the mill were under a "
    "sheet of brown water. Farmers came down the lane in boots and carts to see how far it had spread. "
    "In the town, the baker counted sacks of flour and wondered whether the bridge would hold. A teacher "
    "explained to her class that a river carries more sediment when it runs fast, and drops it when it "
    "slows, which is why deltas form where rivers meet the sea. Meanwhile a programmer in a small office "
    "wrote a function that sorted a list of numbers, tested it on an empty list, a list of one, and a list "
    "already in order, then fixed the case she had forgotten. Questions kept arriving by email: what time "
    "does the market open, how much does a ticket to the coast cost, and can the library stay open late "
    "on Thursday? By evening the water had fallen, leaving a line of mud on every wall it had touched."
)


def calibration_ids(tokenizer, vocab_size: int, max_len: int) -> list[int]:
    """The calibration text's token ids (at most ``max_len``), or seeded random ids without a tokenizer."""
    if tokenizer is not None:
        ids = tokenizer.encode(TEXT)
    else:
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab_size, (256,), generator=gen).tolist()
    return ids[: max(1, max_len)]


@torch.inference_mode()
def calibrate_kv_scales(engine, ids: list[int]) -> None:
    """Set ``engine.kv_pool``'s per-head scales from one prefill of ``ids``, run in the pool's first
    pages through a request-table row that is returned after. Call it at load, before any request
    (and before CUDA graphs: their passes would store too)."""
    pool, table, device = engine.kv_pool, engine.table, engine.device
    p, room = pool.page_size, pool.num_pages * pool.page_size
    if len(ids) > room:  # a pool this small still starts: its scales come from what fits
        logger.warning("the KV pool holds %d of the %d calibration tokens: calibrating on those", room, len(ids))
        ids = ids[:room]
    n = len(ids)
    pages = -(-n // p)
    row = table.alloc_row()
    try:
        i64 = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
        table.map_pages(i64([row]), i64([0]), i64([pages * p]), torch.arange(pages, dtype=torch.int64))
        table.sync()
        req = Req(-1, list(ids), SamplingParams(max_tokens=1), seed=0, table_idx=row)
        batch = Batch([req], "prefill", [0], [n])
        batch.out_loc = table.slots(row, 0, n).to(device)
        batch.positions = torch.arange(n, device=device)
        batch.input_ids = torch.tensor(ids, dtype=torch.int32, device=device)
        batch.logit_idx = torch.tensor([n - 1], device=device)
        batch.table_idx = torch.tensor([row], device=device)
        pool.calibrating = True
        with forward_context(batch, engine.attn_backend):
            engine.attn_backend.prepare_metadata(batch)
            engine.model(batch.input_ids, batch.positions, batch.logit_idx)
    finally:
        pool.calibrating = False
        table.free_row(row)
    k, v = pool.k_scale.log2(), pool.v_scale.log2()
    logger.info(
        "FP8 KV scales from %d calibration tokens: K 2^%d..2^%d, V 2^%d..2^%d (per layer and KV head)",
        n,
        int(k.min()),
        int(k.max()),
        int(v.min()),
        int(v.max()),
    )
