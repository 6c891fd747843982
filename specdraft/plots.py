"""PNG plots of a bench result: acceptance per position, speedup per category, measured vs
predicted speedup. Figures are drawn with matplotlib's object API straight to PNG files: no display is
needed and the process's pyplot backend is left alone (a notebook that imports the bench still shows plots)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

# The files write_plots writes (the bench refuses to overwrite an earlier run's without bench.overwrite).
PLOT_FILES = ("acceptance_per_position.png", "speedup_per_category.png", "measured_vs_predicted.png")


def write_plots(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write the three plots (PLOT_FILES) into out_dir; returns their paths."""
    records = [r for r in result["records"] if r.get("acceptance_per_position") is not None]
    acceptance, speedup, predicted = (out_dir / name for name in PLOT_FILES)
    return [
        _acceptance_per_position(records, acceptance),
        _speedup_per_category(result["summary"], speedup),
        _measured_vs_predicted(records, predicted),
    ]


def _acceptance_per_position(records: list[dict[str, Any]], path: Path) -> Path:
    pooled: dict[str, list[list[float]]] = defaultdict(list)
    for r in records:
        if r["acceptance_per_position"]:
            pooled[r["method"]].append(r["acceptance_per_position"])
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for method, rows in pooled.items():
        width = max(len(x) for x in rows)
        mean = [sum(x[i] for x in rows if i < len(x)) / max(1, sum(i < len(x) for x in rows))
                for i in range(width)]
        ax.plot(range(1, width + 1), mean, marker="o", label=method)
    ax.set(xlabel="draft position", ylabel="P(accept | reached)", ylim=(0, 1.05),
           title="Acceptance per draft position")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _speedup_per_category(summary: dict[str, dict[str, Any]], path: Path) -> Path:
    cats = sorted(c for c in summary if c != "overall") + ["overall"]
    methods = sorted({m for c in cats for m in summary[c]})
    fig = Figure(figsize=(max(6, len(cats) * 1.2), 4))
    ax = fig.subplots()
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        ys = [summary[c].get(m, {}).get("speedup") or 0.0 for c in cats]
        ax.bar([x + i * width for x in range(len(cats))], ys, width, label=m)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(cats))], cats, rotation=20)
    ax.set(ylabel="speedup vs AR (median)", title="Speedup per category")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _measured_vs_predicted(records: list[dict[str, Any]], path: Path) -> Path:
    fig = Figure(figsize=(5, 5))
    ax = fig.subplots()
    by_method: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for r in records:
        if r.get("predicted_speedup") and r.get("speedup"):
            by_method[r["method"]][0].append(r["predicted_speedup"])
            by_method[r["method"]][1].append(r["speedup"])
    hi = 1.0
    for method, (pred, meas) in by_method.items():
        ax.scatter(pred, meas, label=method, s=14)
        hi = max(hi, *pred, *meas)
    ax.plot([0, hi * 1.05], [0, hi * 1.05], "k--", lw=0.8)
    ax.set(xlabel="predicted speedup (theory, measured costs)", ylabel="measured speedup",
           title="Measured vs predicted")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
