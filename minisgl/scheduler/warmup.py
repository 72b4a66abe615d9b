"""Warming up: run a few requests through every path a serving engine uses before it says it is
ready, so that what compiles on first use compiles now, not inside the first users' requests.

On a GPU that is FlashInfer's prefill kernels (JIT-compiled on their first call: about a minute each
on a machine whose kernel cache is empty or stale, e.g. right after installing), Triton's
specialisations (a kernel compiles once per kind of argument: token counts that are a multiple of
16 and those that are not), and the sampler's paths (greedy, temperature, top-k/top-p). Decode
kernels already ran once per batch size while the CUDA graphs were captured. On a CPU nothing
compiles lazily but the C++ decode kernel, which the engine loads at start-up: the server warms up
on GPUs only.
"""

from __future__ import annotations

import time

from minisgl.core import SamplingParams
from minisgl.scheduler.events import CacheStats
from minisgl.scheduler.scheduler import Scheduler

FIRST_UID = -(1 << 62)  # warm-up requests take uids no client can have (clients' are >= 0)


def warm_up(sched: Scheduler) -> float:
    """Run the warm-up requests to the end; returns the seconds it took. Leaves no trace: the
    prefix cache is emptied, the cache counters are zeroed and the step-time policy's measurements
    dropped. On a tensor-parallel group, call it on rank 0 (a ``ReplicatedScheduler``): the other
    ranks run the same requests."""
    t = time.perf_counter()
    vocab, page = sched.engine.model_config.vocab_size, sched.page_size
    longest = max(1, sched.engine.max_seq_len - 4)
    ids = lambda n, start: [(start + i) % (vocab - 1) + 1 for i in range(min(n, longest))]
    greedy = SamplingParams(max_tokens=3, ignore_eos=True)
    sampled = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_tokens=3, ignore_eos=True, seed=0)
    plain = SamplingParams(temperature=0.7, max_tokens=3, ignore_eos=True, seed=1)
    rounds = [
        [(ids(32, 11), greedy)],  # a prefill of 32 tokens: a multiple of 16
        [(ids(2 * page + 3, 57), sampled), (ids(5, 3), plain), (ids(7, 99), greedy)],  # ragged, across pages
    ]
    uid = FIRST_UID
    for batch in rounds:
        for prompt, params in batch:
            sched.add(sched.make_request(uid, prompt, params))
            uid += 1
        while sched.has_work:
            sched.step()
    sched.flush_cache()
    sched.stats = CacheStats()
    sched.chunking.forget()  # --step-time: steps that compiled kernels are no measure of speed
    return time.perf_counter() - t
