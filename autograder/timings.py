"""``python -m autograder.timings``: record how long each test takes the reference solution, for the
grader's estimate of a run and its timeout messages (``pace.reference_times``).

It grades ``solutions/`` one lab at a time, measures this machine's pace before each lab, and writes
each test's duration divided by that pace (so a recording made on a slower machine still gives the
reference machine's times) to ``autograder/timings.json``. Run it on a quiet machine after changing
tests; an instructor-only file (it needs ``solutions/``).
"""

from __future__ import annotations

import json
import sys

from autograder import pace
from autograder.__main__ import grade_lab, known_labs
from autograder.impl import REPO


def record() -> dict:
    tests: dict[str, float] = {}
    for stem in known_labs().values():
        at_pace = pace.measure()
        data = grade_lab(stem, REPO / "solutions", None, False)
        failed = [t["name"] for t in data["tests"] if t["outcome"] != "passed"]
        if failed:
            raise SystemExit(f"the solution of {stem} fails {failed}: fix it before recording its timings")
        for t in data["tests"]:
            tests[f"{t['lab']}: {t['name']}"] = round(t["duration"] / at_pace, 2)
        print(f"{stem}: {sum(t['duration'] for t in data['tests']):.1f} s at pace {at_pace:.2f}", file=sys.stderr)
    return dict(reference_seconds=pace.REFERENCE_SECONDS, tests=tests)


if __name__ == "__main__":
    pace.TIMINGS.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {pace.TIMINGS}")
