"""Tensor parallelism on CPU (gloo): each parallel layer on 2 ranks equals its single-rank
version; greedy tokens with TP=2 (tiny Llama, Qwen3) and TP=3 (the embedded model: 9 heads, 3 KV
heads) equal TP=1, offline and through the server; bad sizes are refused; ranks stop cleanly, and a
dead rank is an error, not a hang."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from minisgl import LLM, SamplingParams
from minisgl.process import free_port

PROMPTS = [[5, 6, 7, 8, 9], [100] * 30, list(range(3, 60)), [7, 7, 9]]
PARAMS = SamplingParams(max_tokens=12, ignore_eos=True)


def _layers_on_rank(rank: int, world: int, init: str) -> None:
    """Runs in each spawned rank: build every parallel layer from the same full weights and check
    this rank's output against the single-rank computation."""
    torch.set_num_threads(1)
    from minisgl.distributed import all_gather, destroy_distributed, init_distributed
    from minisgl.layers import (
        MergedColumnParallelLinear,
        ParallelLMHead,
        QKVParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
    )

    init_distributed(rank, world, torch.device("cpu"), init)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 16, generator=g)
    close = lambda a, b, what: torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m: f"{what}: {m}")

    # fused gate/up: this rank holds rows [r*n/2, (r+1)*n/2) of each of the two projections
    gate, up = torch.randn(12, 16, generator=g), torch.randn(12, 16, generator=g)
    layer = MergedColumnParallelLinear(16, [12, 12])
    layer.weight.weight_loader(layer.weight, gate, 0)
    layer.weight.weight_loader(layer.weight, up, 1)
    half = slice(rank * 6, rank * 6 + 6)
    close(layer(x), torch.cat([x @ gate[half].T, x @ up[half].T], -1), "merged column-parallel")

    # qkv with 4 heads, 1 KV head (tp > kv heads: the KV head is replicated), head_dim 4
    q, k, v = torch.randn(16, 16, generator=g), torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g)
    qkv = QKVParallelLinear(16, 4, 4, 1)
    for i, w in enumerate((q, k, v)):
        qkv.weight.weight_loader(qkv.weight, w, i)
    close(qkv(x), torch.cat([x @ q[rank * 8 : rank * 8 + 8].T, x @ k.T, x @ v.T], -1), "qkv (replicated kv)")

    # row-parallel: partial products summed by all-reduce, bias added once
    w, b = torch.randn(8, 16, generator=g), torch.randn(8, generator=g)
    row = RowParallelLinear(16, 8, bias=True)
    row.weight.weight_loader(row.weight, w)
    row.bias.weight_loader(row.bias, b)
    close(row(x[:, rank * 8 : rank * 8 + 8]), x @ w.T + b, "row-parallel")

    # vocabulary of 11 (does not divide by 2: padded shards) for the embedding and the LM head
    table = torch.randn(11, 16, generator=g)
    emb = VocabParallelEmbedding(11, 16)
    emb.weight.weight_loader(emb.weight, table)
    ids = torch.tensor([0, 3, 5, 6, 10, 2])
    close(emb(ids), F.embedding(ids, table), "vocab-parallel embedding")
    head = ParallelLMHead(11, 16, tie_to=emb)
    close(head(x), x @ table.T, "vocab-parallel LM head (tied)")
    close(all_gather(torch.full((2, 1), float(rank))), torch.tensor([[0.0, 1.0]] * 2), "all_gather")
    destroy_distributed()


def test_parallel_layers_equal_single_rank():
    mp.spawn(_layers_on_rank, args=(2, f"tcp://127.0.0.1:{free_port()}"), nprocs=2, join=True)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_tp2_equals_tp1(kind, tiny_llama, tiny_qwen3):
    path = str(tiny_llama if kind == "llama" else tiny_qwen3)
    ref = [o.token_ids for o in LLM(path, dtype="float32").generate(PROMPTS, PARAMS, use_tqdm=False)]
    llm = LLM(path, dtype="float32", tp_size=2, page_size=4, max_prefill_length=16)
    try:
        assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)] == ref
        # a second call: prefix hits and sampled requests with seeds stay in step on both ranks
        sampled = SamplingParams(max_tokens=8, temperature=1.0, seed=5, ignore_eos=True)
        a = llm.generate(PROMPTS[:2], [PARAMS, sampled], use_tqdm=False)
        assert a[0].token_ids == ref[0] and a[0].cached_tokens > 0
        single = LLM(path, dtype="float32").generate(PROMPTS[1:2], sampled, use_tqdm=False)[0].token_ids
        assert a[1].token_ids == single
    finally:
        llm.shutdown()
    assert not any(p.is_alive() for p in llm.scheduler.processes), "a rank outlived shutdown()"


def test_tp3_on_the_embedded_model_equals_tp1(embedded_path):
    convs = [[{"role": "user", "content": c}] for c in ("What is the capital of France?", "Name three colors.")]
    p = SamplingParams(max_tokens=32, ignore_eos=True)
    ref = [o.token_ids for o in LLM(dtype="float32").chat(convs, p, use_tqdm=False)]
    llm = LLM(dtype="float32", tp_size=3)
    try:
        assert llm.scheduler.engine.model.model.layers[0].self_attn.num_kv_heads == 1  # 3 KV heads / 3
        assert [o.token_ids for o in llm.chat(convs, p, use_tqdm=False)] == ref
    finally:
        llm.shutdown()


def test_impossible_tp_size_is_refused_before_starting(tiny_llama):
    with pytest.raises(ValueError, match=r"tensor-parallel sizes that work: \[1, 2, 4\]"):
        LLM(str(tiny_llama), tp_size=3)


def test_a_dead_rank_is_an_error_not_a_hang(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", tp_size=2)
    try:
        llm.generate(PROMPTS[:1], PARAMS, use_tqdm=False)
        (worker,) = llm.scheduler.processes
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
        t = time.monotonic()
        with pytest.raises(RuntimeError, match="minisgl-tp1|rank 1"):
            llm.generate(PROMPTS[:1], PARAMS, use_tqdm=False)
        assert time.monotonic() - t < 30
    finally:
        llm.shutdown()


def test_server_with_tp2_matches_offline(tiny_llama, tmp_path):
    from server_utils import ServerProcess, alive_pids, wait_until

    ref = LLM(str(tiny_llama), dtype="float32").generate(PROMPTS[:2], PARAMS, use_tqdm=False)
    server = ServerProcess(["--model", str(tiny_llama), "--tp", "2", "--dtype", "float32"], tmp_path)
    try:
        server.wait_ready()
        import psutil

        children = [c.pid for c in psutil.Process(server.proc.pid).children(recursive=True)]
        assert_greedy_answers(server.url, tiny_llama, ref)
    finally:
        assert server.stop() == 0
    # children exit as the launcher stops them (the multiprocessing resource tracker a moment later)
    assert wait_until(lambda: not alive_pids(children), 10), f"outlived the server: {alive_pids(children)}"


def assert_greedy_answers(url: str, model, ref) -> None:
    """The server at ``url`` answers ``PROMPTS[:2]`` greedily with ``ref``'s tokens."""
    import httpx

    for prompt, out in zip(PROMPTS[:2], ref):
        r = httpx.post(
            f"{url}/v1/completions",
            json=dict(prompt=prompt, max_tokens=12, temperature=0, ignore_eos=True),
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 12
        assert r.json()["choices"][0]["text"] == decoded_text(model, out.token_ids)


def decoded_text(path, ids):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path).decode(ids, skip_special_tokens=True)


def test_a_script_without_the_main_guard_fails_at_once(tiny_llama, tmp_path):
    """Spawned ranks re-import the script; an unguarded one dies before it starts. The call that
    built the engine says so (and what to write) in seconds, not after a rendezvous timeout."""
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    script.write_text(
        "import time\n"
        "from minisgl import LLM\n"
        "t = time.monotonic()\n"
        "try:\n"
        f"    LLM({str(tiny_llama)!r}, dtype='float32', tp_size=2)\n"
        "except RuntimeError as e:\n"
        "    print(f'FAILED after {time.monotonic() - t:.1f} s: {e}', flush=True)\n"
        "    raise SystemExit(3)\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 3, r.stdout + r.stderr[-3000:]
    # the rank that re-ran the script failed too, on multiprocessing's own check: ours is the caller's
    line = next(x for x in r.stdout.splitlines() if x.startswith("FAILED") and "tensor-parallel" in x)
    assert "rank 1" in line and "before it started" in line and 'if __name__ == "__main__":' in line, line
    assert float(line.split()[2]) < 10, line


def test_server_rank_dying_before_it_joins_stops_the_server(tiny_llama, tmp_path):
    """``python -m minisgl --tp 2`` whose rank 1 dies while the group forms exits at once, naming it."""
    import psutil
    from server_utils import ServerProcess, wait_until

    server = ServerProcess(["--model", str(tiny_llama), "--tp", "2", "--dtype", "float32"], tmp_path)
    try:
        launcher = psutil.Process(server.proc.pid)

        def ranks() -> list[psutil.Process]:
            spawned = [c for c in launcher.children() if "spawn_main" in " ".join(c.cmdline())]
            return sorted(spawned, key=lambda c: c.create_time())

        assert wait_until(lambda: len(ranks()) >= 2, 60, 0.02), "the scheduler ranks never started"
        rank1 = ranks()[1]
        rank1.kill()
        t = time.monotonic()
        assert server.proc.wait(30) == 1
        assert time.monotonic() - t < 10
        assert f"the scheduler-1 process (pid {rank1.pid}) was killed by signal 9 while starting" in (
            server.err_path.read_text()
        )
    finally:
        server.stop()


def test_two_nodes_serve_tp1s_tokens(tiny_llama, tmp_path):
    """``--nnodes 2``: two launches on this machine act as two nodes of TP=2 (gloo over TCP). Node 0
    serves HTTP with rank 0; node 1 runs only rank 1 (no HTTP, no tokenizer). Greedy answers equal
    TP=1's; stopping node 0 ends node 1 as well."""
    import subprocess
    import sys

    import psutil
    from server_utils import REPO, ServerProcess, server_env

    ref = LLM(str(tiny_llama), dtype="float32").generate(PROMPTS[:2], PARAMS, use_tqdm=False)
    meet = f"127.0.0.1:{free_port()}"
    common = ["--model", str(tiny_llama), "--tp", "2", "--dtype", "float32", "--nnodes", "2", "--dist-init-addr", meet]
    node0 = ServerProcess([*common, "--node-rank", "0"], tmp_path)
    with open(tmp_path / "node1.log", "w") as log:
        node1 = subprocess.Popen(
            [sys.executable, "-m", "minisgl", *common, "--node-rank", "1"],
            cwd=REPO,
            env=server_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        node0.wait_ready()
        spawned = [c for c in psutil.Process(node1.pid).children() if "spawn_main" in " ".join(c.cmdline())]
        assert len(spawned) == 1  # rank 1 only: no tokenizer, no detokenizer
        assert node1.poll() is None
        assert_greedy_answers(node0.url, tiny_llama, ref)
    finally:
        assert node0.stop() == 0
        try:
            node1.wait(30)  # its rank loses rank 0 and exits; the node follows
        finally:
            node1.kill()
    log = (tmp_path / "node1.log").read_text()
    assert node1.returncode == 0, log
    assert "node 1 of 2: ranks [1]" in log and "rank 0 has gone" in log and "Traceback" not in log, log


@pytest.mark.parametrize(
    "flags, error",
    [
        (["--tp", "3", "--nnodes", "2", "--dist-init-addr", "h:1"], "does not split over --nnodes 2"),
        (["--tp", "2", "--nnodes", "2"], "needs --dist-init-addr"),
        (["--tp", "2", "--nnodes", "2", "--node-rank", "2", "--dist-init-addr", "h:1"], "--node-rank must be in 0..1"),
        (["--tp", "2", "--nnodes", "2", "--dist-init-addr", "nohost"], "must be HOST:PORT"),
        (["--nnodes", "0"], "--nnodes must be >= 1"),
    ],
)
def test_bad_node_flags_are_usage_errors(flags, error, capsys):
    from minisgl.server.args import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(flags)
    assert e.value.code == 2 and error in capsys.readouterr().err
