"""The online benchmark against a live server: it completes every request and reports TTFT,
TPOT/ITL, E2E and throughput that are consistent with each other."""

from __future__ import annotations

import json
import math

import pytest
from server_utils import ServerProcess

from minisgl.benchmark.online import main, percentiles


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    s = ServerProcess(["--model", str(tiny_llama)], tmp_path_factory.mktemp("server-bench"), api_key="k")
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def test_poisson_run_reports_metrics(server, tmp_path, capsys):
    out_json, out_png = tmp_path / "runs.json", tmp_path / "plot.png"
    args = ["--base-url", f"{server.url}/v1", "--api-key", "k", "--num-requests", "8", "--request-rate", "20"]
    args += ["--input-len", "32", "--output-len", "12", "--range-ratio", "0.5", "--json", str(out_json)]
    res = main(args + ["--plot", str(out_png)])
    printed = capsys.readouterr().out
    for name in ("TTFT", "TPOT", "ITL", "E2E", "throughput"):
        assert name in printed
    assert res["completed"] == 8 and res["failed"] == 0, res["errors"]
    assert 8 * 6 <= res["output_tokens"] <= 8 * 12  # ignore_eos: each asked for 6..12 tokens
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        p = res[key]
        assert 0 < p["p50"] <= p["p90"] <= p["p99"] and p["mean"] > 0, (key, p)
    assert res["ttft_s"]["mean"] < res["e2e_s"]["mean"]  # tokens are streamed, not sent at the end
    assert res["output_throughput"] == pytest.approx(res["output_tokens"] / res["duration_s"])
    assert json.loads(out_json.read_text())[-1]["completed"] == 8
    assert out_png.stat().st_size > 10_000


def test_concurrency_run_on_chat(server):
    args = ["--base-url", f"{server.url}/v1", "--api-key", "k", "--api", "chat", "--num-requests", "6"]
    res = main(args + ["--max-concurrency", "2", "--input-len", "8", "--output-len", "8"])
    assert res["completed"] == 6 and res["output_tokens"] == 6 * 8


def test_failures_are_reported_not_raised(server):
    res = main(["--base-url", f"{server.url}/v1", "--api-key", "wrong", "--model", "m", "--num-requests", "2"])
    assert res["completed"] == 0 and res["failed"] == 2 and "401" in res["errors"][0]


def test_percentiles():
    p = percentiles([1.0, 2.0, 3.0, 4.0, math.nan])
    assert p["mean"] == 2.5 and p["p50"] == 2.5 and p["p90"] == pytest.approx(3.7)
