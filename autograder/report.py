"""Turning per-test records into what people read: a one-line summary and a table per lab, and
Gradescope's results.json.

A record (written by the plugin) has ``lab``, ``stem``, ``name``, ``doc``, ``points``, ``score``,
``outcome`` (passed / failed / skipped), ``message``, ``output``, ``duration`` and ``visibility``
(``visible``, or Gradescope's ``after_due_date`` / ``after_published`` / ``hidden`` for a test of
``autograder/hidden/``).
"""

from __future__ import annotations

import textwrap

from autograder.points import HIDDEN_POINTS

WIDTH = 100
STATUS = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}


def group_by_lab(tests: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for t in tests:
        out.setdefault(t["stem"], []).append(t)
    return out


def lab_score(tests: list[dict]) -> tuple[float, float]:
    return sum(t["score"] for t in tests), sum(t["points"] for t in tests)


def is_visible(t: dict) -> bool:
    return t.get("visibility", "visible") == "visible"


def hidden_note(tests: list[dict]) -> str:
    """What a lab graded without its hidden tests (the student edition) says about them; empty when
    they were graded."""
    if any(not is_visible(t) for t in tests) or not HIDDEN_POINTS:
        return ""
    return f"+{_num(HIDDEN_POINTS)} points in hidden tests, graded by the course staff after the due date"


def _num(x: float) -> str:
    return f"{x:g}"


def _listed(names: list[str], room: int) -> str:
    """``a, b, ... (+3 more)`` in about ``room`` characters (the first name always shows)."""
    out = ""
    for i, name in enumerate(names):
        piece = (", " if out else "") + name
        tail = f", ... (+{len(names) - i - 1} more)" if i < len(names) - 1 else ""
        if out and len(out) + len(piece) + len(tail) > room:
            return out + f", ... (+{len(names) - i} more)"
        out += piece
    return out


def summary_line(tests: list[dict], width: int = 120) -> str:
    """``lab01  37/100  3 of 14 tests failing: rms_norm_fixed, ...`` for one lab's records (the
    student edition adds ``(+10 hidden)``: points it cannot grade)."""
    score, total = lab_score(tests)
    head = f"{tests[0]['lab']}  {_num(score):>3}/{_num(total)}"
    if hidden_note(tests):
        head += f" (+{_num(HIDDEN_POINTS)} hidden)"
    failing = [t["name"] for t in tests if t["outcome"] != "passed"]
    if not failing:
        return f"{head}  all {len(tests)} tests pass"
    left = f"{len(failing)} of {len(tests)} tests failing: "
    return f"{head}  {left}{_listed(failing, width - len(head) - len(left) - 2)}"


def format_lab_table(stem: str, tests: list[dict], impl: str | None = None) -> str:
    score, total = lab_score(tests)
    title = f"{stem}" + (f"  ({impl})" if impl else "")
    lines = [f"{title:<{WIDTH - 12}}{_num(score):>6} / {_num(total)}", "-" * WIDTH]
    name_w = max([len(t["name"]) for t in tests] + [4])
    lines.append(f"  {'test':<{name_w}}  {'points':>7}  status")
    for t in tests:
        pts = f"{_num(t['score'])}/{_num(t['points'])}"
        status = STATUS.get(t["outcome"], t["outcome"])
        secs = f"  ({t['duration']:.1f} s)" if t.get("duration", 0) >= 1 else ""
        shown = "" if is_visible(t) else f"  [{t['visibility']}]"
        lines.append(f"  {t['name']:<{name_w}}  {pts:>7}  {status}{secs}{shown}")
        if t["outcome"] != "passed" and t.get("message"):
            for raw in t["message"].split("\n")[:8]:
                for piece in textwrap.wrap(raw, WIDTH - 8, subsequent_indent="  ") or [""]:
                    lines.append(f"      {piece}")
    passed = sum(t["outcome"] == "passed" for t in tests)
    lines.append(f"  {passed}/{len(tests)} tests passed")
    note = hidden_note(tests)
    if note:
        lines.append(f"  {note}")
    return "\n".join(lines)


def gradescope(tests: list[dict], execution_time: float, impl: str | None = None) -> dict:
    """Gradescope's autograder ``results.json``: one entry per test with its visibility, scores
    summed. What a student may see at once (the top-level ``output``) covers the visible tests only;
    with hidden tests the grader's stdout (the full tables) is for the staff only."""
    entries = []
    for t in tests:
        text = t.get("message") or ""
        if t.get("doc"):
            text = f"{t['doc']}\n{text}".strip()
        if t.get("output") and t["outcome"] != "passed":
            text += f"\n--- output of the test ---\n{t['output'][:2000]}"
        entries.append(
            dict(
                name=f"{t['lab']}: {t['name']}",
                score=t["score"],
                max_score=t["points"],
                status="passed" if t["outcome"] == "passed" else "failed",
                output=text,
                visibility=t.get("visibility", "visible"),
            )
        )
    visible = [t for t in tests if is_visible(t)]
    hidden = [t for t in tests if not is_visible(t)]
    parts = [format_lab_table(stem, ts, impl) for stem, ts in group_by_lab(visible).items()]
    if hidden:
        parts.append(
            f"{len(hidden)} hidden tests worth {_num(sum(t['points'] for t in hidden))} points were run too; "
            "their results are shown after the due date"
        )
    return dict(
        score=sum(t["score"] for t in tests),
        max_score=sum(t["points"] for t in tests),
        execution_time=round(execution_time, 2),
        output="\n\n".join(parts),
        visibility="visible",
        stdout_visibility="hidden" if hidden else "visible",
        tests=entries,
    )
