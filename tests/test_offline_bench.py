"""The offline benchmark times every run from an empty prefix cache: neither the warm-up nor an
earlier repeat may hand the timed run cached prompts."""

from __future__ import annotations

import pytest

from minisgl import LLM, SamplingParams
from minisgl.benchmark.offline import main, make_workload


def test_flush_forgets_cached_prefixes_and_keeps_accounting(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", debug_checks=True, num_pages=512)
    prompt, params = list(range(10, 90)), SamplingParams(max_tokens=3)
    llm.generate([prompt], params, use_tqdm=False)
    assert llm.generate([prompt], params, use_tqdm=False)[0].cached_tokens > 0
    llm.scheduler.cache.flush()
    llm.scheduler.check_memory()
    assert llm.scheduler.cache.cache.evictable_size == 0
    assert llm.scheduler.cache.allocator.num_free == llm.scheduler.engine.num_pages
    assert llm.generate([prompt], params, use_tqdm=False)[0].cached_tokens == 0


def test_repeats_start_from_an_empty_cache(tiny_llama, tmp_path):
    args = ["--model", str(tiny_llama), "--workload", "shared", "--num-requests", "4", "--quiet"]
    args += ["--max-prefill-length", "128", "--json", str(tmp_path / "r.json")]
    once = main(args + ["--repeats", "1"])
    twice = main(args + ["--repeats", "2"])
    assert len(once["seconds_all"]) == 1 and len(twice["seconds_all"]) == 2
    assert sorted(twice["seconds_all"])[0] <= twice["seconds"] <= sorted(twice["seconds_all"])[-1]
    # the second repeat computed the shared 512-token prefix again, exactly like a single run
    assert twice["prefill_tokens"] == once["prefill_tokens"] >= 512
    assert twice["output_tokens"] == once["output_tokens"] == 4 * 32


def test_repeats_below_one_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--repeats", "0"])
    assert "--repeats must be at least 1" in capsys.readouterr().err


def test_step_times_account_for_every_batch(tiny_llama, capsys):
    n = 6
    args = ["--model", str(tiny_llama), "--workload", "cpu", "--num-requests", str(n), "--quiet"]
    res = main(args + ["--max-prefill-length", "128", "--step-times"])
    st = res["step_times"]
    assert st["prefill"]["tokens"] == res["prefill_tokens"] > 128  # several prefill batches
    # a request's first token is sampled by its (last) prefill batch, every other one by a decode batch
    assert sum(r["tokens"] for k, r in st.items() if k.startswith("decode")) == res["output_tokens"] - n
    longest = max(p.max_tokens for p in make_workload("cpu", n).params)
    assert st["decode <= 16"]["batches"] >= longest - 1  # the longest request decodes max_tokens - 1 times
    assert all(r["busy_s"] > 0 and r["gap_s"] >= 0 for r in st.values())
    assert "decode <= 16:" in capsys.readouterr().out


def test_tp2_gives_the_tp1_tokens_and_records_the_size(tiny_llama, tmp_path):
    args = ["--model", str(tiny_llama), "--workload", "shared", "--num-requests", "3", "--quiet", "--dtype", "float32"]
    args += ["--max-prefill-length", "128", "--json", str(tmp_path / "r.json")]
    one, two = main(args), main(args + ["--tp", "2"])
    assert (one["tp"], two["tp"]) == (1, 2)
    assert two["output_tokens"] == one["output_tokens"] == 3 * 32 and two["prefill_tokens"] == one["prefill_tokens"]


def test_tp_with_the_hf_engine_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--engine", "hf", "--tp", "2"])
    assert "--tp applies to minisgl only" in capsys.readouterr().err


def test_profile_prefill_reports_a_batch_and_its_ops(tiny_llama, capsys):
    from minisgl.benchmark import profile

    # 120 tokens: past the 64 rows that the CPU's own linear kernel takes, so torch's matmul runs
    args = ["--model", str(tiny_llama), "--prefill", "--batch-size", "3", "--prompt-len", "40"]
    profile.main(args + ["--profile-steps", "2"])
    out = capsys.readouterr().out
    assert "prefill: 3 prompts of 40 tokens:" in out and "ms wall" in out
    assert "aten::mm" in out  # the profiled batches ran the model's matmuls
