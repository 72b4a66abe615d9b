"""Benchmarks: programs that print numbers (offline throughput, online serving, long prompts, profiles)."""

from __future__ import annotations

import json
from pathlib import Path


def append_result(path: str | Path, result: dict) -> None:
    """Add one run to a JSON list of runs (created if missing), so runs of a session sit side by side."""
    path = Path(path)
    runs = json.loads(path.read_text()) if path.exists() else []
    runs.append(result)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(runs, indent=2))
