"""What one all-reduce costs at the shapes a decode step sends: ``[batch, hidden]`` in bf16.

    python -m minisgl.benchmark.allreduce --tp 2 --hidden 5120 --batch-size 1,64,256

Starts ``--tp`` ranks on this host's GPUs, joins them through ``minisgl.distributed`` (the
engine's communicator), and times ``--calls`` back-to-back all-reduces per shape, both launched
one by one and replayed from one CUDA graph (as the engine's decode steps run them). Prints µs per
all-reduce and the bus bandwidth, ``2 (n - 1) / n × bytes / time`` (NCCL's convention).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.multiprocessing as mp

from minisgl.process import free_port


def rank_main(rank: int, args: argparse.Namespace, init: str) -> None:
    from minisgl import distributed as D

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    D.init_distributed(rank, args.tp, device, init, communicator=args.communicator)
    n = args.tp
    for bs in [int(b) for b in args.batch_size.split(",")]:
        x = torch.full((bs, args.hidden), rank + 1.0, dtype=torch.bfloat16, device=device)
        got = D.all_reduce(x.clone())
        if not torch.equal(got, torch.full_like(x, n * (n + 1) / 2)):
            raise RuntimeError(f"rank {rank}: the all-reduce of [{bs}, {args.hidden}] is wrong")

        def burst(x: torch.Tensor = x) -> None:
            for _ in range(args.calls):
                D.all_reduce(x)

        for _ in range(3):
            burst()
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                burst()
        torch.cuda.synchronize()
        times = {}
        for name, fn in (("eager", burst), ("graph", graph.replay)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            fn()
            torch.cuda.synchronize()
            start.record()
            for _ in range(args.repeats):
                fn()
            end.record()
            torch.cuda.synchronize()
            times[name] = start.elapsed_time(end) * 1e3 / (args.repeats * args.calls)  # µs per all-reduce
        if rank == 0:
            nbytes = x.numel() * x.element_size()
            bus = {k: 2 * (n - 1) / n * nbytes / (t * 1e-6) / 1e9 for k, t in times.items()}
            print(
                f"tp {n}, [{bs}, {args.hidden}] bf16 ({nbytes / 1e6:.2f} MB): "
                f"eager {times['eager']:.1f} µs ({bus['eager']:.0f} GB/s), "
                f"graph {times['graph']:.1f} µs ({bus['graph']:.0f} GB/s)",
                flush=True,
            )
    D.destroy_distributed()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=5120, help="Qwen3-14B: 5120")
    ap.add_argument("--batch-size", default="1,64,256")
    ap.add_argument("--calls", type=int, default=80, help="all-reduces per burst (a 40-layer model sends 80)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--communicator", default="default")
    args = ap.parse_args(argv)
    if torch.cuda.device_count() < args.tp:
        raise SystemExit(f"--tp {args.tp} needs {args.tp} GPUs, this host has {torch.cuda.device_count()}")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    mp.spawn(rank_main, args=(args, f"tcp://127.0.0.1:{free_port()}"), nprocs=args.tp, join=True)


if __name__ == "__main__":
    main()
