"""Bar charts of saved offline runs: ``python -m minisgl.benchmark.plot RESULTS.json... --out PNG``.

One panel per (model, workload), one bar per run, labelled with its tag and tokens/s."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("results", nargs="+")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[str, list[dict]] = defaultdict(list)
    for path in args.results:
        for run in json.load(open(path)):
            panels[f"{run['model']} · {run['workload']} · {run.get('device', '')}"].append(run)
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 1.2 + 0.45 * sum(map(len, panels.values()))), squeeze=False)
    for ax, (title, runs) in zip(axes[:, 0], panels.items()):
        labels = [f"{r['engine']} {r['tag']}".strip() for r in runs]
        values = [r["throughput"] for r in runs]
        bars = ax.barh(labels, values, color=["tab:blue" if r["engine"] == "minisgl" else "tab:gray" for r in runs])
        ax.bar_label(bars, [f"{v:,.0f}" for v in values], padding=3, fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("output tokens / s")
        ax.invert_yaxis()
        ax.set_xlim(0, max(values) * 1.2)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
