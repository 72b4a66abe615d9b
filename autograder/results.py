"""Collecting results: one record per collected lab test (outcome, message, output, duration,
visibility), written to ``--ag-results PATH`` as JSON for ``python -m autograder`` to turn into
scores, or printed as a score table per lab after a plain ``pytest autograder`` run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autograder.explain import trim
from autograder.points import item_doc, item_points, item_timeout, item_visibility, lab_of, short_name


class Results:
    """Collects one record per test from the reports (registered as a plugin by pytest_configure)."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.collected: list[dict] = []  # metadata of every collected lab test, in order
        self.records: dict[str, dict] = {}  # nodeid -> outcome, message, output, duration
        self.errors: list[str] = []  # collection errors: the grader itself is broken

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            lab = lab_of(item)
            if lab is not None:
                meta = dict(lab=lab[0], stem=lab[1], name=short_name(item), doc=item_doc(item))
                meta.update(points=item_points(item)[0], visibility=item_visibility(item))
                # its time limit: declared for the reference machine, and here (scaled by the pace)
                meta.update(declared_limit=item_points(item)[1], limit=round(item_timeout(item), 3))
                meta.update(engine=item.get_closest_marker("engine") is not None)
                self.collected.append(dict(nodeid=item.nodeid, **meta))
        self._tick(f"collected {len(self.collected)}")

    def _tick(self, line: str) -> None:
        """A line for ``python -m autograder``'s progress report (``--ag-progress``)."""
        path = self.config.getoption("ag_progress")
        if path:
            with open(path, "a") as f:
                f.write(line + "\n")

    def lab_unimplemented(self, stem: str) -> bool:
        """Whether every unit test of ``stem`` graded so far (at least one) raised NotImplementedError."""
        units = [self.records.get(m["nodeid"]) for m in self.collected if m["stem"] == stem and not m["engine"]]
        return bool(units) and all(r is not None and r["message"].startswith("not implemented yet") for r in units)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.errors.append(f"{report.nodeid}: {report.longreprtext[-3000:]}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        rec = self.records.setdefault(report.nodeid, dict(outcome="passed", message="", output="", duration=0.0))
        rec.setdefault("phases", []).append(report.when)
        props = {k: v for k, v in report.user_properties}
        rec["duration"] += report.duration
        if props.get("ag_output"):
            rec["output"] = props["ag_output"]
        if props.get("ag_engine_reference"):
            rec["engine_reference"] = props["ag_engine_reference"]
        if report.failed and rec["outcome"] != "failed":
            rec["outcome"] = "failed"
            rec["message"] = props.get("ag_message") or trim(report.longreprtext or "failed")
        elif report.skipped and rec["outcome"] == "passed":
            rec["outcome"] = "skipped"
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            rec["message"] = f"skipped: {reason}"

    def pytest_runtest_logfinish(self, nodeid: str, location) -> None:
        self._tick(f"done {nodeid}")

    def tests(self) -> list[dict]:
        """One record per collected test, in collection order; a test that did not run fails."""
        out = []
        for meta in self.collected:
            rec = dict(self.records.get(meta["nodeid"]) or dict(outcome="failed", message="not run", output=""))
            phases = rec.pop("phases", [])
            if rec["outcome"] == "passed" and "call" not in phases:
                rec.update(outcome="failed", message="the test did not run to its end")
            rec.setdefault("duration", 0.0)
            out.append({**meta, **rec, "score": meta["points"] if rec["outcome"] == "passed" else 0.0})
        return _zero_labs_using_the_engine(out)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        path = self.config.getoption("ag_results")
        if path:
            from autograder import impl

            data = dict(impl=str(impl.impl_folder()), tests=self.tests(), errors=self.errors)
            Path(path).write_text(json.dumps(data, indent=1))

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int, config: pytest.Config) -> None:
        if config.getoption("ag_results") or not self.collected:
            return  # the grader prints its own table
        from autograder.report import format_lab_table, group_by_lab

        for stem, tests in group_by_lab(self.tests()).items():
            terminalreporter.write_line("")
            terminalreporter.write_line(format_lab_table(stem, tests))


def _zero_labs_using_the_engine(tests: list[dict]) -> list[dict]:
    """Every test of a lab in which one test caught the engine's own implementation fails with 0
    (``originality.py``): that answer would earn the other tests' points too."""
    found = {}
    for t in tests:
        if t.get("engine_reference"):
            found.setdefault(t["stem"], (t["name"], t["engine_reference"]))
    for t in tests:
        if t["stem"] in found and not t.get("engine_reference"):
            name, text = found[t["stem"]]
            t.update(
                outcome="failed", score=0.0, message=f"graded 0 with the rest of the lab: {name} found that {text}"
            )
    return tests
