"""The flags of ``python -m minisgl --dp N``: data-parallel replicas behind sglang-router, started by
``minisgl/server/ops/dp.py``."""

from __future__ import annotations

import argparse

POLICIES = ("cache_aware", "round_robin", "random")  # sglang-router's that need nothing more of a worker


def add_dp_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("data-parallel replicas behind sglang-router (pip install 'minisgl[router]')")
    g.add_argument(
        "--dp",
        "--dp-size",
        "--data-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="serve N replicas of the engine (each with every engine flag given here) on 127.0.0.1, ports "
        "--port+1 .. --port+N, behind SGLang's router on --host:--port (default 1: no router)",
    )
    g.add_argument(
        "--router-policy",
        default="cache_aware",
        choices=POLICIES,
        help="how the router picks a replica: cache_aware (the one whose prefix cache most likely holds the "
        "prompt's prefix, unless the load is unbalanced), round_robin or random (default %(default)s)",
    )
    g.add_argument(
        "--worker-urls",
        nargs="*",  # "*", not "+": a replica's command line ends with an empty --worker-urls
        default=[],
        metavar="URL",
        help="more replicas the router routes to, already running elsewhere (python -m minisgl --host 0.0.0.0 "
        "on other hosts); with --dp 0 the router alone runs here",
    )


def check_dp_args(ap: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    if ns.dp < 0:
        ap.error(f"--dp must be >= 0, got {ns.dp}")
    if ns.dp == 0 and not ns.worker_urls:
        ap.error("--dp 0 runs the router alone: give the replicas' --worker-urls")
    routed = ns.dp != 1 or bool(ns.worker_urls)
    if routed and ns.shell:
        ap.error("--shell chats with one in-process engine; it does not take --dp or --worker-urls")
    if routed and ns.nnodes > 1:
        ap.error("--dp replicates a server of one node; start multi-node replicas alone and give --worker-urls")
    for url in ns.worker_urls:
        if not url.startswith(("http://", "https://")):
            ap.error(f"--worker-urls: {url!r} is not an http:// or https:// URL")
