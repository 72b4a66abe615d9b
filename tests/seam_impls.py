"""Recording implementations of the engine's seams, for ``test_seams.py``: each behaves like the
engine's own and counts its calls in ``CALLS``. A module of its own, so that a process started with
``spawn`` (a tensor-parallel rank) can import one by its ``"seam_impls:Name"`` path."""

from __future__ import annotations

import logging
from collections import Counter

from minisgl.attention import TorchBackend
from minisgl.distributed import TorchCommunicator
from minisgl.engine.graph import BucketPlan
from minisgl.engine.sample import DefaultSampler
from minisgl.kvcache import FreeListAllocator, RadixPrefixCache, TensorReqTable
from minisgl.kvcache.radix import common_prefix_len
from minisgl.layers import RowParallelLinear, TPLayers, apply_rotary, rms_norm, rope_inv_freq, silu_and_mul
from minisgl.layers.rotary import RotaryImpl
from minisgl.scheduler import GreedyChunking, Optimistic, PlainLoop
from minisgl.tokenizer.detokenizer import IncrementalDecoder, StopStringCutter, TextStreams

CALLS: Counter = Counter()


def counted(name: str, fn):
    def wrapper(*args, **kwargs):
        CALLS[name] += 1
        return fn(*args, **kwargs)

    return wrapper


class Sampler(DefaultSampler):
    def sample(self, logits, info):
        CALLS["sampler"] += 1
        return super().sample(logits, info)


class Cache(RadixPrefixCache):
    def match_prefix(self, token_ids):
        CALLS["prefix_cache"] += 1
        return super().match_prefix(token_ids)


def _key_compare(a, b):
    CALLS["key_compare"] += 1
    return common_prefix_len(a, b)


class KeyCompareCache(RadixPrefixCache):
    prefix_len = staticmethod(_key_compare)


class Backend(TorchBackend):
    name = "recording"

    def forward(self, q, k, v, layer_id, batch):
        CALLS["attention"] += 1
        return super().forward(q, k, v, layer_id, batch)


class Allocator(FreeListAllocator):
    def alloc(self, n):
        CALLS["allocator"] += 1
        return super().alloc(n)


class Table(TensorReqTable):
    def map_pages(self, rows, starts, ends, pages):
        CALLS["req_table"] += 1
        return super().map_pages(rows, starts, ends, pages)


class Admission(Optimistic):
    def admit(self, waiting, ctx):
        CALLS["admission"] += 1
        return super().admit(waiting, ctx)


class Chunking(GreedyChunking):
    def extend_end(self, req, tokens_left):
        CALLS["chunking"] += 1
        return super().extend_end(req, tokens_left)


class GraphPlan(BucketPlan):
    """The CUDA-graph plan: the engine calls it only on a GPU (test_gpu.py)."""

    def pad(self, static, batch, bs, scratch_slot, dummy_row):
        CALLS["graph_plan"] += 1
        return super().pad(static, batch, bs, scratch_slot, dummy_row)


class Loop(PlainLoop):
    def step(self):
        CALLS["loop"] += 1
        return super().step()


class Row(RowParallelLinear):
    def forward(self, x):
        CALLS["tp_layers"] += 1
        return super().forward(x)


class Communicator(TorchCommunicator):
    def all_reduce(self, x):
        CALLS["communicator"] += 1
        return super().all_reduce(x)


norm = counted("norm", rms_norm)
rotary = RotaryImpl(counted("rotary", rope_inv_freq), counted("rotary", apply_rotary))
activation = counted("activation", silu_and_mul)
tp_layers = TPLayers(row=Row)


class Detokenizer(IncrementalDecoder):
    """The server runs it in another process: each instance says so in the server's log, once."""

    def push(self, token_ids):
        if not CALLS["detokenizer"]:
            logging.getLogger("minisgl.server").warning("recording detokenizer called")
        CALLS["detokenizer"] += 1
        return super().push(token_ids)


class StopStrings(StopStringCutter):
    def feed(self, text):
        if not CALLS["stop_strings"]:
            logging.getLogger("minisgl.server").warning("recording stop strings called")
        CALLS["stop_strings"] += 1
        return super().feed(text)


text_streams = TextStreams(Detokenizer, StopStrings)


def _ngram1():
    from minisgl.speculative.ngram import NgramDrafter

    class Ngram1(NgramDrafter):
        """The n-gram drafter on 1-token suffixes too: random tiny models rarely repeat two tokens in a row
        (test_speculative.py; a spawned tensor-parallel rank imports it as ``seam_impls:Ngram1``)."""

        min_n = 1

    return Ngram1


Ngram1 = _ngram1()
