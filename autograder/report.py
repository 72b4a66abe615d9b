"""Turning per-test records into what people read: a table per lab and Gradescope's results.json.

A record (written by the plugin) has ``lab``, ``stem``, ``name``, ``doc``, ``points``, ``score``,
``outcome`` (passed / failed / skipped), ``message``, ``output`` and ``duration``.
"""

from __future__ import annotations

import textwrap

WIDTH = 100


def group_by_lab(tests: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for t in tests:
        out.setdefault(t["stem"], []).append(t)
    return out


def lab_score(tests: list[dict]) -> tuple[float, float]:
    return sum(t["score"] for t in tests), sum(t["points"] for t in tests)


def _num(x: float) -> str:
    return f"{x:g}"


def format_lab_table(stem: str, tests: list[dict], impl: str | None = None) -> str:
    score, total = lab_score(tests)
    title = f"{stem}" + (f"  ({impl})" if impl else "")
    lines = [f"{title:<{WIDTH - 12}}{_num(score):>6} / {_num(total)}", "-" * WIDTH]
    name_w = max([len(t["name"]) for t in tests] + [4])
    lines.append(f"  {'test':<{name_w}}  {'points':>7}  status")
    for t in tests:
        pts = f"{_num(t['score'])}/{_num(t['points'])}"
        status = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}.get(t["outcome"], t["outcome"])
        secs = f"  ({t['duration']:.1f} s)" if t.get("duration", 0) >= 1 else ""
        lines.append(f"  {t['name']:<{name_w}}  {pts:>7}  {status}{secs}")
        if t["outcome"] != "passed" and t.get("message"):
            for raw in t["message"].split("\n")[:8]:
                for piece in textwrap.wrap(raw, WIDTH - 8, subsequent_indent="  ") or [""]:
                    lines.append(f"      {piece}")
    passed = sum(t["outcome"] == "passed" for t in tests)
    lines.append(f"  {passed}/{len(tests)} tests passed")
    return "\n".join(lines)


def gradescope(tests: list[dict], execution_time: float, output: str = "") -> dict:
    """Gradescope's autograder ``results.json``: one entry per test, scores summed."""
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
                visibility="visible",
            )
        )
    return dict(
        score=sum(t["score"] for t in tests),
        max_score=sum(t["points"] for t in tests),
        execution_time=round(execution_time, 2),
        output=output,
        visibility="visible",
        stdout_visibility="visible",
        tests=entries,
    )
