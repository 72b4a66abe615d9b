"""The autograder, graded (instructor-only: it needs solutions/ and tests/mutants/): the solutions
score 100 with the hidden tests, every mutant (tests/mutants/) loses points in the tests it should
with the hint for its pitfall (and in the randomized test of every function a fixed test catches),
correct solutions written another way keep every point, every hidden-test mutant
(tests/mutants/hidden.py) fails the hidden tests it should, a misbehaving submission (infinite loop,
sys.exit, segfault, os._exit, megabytes of prints) loses only those tests, and the Gradescope JSON has
the promised shape. The stubs and the exit codes, which need no solutions, are graded in
test_grading.py (it runs in the student edition too).

All grading runs start together on a pool of two workers (the machine has two cores); the
tests then read their results. The tiny models come from conftest's session fixtures.
"""

from __future__ import annotations

import json
import os
import queue
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from grading import ForkServer, Run, grade, run
from mutants import KINDS, all_equivalents, all_hidden_mutants, all_mutants, lab_modules, randomized_partners
from mutants.isolation import EXPECTED_FAILURES, EXPECTED_PASSES, MEMORY_GIB, MISBEHAVING
from mutants.probes import ROUTES

from autograder import pace
from autograder.__main__ import known_labs

# the first test pays for grading every mutant of every lab (~80 s a lab on 2 cores), past the suite's 900 s
pytestmark = [pytest.mark.instructor, pytest.mark.timeout(3000)]

LABS = sorted(known_labs().values())  # stems: lab01_decoder, ...
LAB_IDS = [stem.split("_")[0] for stem in LABS]  # lab01, ...
# MINISGL_MUTANT_LABS=lab07,lab09 grades only those labs' mutants (while writing them; CI grades all)
_ONLY = [lab for lab in os.environ.get("MINISGL_MUTANT_LABS", "").split(",") if lab]
MUTANTS = [m for m in all_mutants() if not _ONLY or m.lab in _ONLY]
EQUIVALENTS = [m for m in all_equivalents() if not _ONLY or m.lab in _ONLY]
HIDDEN_MUTANTS = [m for m in all_hidden_mutants() if not _ONLY or m.lab in _ONLY]


@pytest.fixture(scope="module")
def runs(grading_env, tmp_path_factory) -> dict[str, Run]:
    tmp = tmp_path_factory.mktemp("grading")
    quick = ["-k", "not embedded"]  # the embedded-model swap-in runs once, for the solutions
    jobs: dict[str, list[str]] = {
        "solutions": ["--impl", "solutions"],
    }
    # visible tests only: the isolation cases are about them (mutants/isolation.py lists them)
    misbehaving = str(MISBEHAVING.write(tmp / "misbehaving"))
    jobs["misbehaving"] = ["lab01", "--impl", misbehaving, "--timeout", "4", "--memory-limit", str(MEMORY_GIB)]
    jobs["misbehaving"] += ["--no-hidden", *quick]
    partners = {module.STEM: module.RANDOMIZED for module in lab_modules()}
    for m in MUTANTS:  # unit tests, and only the engine tests that must fail (each costs seconds)
        selection = m.selection(partners[m.stem])
        jobs[f"mutant:{m.key}"] = [m.lab, "--impl", str(m.write(tmp / m.key)), "-k", selection]
    for m in EQUIVALENTS:
        jobs[f"equivalent:{m.key}"] = [m.lab, "--impl", str(m.write(tmp / m.key)), "-k", "not engine"]
    for m in HIDDEN_MUTANTS:  # only the hidden tests it must fail: a few seconds each
        only = " or ".join(sorted({name.split("[")[0] for name in m.must_fail}))
        jobs[f"hidden:{m.key}"] = [m.lab, "--impl", str(m.write(tmp / f"hidden-{m.key}")), "-k", only]
    direct = [sys.executable, "-m", "pytest", "autograder", "-k", "lab06 and not engine", "--impl", "solutions"]
    direct += ["-q", "-p", "no:cacheprovider"]
    # two labs in one pytest process: lab 08's loop runs the engine's lab 07 policy through the scheduler,
    # which lab 07's tripwires (originality.py) must not count against lab 08
    two = [sys.executable, "-m", "pytest", "autograder", "-k", "(lab07 or lab08) and not engine", "--impl", "solutions"]
    two += ["-q", "-p", "no:cacheprovider"]
    # A mutant's run only needs its failures and their hints: mutant runs share one pace, measured here
    # (twice it, at least 2, for the other run beside each), instead of each measuring its own: a torch
    # import and a calibration in both of its processes, ~2.5 s of ~9 s a run, over ~300 runs. The
    # solutions, the correct variants and the misbehaving lab measure their own, as a student's run does.
    # They fail unshrunk (MINISGL_AG_NO_SHRINK): a mutant's failing random test needs no smallest example.
    shared = {**grading_env, pace.ENV: f"{max(2.0, 2 * pace.measure()):.2f}", "MINISGL_AG_NO_SHRINK": "1"}
    env_of = lambda key: shared if key.startswith(("mutant:", "hidden:")) else grading_env  # noqa: E731
    # The variants' runs go through two warm fork servers (grading.ForkServer: the same command, without
    # each run importing torch, hypothesis and pytest again); the solutions and the misbehaving lab run
    # as students run them, a fresh `python -m autograder`.
    servers: queue.Queue[ForkServer] = queue.Queue()
    for _ in range(2):
        servers.put(ForkServer(grading_env))

    def through_a_server(args: list[str], env: dict, key: str) -> Run:
        server = servers.get()
        try:
            return server.grade(args, env, tmp, key)
        finally:
            servers.put(server)

    try:
        with ThreadPoolExecutor(2) as pool:
            futures = {
                key: pool.submit(through_a_server, args, env_of(key), key)
                if key.startswith(("mutant:", "hidden:", "equivalent:"))
                else pool.submit(grade, args, env_of(key), tmp, key)
                for key, args in jobs.items()
            }
            futures["direct"] = pool.submit(run, direct, grading_env)
            futures["direct-two-labs"] = pool.submit(run, two, grading_env)
            done = {key: f.result() for key, f in futures.items()}
    finally:
        while not servers.empty():
            servers.get().close()
    print("grading runs (s):", {key: round(r.seconds, 1) for key, r in done.items()})
    if os.environ.get("MINISGL_GRADING_LOG"):  # where CI's time goes, run by run (pytest captures the print)
        with open(os.environ["MINISGL_GRADING_LOG"], "w") as f:
            json.dump({key: [round(r.seconds, 2), round(r.cpu_seconds, 2)] for key, r in done.items()}, f)
    return done


# ---- solutions ----------------------------------------------------------------------------
def test_solutions_score_full(runs):
    run = runs["solutions"]
    assert run.results is not None, f"the grader wrote no results.json for the solutions\n{run.explain()}"
    failed = {n: t["output"] for n, t in run.tests().items() if t["status"] != "passed"}
    assert not failed, f"solutions/ must score 100%, but these tests failed: {failed}\n{run.explain()}"
    assert run.results["score"] == run.results["max_score"] == 100 * len(LABS), run.results["score"]
    assert run.returncode == 0, f"everything passed, so the exit code must be 0\n{run.explain()}"
    for stem in LABS:
        assert f"{stem}  (solutions)" in run.stdout, f"no table for {stem} in the output\n{run.explain()}"
    summary = run.stdout.split("\n\n")[0].split("\n")
    assert [line.split()[:2] for line in summary] == [[lab, "100/100"] for lab in LAB_IDS], summary
    hidden = [n for n, t in run.tests().items() if t["visibility"] != "visible"]
    assert {n.split(":")[0] for n in hidden} == set(LAB_IDS), f"every lab has hidden tests, graded here: {hidden}"


# ---- mutants ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.key for m in MUTANTS])
def test_mutant_loses_points(runs, mutant):
    run = runs[f"mutant:{mutant.key}"]
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
    assert first["visibility"] == "visible", (
        f"mutant {mutant.name} ({mutant.why}) must lose visible points first: {mutant.must_fail[0]} is hidden"
    )
    # the report wraps long messages: a hint may straddle a line break
    assert " ".join(mutant.hint.split()) in " ".join(first["output"].split()), (
        f"mutant {mutant.name} ({mutant.why}) fails {mutant.must_fail[0]}, but its message does not name the "
        f"pitfall (expected {mutant.hint!r} in it):\n{first['output']}"
    )
    partners = randomized_partners()
    for name, t in tests.items():  # a probe is graded on its must_fail tests only: one refusal zeroes the lab
        if t["status"] == "failed" and name in partners and not mutant.route:
            assert tests[partners[name]]["status"] == "failed", (
                f"mutant {mutant.name} ({mutant.why}) fails {name} but collects the points of the randomized "
                f"{partners[name]}: its random inputs never exercise this bug\n{run.explain()}"
            )
    if mutant.kind == "engine_reference":  # the engine's own answer earns nothing, in any test
        assert run.results["score"] == 0, (
            f"mutant {mutant.name} ({mutant.why}) uses the engine's own implementation but scored "
            f"{run.results['score']}: {[n for n, t in tests.items() if t['status'] == 'passed']}"
        )
        assert re.search(rf"\b{mutant.stem}\.py:\d+", first["output"]), (
            f"mutant {mutant.name} ({mutant.why}) is refused, but its message does not say where (file:line):\n"
            f"{first['output']}"
        )
    assert run.returncode == 1


def test_every_route_to_the_engine_has_a_probe():
    """Each way a lab could take the engine's (or the grader's) answer (probes.ROUTES) is tried by a probe
    that must score 0 (test_mutant_loses_points)."""
    tried = {m.route for m in all_mutants() if m.route}
    assert tried <= set(ROUTES), sorted(tried - set(ROUTES))
    assert set(ROUTES) <= tried, f"routes without a probe: {sorted(set(ROUTES) - tried)}"


def test_mutants_are_named_once_per_lab():
    """A grading run is keyed by lab and name: two mutants of one lab with one name would share it (a
    hidden-test mutant may repeat a visible one's name: it is graded in a run of its own kind)."""
    for group in (all_mutants(), all_hidden_mutants(), all_equivalents()):
        keys = [m.key for m in group]
        assert len(keys) == len(set(keys)), sorted({k for k in keys if keys.count(k) > 1})


def test_every_lab_has_a_mutant_of_each_kind():
    """Every class of hole a careful student finds (mutants.KINDS) has a mutant in every lab where it
    can occur; where it cannot, the lab's mutant module says why."""
    problems = []
    for module in lab_modules():
        have = {m.kind for m in module.MUTANTS}
        skipped = getattr(module, "NOT_APPLICABLE", {})
        for kind in KINDS:
            if kind in have and kind in skipped:
                problems.append(f"{module.STEM}: has a {kind} mutant but says the kind cannot occur")
            elif kind not in have and not (isinstance(skipped.get(kind), str) and len(skipped[kind]) > 20):
                problems.append(f"{module.STEM}: no {kind} mutant ({KINDS[kind]}) and no reason why not")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("mutant", HIDDEN_MUTANTS, ids=[m.key for m in HIDDEN_MUTANTS])
def test_hidden_tests_catch_their_mutant(runs, mutant):
    run = runs[f"hidden:{mutant.key}"]
    assert run.results is not None, f"the grader wrote no results.json for mutant {mutant.name}\n{run.explain()}"
    tests = run.tests()
    for name in mutant.must_fail:
        t = tests.get(f"{mutant.lab}: {name}")
        assert t is not None and t["visibility"] == "after_due_date", f"{name} is not a hidden test: {sorted(tests)}"
        assert t["status"] == "failed", f"mutant {mutant.name} ({mutant.why}) passes {name}\n{run.explain()}"


@pytest.mark.parametrize("equivalent", EQUIVALENTS, ids=[m.key for m in EQUIVALENTS])
def test_correct_variants_keep_every_point(runs, equivalent):
    """The strict checks (bit for bit in bfloat16, exact eviction order) accept other correct code."""
    run = runs[f"equivalent:{equivalent.key}"]
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


# ---- output format --------------------------------------------------------------------
def test_gradescope_json_shape(runs):
    data = runs["solutions"].results
    assert set(data) >= {"score", "max_score", "execution_time", "tests"}, sorted(data)
    assert isinstance(data["execution_time"], float) and data["execution_time"] > 0
    assert data["tests"], "no tests in results.json"
    for t in data["tests"]:
        assert set(t) >= {"name", "score", "max_score", "status", "output", "visibility"}, t
        assert t["status"] in ("passed", "failed") and t["visibility"] in ("visible", "after_due_date"), t
        assert isinstance(t["name"], str) and t["name"].split(":")[0] in LAB_IDS, t["name"]
        assert 0 <= t["score"] <= t["max_score"]
    assert sum(t["score"] for t in data["tests"]) == data["score"]
    # what a student sees before the due date (the top-level output) never names a hidden test, and the
    # grader's stdout, which does, is for the staff
    hidden = [t["name"].split(": ")[1] for t in data["tests"] if t["visibility"] != "visible"]
    assert hidden and data["stdout_visibility"] == "hidden", (hidden, data["stdout_visibility"])
    assert not [n for n in hidden if n in data["output"]], data["output"]
    assert f"hidden tests worth {10 * len(LABS)} points" in data["output"], data["output"][-500:]


def test_points_total_100_per_lab(runs):
    per_lab: dict[tuple[str, bool], float] = {}
    for t in runs["solutions"].results["tests"]:
        key = (t["name"].split(":")[0], t["visibility"] == "visible")
        per_lab[key] = per_lab.get(key, 0) + t["max_score"]
    want = {(lab, visible): 90 if visible else 10 for lab in LAB_IDS for visible in (True, False)}
    assert per_lab == want, f"points per (lab, visible): {per_lab}; a lab is 90 visible + 10 hidden"


def test_students_can_run_pytest_directly(runs):
    run = runs["direct"]
    assert run.returncode == 0, f"`pytest autograder -k lab06 --impl solutions` should pass\n{run.explain()}"
    # 11 visible tests and 4 hidden ones (the instructor's edition collects autograder/hidden/ too)
    assert "lab06_radix_cache" in run.stdout and "15/15 tests passed" in run.stdout, run.explain()


def test_two_labs_in_one_pytest_run_keep_their_points(runs):
    run = runs["direct-two-labs"]
    assert run.returncode == 0, f"`pytest autograder -k 'lab07 or lab08'` on the solutions must pass\n{run.explain()}"


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
