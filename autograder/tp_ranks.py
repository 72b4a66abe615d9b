"""Lab 10's layer checks on real tensor-parallel ranks: ``run_checks()`` spawns ``world`` processes
joined over gloo (starting one costs seconds, so one spawn runs every check) and each rank builds
the lab's layers from the same full weights and compares its output with the single-rank result.

A check's verdict is ``None`` (passed on every rank) or the message of the first rank that failed.
A rank that hangs (a collective the other rank never joins gives gloo's timeout, a loop never
returns) or dies is stopped; the check it was in fails saying so, and the checks after it run in a
fresh spawn, so one broken layer costs only its own points. Results are kept in a file per grading
process and lab file (``cached_checks``): every test of the lab reads the one spawn's verdicts.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.nn.functional as F

from autograder import pace
from autograder.checks import Pitfall, check_tensor

WORLD = 2
# limits for the reference machine; each is multiplied by this machine's pace (autograder/pace.py)
GLOO_TIMEOUT_S = 8.0  # a collective the other rank never joins fails after this
START_S = 60.0  # a spawn's ranks must have imported torch, joined and started checking within this
CHECK_S = 12.0  # one check's time limit, once its rank runs it
BUDGET_S = 100.0  # all spawns together (the first test's limit is 150 s): checks left after it fail
TOL = dict(atol=1e-5, rtol=1e-5)


# ---- the checks, run in each rank -----------------------------------------------------------------------
def _layer(name: str):
    from autograder.adapters import lab10

    return lab10.layer(name)


def _load(param, full: torch.Tensor, shard, what: str, fix: str) -> None:
    loader = getattr(param, "weight_loader", None)
    if loader is None:
        raise AssertionError(f"{what}: the parameter has no weight_loader (the engine loads checkpoints through it)")
    try:
        loader(param, full, shard)
    except Exception as e:
        raise AssertionError(f"loading {what} raised {type(e).__name__}: {e}\nusual cause: {fix}") from None


def _shape(t: torch.Tensor, want: tuple[int, ...], what: str, fix: str) -> None:
    if tuple(t.shape) != want:
        raise AssertionError(f"{what}: expected shape {list(want)}, got {list(t.shape)}\nusual cause: {fix}")


def _rows(n: int, rank: int, world: int) -> slice:
    return slice(rank * n // world, (rank + 1) * n // world)


def check_merged_column(rank: int, world: int) -> None:
    g = torch.Generator().manual_seed(10)
    x, gate, up = torch.randn(5, 16, generator=g), torch.randn(12, 16, generator=g), torch.randn(12, 16, generator=g)
    layer = _layer("MergedColumnParallelLinear")(16, [12, 12])
    split = "each rank holds out/tp rows of *each* fused shard: [gate_r | up_r]"
    _shape(layer.weight, (12, 16), "the local [gate | up] weight", split)
    _load(layer.weight, gate, 0, "gate (shard 0)", "rows rank*n : (rank+1)*n of the shard's own [12, 16] tensor")
    _load(layer.weight, up, 1, "up (shard 1)", "rows rank*n : (rank+1)*n of the shard's own [12, 16] tensor")
    mine = _rows(12, rank, world)
    got = layer(x)
    pitfalls = [
        Pitfall(
            "every shard written at offset 0 of the local weight (up overwrote gate)",
            "shard i goes to rows offsets[i] : offsets[i] + local_sizes[i] of the fused [gate | up] weight",
            lambda: torch.cat([x @ up[mine].T, got[:, 6:]], -1),
        )
    ]
    if rank:
        pitfalls.append(
            Pitfall(
                "rank 0's rows on every rank",
                "the slice of the checkpoint starts at rank * local_size",
                lambda: torch.cat([x @ gate[:6].T, x @ up[:6].T], -1),
            )
        )
    check_tensor(
        got,
        torch.cat([x @ gate[mine].T, x @ up[mine].T], -1),
        f"rank {rank}: merged column-parallel [gate | up]",
        **TOL,
        hint=split,
        pitfalls=pitfalls,
    )


def _qkv(rank: int, world: int, heads: int, kv_heads: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    d = 4
    x = torch.randn(5, 16, generator=g)
    q, k, v = (torch.randn(n * d, 16, generator=g) for n in (heads, kv_heads, kv_heads))
    layer = _layer("QKVParallelLinear")(16, d, heads, kv_heads)
    local_kv = max(1, kv_heads // world)
    what = f"rank {rank}: qkv ({heads} heads, {kv_heads} KV head{'s' * (kv_heads != 1)}, tp={world})"
    replicate = "KV heads not replicated: with tp > num_kv_heads each rank holds one KV head (at least 1)"
    if getattr(layer, "num_local_kv_heads", None) != local_kv:
        raise AssertionError(
            f"{what}: num_local_kv_heads is {getattr(layer, 'num_local_kv_heads', 'missing')}, expected {local_kv}"
            + (f"\nusual cause: {replicate}" if kv_heads < world else "")
        )
    if getattr(layer, "num_local_heads", None) != heads // world:
        got = getattr(layer, "num_local_heads", "missing")
        raise AssertionError(f"{what}: num_local_heads is {got}, expected {heads // world}")
    first = rank * kv_heads // world
    past = "a slice past the checkpoint's KV heads: rank r's first KV head is r * num_kv_heads // tp"
    for i, (w, name) in enumerate(((q, "q"), (k, "k"), (v, "v"))):
        _load(layer.weight, w, i, f"{name} (shard {i})", past if i and kv_heads < world else "rows of whole heads")
    kv = slice(first * d, (first + local_kv) * d)
    want = torch.cat([x @ q[_rows(heads * d, rank, world)].T, x @ k[kv].T, x @ v[kv].T], -1)
    check_tensor(layer(x), want, what, **TOL, hint="q split by heads; rank r's KV head(s) start at r * kv_heads // tp")


def check_qkv_heads(rank: int, world: int) -> None:
    _qkv(rank, world, heads=4, kv_heads=2, seed=11)


def check_qkv_replicated(rank: int, world: int) -> None:
    _qkv(rank, world, heads=4, kv_heads=1, seed=12)


def _row(rank: int, world: int, bias: bool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x, w, b = torch.randn(5, 16, generator=g), torch.randn(6, 16, generator=g), torch.randn(6, generator=g)
    b = b if bias else torch.zeros(6)
    layer = _layer("RowParallelLinear")(16, 6, bias=bias)
    cols = "a row-parallel weight is split by its columns (input features): loaded[:, rank*n : (rank+1)*n]"
    _shape(layer.weight, (6, 16 // world), f"rank {rank}: the local row-parallel weight", cols)
    _load(layer.weight, w, None, "the row-parallel weight", cols)
    if bias:
        _load(layer.bias, b, None, "the bias", "every rank holds the whole bias")
    mine = _rows(16, rank, world)
    want = x @ w.T + b
    partial = x[:, mine] @ w[:, mine].T
    got = layer(x[:, mine].contiguous())
    pitfalls = [
        Pitfall(
            "the all-reduce missing (each rank has only its partial product)",
            "all_reduce the partial product",
            lambda: partial + b,
        ),
        Pitfall("the all-reduce done twice", "all_reduce the partial product once", lambda: world * (x @ w.T) + b),
    ]
    if bias:
        pitfalls += [
            Pitfall(
                "the bias added on every rank (before the all-reduce: tp times in the sum)",
                "add the bias once, after the all-reduce",
                lambda: x @ w.T + world * b,
            ),
            Pitfall("the bias never added", "add the bias after the all-reduce", lambda: x @ w.T),
        ]
    check_tensor(got, want, f"rank {rank}: row-parallel{' with bias' if bias else ''}", **TOL, pitfalls=pitfalls)


def check_row(rank: int, world: int) -> None:
    _row(rank, world, bias=False, seed=13)


def check_row_bias(rank: int, world: int) -> None:
    _row(rank, world, bias=True, seed=14)


VOCAB = 11  # does not divide by 2: the last shard is padded


def _embedding(rank: int, world: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(VOCAB, 16, generator=g)
    emb = _layer("VocabParallelEmbedding")(VOCAB, 16)
    local = -(-VOCAB // world)
    fix = "the shard rounded down (vocab // tp: the last ids belong to nobody)? local_vocab = ceil(vocab / tp)"
    _shape(emb.weight, (local, 16), f"rank {rank}: the local embedding table", fix)
    _load(emb.weight, table, None, "the embedding", "rows start : start + local_vocab, clipped to the vocabulary")
    return emb, table, local


def _shards(table: torch.Tensor, world: int, local: int) -> list[torch.Tensor]:
    padded = torch.cat([table, table.new_zeros(local * world - VOCAB, table.shape[1])])
    return list(padded.split(local))


def check_embedding(rank: int, world: int) -> None:
    emb, table, local = _embedding(rank, world, seed=15)
    ids = torch.tensor([0, 3, 5, 6, 10, 2, 5, 9])
    want = F.embedding(ids, table)
    shards = _shards(table, world, local)

    def summed(lookup: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        return sum(lookup(r, s) for r, s in enumerate(shards))

    def masked(r: int, s: torch.Tensor, shift: bool = True, zero: bool = True, low: int = 0) -> torch.Tensor:
        lo = ids - r * local if shift else ids
        inside = (lo >= low) & (lo < local)
        rows = s[torch.where(inside, lo, 0)]
        return rows * inside.unsqueeze(-1) if zero else rows

    pitfalls = [
        Pitfall(
            "ids not shifted to the local range",
            "local row = id - start (start = rank * local_vocab)",
            lambda: summed(lambda r, s: masked(r, s, shift=False)),
        ),
        Pitfall(
            "out-of-range rows not zeroed (another rank's ids read this rank's row 0)",
            "zero the rows of the ids this rank does not own before the all-reduce",
            lambda: summed(lambda r, s: masked(r, s, zero=False)),
        ),
        Pitfall(
            "the first id of each rank's range (id == start) treated as another rank's: its row came out zero",
            "an id is this rank's when 0 <= id - start < local_vocab (>= 0, not > 0)",
            lambda: summed(lambda r, s: masked(r, s, low=1)),
        ),
        Pitfall(
            "the all-reduce missing (each rank has only its own ids' rows)",
            "all_reduce the masked rows",
            lambda: masked(rank, shards[rank]),
        ),
        Pitfall("the all-reduce done twice", "all_reduce once", lambda: world * want),
    ]
    check_tensor(emb(ids), want, f"rank {rank}: vocab-parallel embedding (vocab {VOCAB})", **TOL, pitfalls=pitfalls)


def check_lm_head(rank: int, world: int) -> None:
    emb, table, local = _embedding(rank, world, seed=16)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(17))
    cls = _layer("ParallelLMHead")
    for tied in (True, False):
        head = cls(VOCAB, 16, tie_to=emb if tied else None)
        if not tied:
            _load(head.weight, table, None, "the LM head", "the embedding's rows: start : start + local_vocab")
        got = head(x)
        what = f"rank {rank}: LM head ({'tied' if tied else 'untied'})"
        if isinstance(got, torch.Tensor) and got.shape[-1] == local:
            raise AssertionError(f"{what}: {local} logits per row, expected {VOCAB}: the logits not gathered")
        if isinstance(got, torch.Tensor) and got.shape[-1] == local * world:
            raise AssertionError(f"{what}: {local * world} logits per row, expected {VOCAB}: the padding not cut")
        check_tensor(got, x @ table.T, what, **TOL, hint="all_gather the local logits along the vocabulary")


CHECKS: dict[str, Callable[[int, int], None]] = {
    "merged_column": check_merged_column,
    "qkv_heads": check_qkv_heads,
    "qkv_replicated": check_qkv_replicated,
    "row": check_row,
    "row_bias": check_row_bias,
    "embedding": check_embedding,
    "lm_head": check_lm_head,
}


def rank_main(rank: int, world: int, init: str, out: str, names: list[str], at_pace: float = 1.0) -> None:
    """A spawned rank: join the group, run ``names`` in order, one JSON line per check to ``out``."""
    torch.set_num_threads(1)
    import minisgl.distributed as dist

    dist.COLLECTIVE_TIMEOUT = timedelta(seconds=GLOO_TIMEOUT_S * at_pace)
    with open(out, "a") as f:
        dist.init_distributed(rank, world, torch.device("cpu"), init)
        for name in names:
            f.write(json.dumps({"start": name, "t": time.time()}) + "\n")
            f.flush()
            try:
                with torch.no_grad():
                    CHECKS[name](rank, world)
                error = None
            except AssertionError as e:
                error = str(e)
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
            f.write(json.dumps({"check": name, "error": error}) + "\n")
            f.flush()
    dist.destroy_distributed()


# ---- the grading side ------------------------------------------------------------------------------------
def _read(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            break  # a rank killed mid-write
    return out


def _spawn_once(names: list[str], world: int, folder: Path) -> dict[str, str | None]:
    """One spawn of ``world`` ranks running ``names``; the verdicts of the checks every rank finished,
    and of the one a rank hung or died in (the rest are left for the next spawn)."""
    import torch.multiprocessing as mp

    from minisgl.process import free_port

    ctx = mp.get_context("spawn")
    at_pace = pace.current()
    gloo_s, start_s, check_s = (x * at_pace for x in (GLOO_TIMEOUT_S, START_S, CHECK_S))
    init = f"tcp://127.0.0.1:{free_port()}"
    files = [folder / f"rank{r}-{time.monotonic_ns()}.jsonl" for r in range(world)]
    procs = [
        ctx.Process(target=rank_main, args=(r, world, init, str(f), names, at_pace), daemon=True)
        for r, f in enumerate(files)
    ]
    for p in procs:
        p.start()
    started, first_exit = time.monotonic(), None
    try:
        while any(p.is_alive() for p in procs):
            logs = [_read(f) for f in files]
            running = [next((x for x in reversed(log) if "start" in x), None) for log in logs]
            if first_exit is None and not all(p.is_alive() for p in procs):
                first_exit = time.monotonic()
            if first_exit is not None and time.monotonic() - first_exit > gloo_s + 2:
                break  # a rank left; the others' collectives fail within gloo's timeout, or they hang
            if all(r is None for r in running) and time.monotonic() - started > start_s:
                break
            if any(r is not None and time.time() - r["t"] > check_s for r in running):
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5)
    logs = [_read(f) for f in files]
    done = [{x["check"]: x["error"] for x in log if "check" in x} for log in logs]
    verdicts: dict[str, str | None] = {}
    for name in names:
        errors = sorted((d[name] for d in done if d.get(name) is not None), key=_is_comm_error)
        if all(name in d for d in done):
            verdicts[name] = _explain_comm(errors[0]) if errors else None
            continue
        # the first check not finished on every rank: a rank hung, crashed or exited in it
        if not any(any(x.get("start") == name for x in log) for log in logs):
            verdicts[name] = (
                f"the {world} ranks did not start within {start_s:.0f} s (does the lab file run code at import?)"
            )
            break
        parts = []
        for r, (p, d) in enumerate(zip(procs, done)):
            if name in d:
                continue
            if p.exitcode in (None, -9):
                parts.append(f"rank {r} hung in this check and was stopped after {check_s:.0f} s")
            elif p.exitcode >= 0:
                parts.append(
                    f"rank {r} exited (code {p.exitcode}) in this check: does your code call sys.exit / os._exit?"
                )
            else:
                parts.append(f"rank {r} crashed (signal {-p.exitcode}) in this check")
        others = f" (the other rank: {errors[0][:200]})" if errors and not _is_comm_error(errors[0]) else ""
        verdicts[name] = "; ".join(parts) + others + f". {COLLECTIVES}"
        break
    return verdicts


COLLECTIVES = (
    "Every rank must call the same collectives (all_reduce / all_gather) in the same order, with tensors of the "
    "same shape: a rank that skips one leaves the others waiting"
)


def _is_comm_error(error: str) -> bool:
    return "gloo" in error or "Connection" in error or "Timed out" in error


def _explain_comm(error: str) -> str:
    return f"{error[:300]}\n{COLLECTIVES}" if _is_comm_error(error) else error


def run_checks(names: list[str] | None = None, world: int = WORLD) -> dict[str, str | None]:
    """Every check's verdict (``None``: passed on every rank)."""
    left = list(names or CHECKS)
    verdicts: dict[str, str | None] = {}
    with tempfile.TemporaryDirectory(prefix="minisgl-lab10-") as tmp:
        budget = pace.scaled(BUDGET_S)
        deadline = time.monotonic() + budget
        while left:
            if time.monotonic() > deadline:
                verdicts.update({n: f"not run: the checks before it hung for {budget:.0f} s in all" for n in left})
                break
            got = _spawn_once(left, world, Path(tmp))
            verdicts.update(got)
            if not got:  # nothing could run: report it for every check left
                verdicts.update({n: "the ranks could not run this check" for n in left})
            left = [n for n in left if n not in verdicts]
    return verdicts


def cached_checks(lab_file: Path) -> dict[str, str | None]:
    """``run_checks()`` once per grading process and content of ``lab_file`` (and of this module):
    the tests of one run each read it, the first pays for the spawn."""
    digest = hashlib.sha256(lab_file.read_bytes() + Path(__file__).read_bytes()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"minisgl-lab10-{os.getppid()}-{digest}.json"
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        pass
    verdicts = run_checks()
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(verdicts))
    tmp.replace(path)
    return verdicts
