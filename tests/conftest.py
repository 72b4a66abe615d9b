"""Shared fixtures: tiny random HF models (Llama with rope scaling, Qwen3 with head_dim !=
hidden/heads; built by ``tiny_models.py``) saved once per session, and the embedded model's folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tiny_models import save_tiny_model

# Tests share two cores with servers and notebooks: one intra-op thread each avoids stalls.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def gpu_available() -> bool:
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return save_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory) -> Path:
    return save_tiny_model("qwen3", tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="session", params=["llama", "qwen3"])
def tiny_model(request, tiny_llama, tiny_qwen3) -> Path:
    return tiny_llama if request.param == "llama" else tiny_qwen3


@pytest.fixture(scope="session")
def grading_env(tiny_llama, tiny_qwen3) -> dict:
    """The environment of a grading subprocess: the session's tiny models, one thread each."""
    return {
        **os.environ,
        "MINISGL_AUTOGRADER_TINY_LLAMA": str(tiny_llama),
        "MINISGL_AUTOGRADER_TINY_QWEN3": str(tiny_qwen3),
        "OMP_NUM_THREADS": "1",
    }


@pytest.fixture(scope="session")
def _cpu_libraries():
    """Every level's library built at once (they compile side by side: ~2x faster on 2 cores)."""
    import threading

    from minisgl.kernels import jit

    builds = [threading.Thread(target=jit.cpu_module, args=(level,)) for level in jit.cpu_isas()]
    for b in builds:
        b.start()
    for b in builds:
        b.join()


def _cpu_isa_levels() -> tuple[str, ...]:
    from minisgl.kernels import jit

    return jit.cpu_isas()


@pytest.fixture(params=_cpu_isa_levels())
def cpu_isa(request, monkeypatch, _cpu_libraries) -> str:
    """Each instruction-set level of the C++ CPU kernels this CPU runs (minisgl/kernels/jit.py), chosen as
    MINISGL_CPU_ISA chooses it: an AVX-512 machine tests its AVX2 and portable code too."""
    from minisgl.env import ENV
    from minisgl.kernels import jit

    monkeypatch.setattr(ENV, "cpu_isa", request.param)
    assert jit.cpu_module() is not None, "the C++ kernels did not build (is a C++ compiler installed?)"
    assert jit.cpu_module().isa() == request.param
    return request.param


@pytest.fixture(scope="session")
def embedded_path() -> Path:
    from minisgl.models.embedded import embedded_model_path

    return embedded_model_path()


def pytest_configure(config):
    # the slowest tests at the end of a run of tests/ (where CI's 45 minutes go), unless asked otherwise
    if config.option.durations is None:
        config.option.durations = 25


_COLLECTED_AT = [0.0]  # resident GiB of this process after its last full collection


@pytest.fixture(autouse=True)
def _collectable_engines():
    """An engine freezes what it built out of the garbage collector's reach (``Engine.__init__``); an LLM
    gives it back when dropped, but its reference cycles then wait for a full collection (the embedded
    model's parity tests kept 1.5 GB each). Once the process has grown by half a GiB since the last one,
    a full collection runs after the test; not after every test that built an engine: a full collection
    of this process takes a few tenths of a second, and hundreds of tests build one."""
    yield
    if _rss_gb() - _COLLECTED_AT[0] > 0.5:
        import gc

        gc.unfreeze()
        gc.collect()
        _COLLECTED_AT[0] = _rss_gb()


_RSS: list[tuple[float, str]] = []  # (resident GB of this process after the test, test id)


def _rss_gb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**30


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid, location):
    _RSS.append((_rss_gb(), nodeid))
    if os.environ.get("MINISGL_TEST_RSS_LOG"):
        with open(os.environ["MINISGL_TEST_RSS_LOG"], "a") as f:
            f.write(f"{_RSS[-1][0]:.3f} {os.getpid()} {nodeid}\n")


def pytest_terminal_summary(terminalreporter):
    """Each lesson's run time (test_notebooks records it), so a plain CI log shows the budget held; and
    the peak resident memory of this process (the README promises the suite fits a laptop)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    if _RSS:
        top = max(_RSS)
        terminalreporter.write_sep("=", "memory")
        terminalreporter.write_line(
            f"peak resident memory of the pytest process: {peak:.2f} GiB; largest after a test: {top[0]:.2f} GiB "
            f"({top[1]})"
        )
    rows = [
        (r.nodeid.split("[")[-1].rstrip("]"), *dict(r.user_properties)["lesson_seconds"], r.outcome)
        for reports in terminalreporter.stats.values()
        for r in reports
        if getattr(r, "when", None) == "call" and "lesson_seconds" in dict(getattr(r, "user_properties", []))
    ]
    if rows:
        terminalreporter.write_sep("=", "lesson run times")
        for name, seconds, how, outcome in sorted(rows):
            terminalreporter.write_line(f"{name:<28} {seconds:7.1f} s  ({how}, {outcome})")
