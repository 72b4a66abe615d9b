"""``python -m autograder.timings``: record how long each test takes the reference solution, for the
grader's estimate of a run and its timeout messages (``pace.reference_times``).

It grades ``solutions/`` one lab at a time, measures this machine's pace before each lab, and writes
each test's duration divided by that pace (so a recording made on a slower machine still gives the
reference machine's times) to ``autograder/timings.json``. Run it on a quiet machine after changing
tests; an instructor-only file (it needs ``solutions/``). ``python -m autograder.timings lab14`` records
only the labs named and keeps the other labs' entries as they are (after adding or changing one lab).
"""

from __future__ import annotations

import json
import sys

from autograder import pace
from autograder.__main__ import grade_lab, known_labs
from autograder.impl import REPO


def record(labs: list[str] | None = None) -> dict:
    """Every lab's times, or only those of ``labs`` (``["lab14"]``) merged into the recorded ones."""
    stems = known_labs()
    chosen = [stems[lab] for lab in labs] if labs else list(stems.values())
    tests: dict[str, float] = {}
    if labs:
        old = json.loads(pace.TIMINGS.read_text())["tests"]
        tests = {k: v for k, v in old.items() if k.split(":")[0] not in labs}
    for stem in chosen:
        at_pace = pace.measure()
        data = grade_lab(stem, REPO / "solutions", None, False)
        failed = [t["name"] for t in data["tests"] if t["outcome"] != "passed"]
        if failed:
            raise SystemExit(f"the solution of {stem} fails {failed}: fix it before recording its timings")
        for t in data["tests"]:
            tests[f"{t['lab']}: {t['name']}"] = round(t["duration"] / at_pace, 2)
        print(f"{stem}: {sum(t['duration'] for t in data['tests']):.1f} s at pace {at_pace:.2f}", file=sys.stderr)
    return dict(reference_seconds=pace.REFERENCE_SECONDS, tests=dict(sorted(tests.items())))


if __name__ == "__main__":
    pace.TIMINGS.write_text(json.dumps(record(sys.argv[1:] or None), indent=1, sort_keys=True) + "\n")
    print(f"wrote {pace.TIMINGS}")
