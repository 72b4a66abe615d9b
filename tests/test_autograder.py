"""The autograder, graded: the solutions score 100, the untouched stubs score 0 (quickly), every
mutant (tests/mutants/) loses points in the tests it should with the hint for its pitfall (and in
the randomized test of every function a fixed test catches), correct solutions written another way
keep every point, a misbehaving submission (infinite loop, sys.exit, segfault, os._exit, megabytes
of prints) loses only those tests, and the command line's exit codes and Gradescope JSON have the
promised shape.

All grading runs start together on a pool of two workers (the machine has two cores); the
tests then read their results. The tiny models come from conftest's session fixtures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from mutants import all_equivalents, all_mutants, randomized_partners
from mutants.isolation import EXPECTED_FAILURES, EXPECTED_PASSES, MISBEHAVING

REPO = Path(__file__).resolve().parent.parent
LABS = ("lab01_decoder", "lab06_radix_cache")
MUTANTS = all_mutants()
EQUIVALENTS = all_equivalents()


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    results: dict | None  # the --json file

    def tests(self) -> dict[str, dict]:
        return {t["name"]: t for t in self.results["tests"]}

    def explain(self) -> str:
        out, err = self.stdout[-6000:], self.stderr[-3000:]
        return f"exit code {self.returncode}\n--- stdout ---\n{out}\n--- stderr ---\n{err}"


def _run(cmd: list[str], env: dict, json_path: Path | None) -> Run:
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    results = json.loads(json_path.read_text()) if json_path is not None and json_path.exists() else None
    return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start, results)


def grade(args: list[str], env: dict, tmp: Path, key: str) -> Run:
    path = tmp / f"{key.replace(':', '_')}.json"
    return _run([sys.executable, "-m", "autograder", *args, "--json", str(path)], env, path)


@pytest.fixture(scope="module")
def env(tiny_llama, tiny_qwen3) -> dict:
    return {
        **os.environ,
        "MINISGL_AUTOGRADER_TINY_LLAMA": str(tiny_llama),
        "MINISGL_AUTOGRADER_TINY_QWEN3": str(tiny_qwen3),
        "OMP_NUM_THREADS": "1",
    }


@pytest.fixture(scope="module")
def runs(env, tmp_path_factory) -> dict[str, Run]:
    tmp = tmp_path_factory.mktemp("grading")
    quick = ["-k", "not embedded"]  # the embedded-model swap-in runs once, for the solutions
    jobs: dict[str, list[str]] = {
        "solutions": ["--impl", "solutions"],
        "stubs": [],
        "misbehaving": ["lab01", "--impl", str(MISBEHAVING.write(tmp / "misbehaving")), "--timeout", "4", *quick],
    }
    for m in MUTANTS:  # unit tests, and only the engine tests that must fail (each costs seconds)
        jobs[f"mutant:{m.name}"] = [m.lab, "--impl", str(m.write(tmp / m.name)), "-k", m.selection()]
    for m in EQUIVALENTS:
        jobs[f"equivalent:{m.name}"] = [m.lab, "--impl", str(m.write(tmp / m.name)), "-k", "not engine"]
    direct = [sys.executable, "-m", "pytest", "autograder", "-k", "lab06 and not engine", "--impl", "solutions"]
    direct += ["-q", "-p", "no:cacheprovider"]
    with ThreadPoolExecutor(2) as pool:
        futures = {key: pool.submit(grade, args, env, tmp, key) for key, args in jobs.items()}
        futures["direct"] = pool.submit(_run, direct, env, None)
        done = {key: f.result() for key, f in futures.items()}
    print("grading runs (s):", {key: round(r.seconds, 1) for key, r in done.items()})
    return done


# ---- solutions and stubs ----------------------------------------------------------------------------
def test_solutions_score_full(runs):
    run = runs["solutions"]
    assert run.results is not None, f"the grader wrote no results.json for the solutions\n{run.explain()}"
    failed = {n: t["message"] for n, t in run.tests().items() if t["status"] != "passed"}
    assert not failed, f"solutions/ must score 100%, but these tests failed: {failed}\n{run.explain()}"
    assert run.results["score"] == run.results["max_score"] == 100 * len(LABS), run.results["score"]
    assert run.returncode == 0, f"everything passed, so the exit code must be 0\n{run.explain()}"
    for stem in LABS:
        assert f"{stem}  (solutions)" in run.stdout, f"no table for {stem} in the output\n{run.explain()}"


def test_stubs_score_zero_and_finish_quickly(runs):
    run = runs["stubs"]
    assert run.results is not None, f"the grader wrote no results.json for labs/\n{run.explain()}"
    passing = [n for n, t in run.tests().items() if t["status"] == "passed"]
    assert not passing, f"untouched stubs must score 0, but these tests pass on labs/: {passing}"
    not_stub = {n: t["output"] for n, t in run.tests().items() if "not implemented yet" not in t["output"]}
    assert not not_stub, f"every stub failure should say 'not implemented yet' (the student's hint): {not_stub}"
    assert run.returncode == 1, f"failed tests must give exit code 1\n{run.explain()}"
    assert run.seconds < 90, f"grading the stubs took {run.seconds:.0f} s; a stub must fail fast (hypothesis search?)"
    assert "every lab starts red" in run.stdout


# ---- mutants ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_loses_points(runs, mutant):
    run = runs[f"mutant:{mutant.name}"]
    assert run.results is not None, f"the grader wrote no results.json for mutant {mutant.name}\n{run.explain()}"
    tests = run.tests()
    assert run.results["score"] < run.results["max_score"], (
        f"mutant {mutant.name} ({mutant.why}) scored full marks: the lab's tests do not notice this bug"
    )
    for name in mutant.must_fail:
        t = tests[f"{mutant.lab}: {name}"]
        assert t["status"] == "failed", (
            f"mutant {mutant.name} ({mutant.why}) passes {name}, which should catch it\n{run.explain()}"
        )
    first = tests[f"{mutant.lab}: {mutant.must_fail[0]}"]
    assert mutant.hint in first["output"], (
        f"mutant {mutant.name} ({mutant.why}) fails {mutant.must_fail[0]}, but its message does not name the "
        f"pitfall (expected {mutant.hint!r} in it):\n{first['output']}"
    )
    partners = randomized_partners()
    for name, t in tests.items():
        if t["status"] == "failed" and name in partners:
            assert tests[partners[name]]["status"] == "failed", (
                f"mutant {mutant.name} ({mutant.why}) fails {name} but collects the points of the randomized "
                f"{partners[name]}: its random inputs never exercise this bug\n{run.explain()}"
            )
    assert run.returncode == 1


@pytest.mark.parametrize("equivalent", EQUIVALENTS, ids=[m.name for m in EQUIVALENTS])
def test_correct_variants_keep_every_point(runs, equivalent):
    """The strict checks (bit for bit in bfloat16, exact eviction order) accept other correct code."""
    run = runs[f"equivalent:{equivalent.name}"]
    assert run.results is not None, f"the grader wrote no results.json for {equivalent.name}\n{run.explain()}"
    failed = {n: t["output"] for n, t in run.tests().items() if t["status"] != "passed"}
    assert not failed, f"{equivalent.name}, a correct solution written differently, lost points: {failed}"


# ---- isolation ---------------------------------------------------------------------------------------
def test_misbehaving_submission_is_contained(runs):
    run = runs["misbehaving"]
    assert run.results is not None, f"grading a misbehaving submission must still complete\n{run.explain()}"
    tests = run.tests()
    for name, phrase in EXPECTED_FAILURES.items():
        t = tests[f"lab01: {name}"]
        assert t["status"] == "failed" and t["score"] == 0, f"{name} should get 0 points: {t}"
        assert phrase in t["output"], f"{name}: the message should say {phrase!r} so the student knows why: {t}"
    for name in EXPECTED_PASSES:
        t = tests[f"lab01: {name}"]
        assert t["status"] == "passed", f"{name} (a correct function) must still pass next to broken ones: {t}"
    assert run.results["score"] == sum(tests[f"lab01: {n}"]["max_score"] for n in EXPECTED_PASSES)
    assert run.returncode == 1
    assert len(run.stdout) < 50_000, "a submission's megabytes of prints must not reach the grader's output"
    assert run.seconds < 120, f"grading took {run.seconds:.0f} s: a timeout did not stop a test in time"


# ---- output format and exit codes --------------------------------------------------------------------
def test_gradescope_json_shape(runs):
    data = runs["solutions"].results
    assert set(data) >= {"score", "max_score", "execution_time", "tests"}, sorted(data)
    assert isinstance(data["execution_time"], float) and data["execution_time"] > 0
    assert data["tests"], "no tests in results.json"
    for t in data["tests"]:
        assert set(t) >= {"name", "score", "max_score", "status", "output", "visibility"}, t
        assert t["status"] in ("passed", "failed") and t["visibility"] == "visible"
        assert isinstance(t["name"], str) and t["name"].split(":")[0] in ("lab01", "lab06"), t["name"]
        assert 0 <= t["score"] <= t["max_score"]
    assert sum(t["score"] for t in data["tests"]) == data["score"]
    stubs = runs["stubs"].results
    assert all(t["status"] == "failed" and t["score"] == 0 and t["output"] for t in stubs["tests"])


def test_points_total_100_per_lab(runs):
    for key in ("solutions", "stubs"):
        per_lab: dict[str, float] = {}
        for t in runs[key].results["tests"]:
            lab = t["name"].split(":")[0]
            per_lab[lab] = per_lab.get(lab, 0) + t["max_score"]
        assert per_lab == {"lab01": 100, "lab06": 100}, f"{key}: points per lab {per_lab}"


def test_grader_errors_exit_2(env, tmp_path):
    unknown = _run([sys.executable, "-m", "autograder", "lab99"], env, None)
    assert unknown.returncode == 2 and "unknown lab" in unknown.stderr, unknown.explain()
    missing = _run([sys.executable, "-m", "autograder", "--impl", str(tmp_path / "nowhere")], env, None)
    assert missing.returncode == 2 and "not a folder" in missing.stderr, missing.explain()
    empty = _run([sys.executable, "-m", "autograder", "--impl", str(tmp_path)], env, None)
    assert empty.returncode == 2 and "no lab files" in empty.stderr, empty.explain()


def test_students_can_run_pytest_directly(runs):
    run = runs["direct"]
    assert run.returncode == 0, f"`pytest autograder -k lab06 --impl solutions` should pass\n{run.explain()}"
    assert "lab06_radix_cache" in run.stdout and "11/11 tests passed" in run.stdout, run.explain()


def test_standalone_tiny_models(tmp_path, monkeypatch):
    """Outside this test suite the grader builds its own tiny models into a cache folder."""
    from autograder import models
    from minisgl.models.config import ModelConfig

    monkeypatch.setenv("MINISGL_AUTOGRADER_CACHE", str(tmp_path))
    for kind in ("llama", "qwen3"):
        monkeypatch.delenv(f"MINISGL_AUTOGRADER_TINY_{kind.upper()}", raising=False)
    llama, qwen3 = models.tiny_model("llama"), models.tiny_model("qwen3")
    assert llama.parent == tmp_path and (llama / ".complete").exists() and (llama / "tokenizer.json").exists()
    assert models.tiny_model("llama") == llama, "a built model must be reused, not rebuilt"
    cfg_l, cfg_q = ModelConfig.from_path(llama), ModelConfig.from_path(qwen3)
    assert cfg_l.rope_scaling is not None and cfg_l.num_kv_heads < cfg_l.num_heads, cfg_l
    assert cfg_q.qk_norm and cfg_q.head_dim != cfg_q.hidden_size // cfg_q.num_heads, cfg_q
