"""Per-category throughput of every method relative to one base method, from `specdraft-bench` runs.

    .venv/bin/python benchmarks/compare_methods.py outputs/bench_repeated/results.json [more results.json] --base ngram

For each prompt (each turn of a multi-turn prompt) the ratio of a method's tok/s to the base method's
tok/s measured side by side in the same bench run (same prompt, same repetitions, rotated order);
the table shows the median ratio per category (several result files are pooled by category). A
second table pools each category's work instead: all its new tokens over all its seconds, per method,
over the base's (the category's throughput ratio; with the prompts' prefills left out too), so long
answers weigh more than short ones. Last, the store sizes the drafters reported (`drafter_memory`).
Numbers: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any


def ratios(results: list[dict[str, Any]], base: str) -> dict[str, dict[str, list[float]]]:
    """{category: {method: [tok/s ratio to `base` per prompt]}} over all records of all results."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for result in results:
        by_prompt: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        for r in result["records"]:
            by_prompt[r["prompt"]][r["method"]] = r
        for runs in by_prompt.values():
            if base not in runs or not runs[base]["tokens_per_s"]:
                continue
            for method, r in runs.items():
                if method != base:
                    ratio = r["tokens_per_s"] / runs[base]["tokens_per_s"]
                    out[r["category"]][method].append(ratio)
                    out["overall"][method].append(ratio)
    return out


def pooled(results: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """{category: {method: [new tokens, seconds, seconds without prefill]}} summed over the
    category's prompts (and "overall"), over all records of all results."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0, 0.0]))
    for result in results:
        for r in result["records"]:
            for cat in (r["category"], "overall"):
                total = out[cat][r["method"]]
                total[0] += r["tokens"]
                total[1] += r["seconds_median"]
                total[2] += r["seconds_median"] - (r.get("prefill_s") or 0.0)
    return out


def pooled_table(results: list[dict[str, Any]], base: str) -> list[str]:
    """Markdown rows: each category's throughput ratio to `base` (and decode-only, in brackets)."""
    per = pooled(results)
    methods = sorted({m for cat in per.values() for m in cat} - {base})
    lines = ["", f"| category (pooled) | " + " | ".join(f"{m} / {base}" for m in methods) + " |",
             "|---|" + "---|" * len(methods)]
    for cat in sorted(per, key=lambda c: (c != "overall", c)):
        b = per[cat].get(base)
        cells = []
        for m in methods:
            t = per[cat].get(m)
            if not b or not t or not t[1] or not t[2]:
                cells.append("-")
                continue
            whole = (t[0] / t[1]) / (b[0] / b[1])
            decode = (t[0] / t[2]) / (b[0] / b[2])
            cells.append(f"{whole:.2f}x ({decode:.2f}x)")
        lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    return lines


def table(results: list[dict[str, Any]], base: str) -> str:
    per = ratios(results, base)
    if not per:
        raise ValueError(f"no prompt has a record of the base method {base!r}; name a method of these runs.")
    methods = sorted({m for cat in per.values() for m in cat})
    lines = [f"| category | prompts | " + " | ".join(f"{m} / {base}" for m in methods) + " |",
             "|---|---|" + "---|" * len(methods)]
    for cat in sorted(per, key=lambda c: (c != "overall", c)):
        n = max(len(v) for v in per[cat].values())
        cells = [f"{statistics.median(per[cat][m]):.2f}x" if per[cat].get(m) else "-" for m in methods]
        lines.append(f"| {cat} | {n} | " + " | ".join(cells) + " |")
    lines += pooled_table(results, base)
    memory = [(m, mem) for result in results for m, mem in (result.get("drafter_memory") or {}).items()]
    if memory:
        lines += ["", "| method | store tokens | budget | requests | estimated bytes | corpus tokens | corpus bytes |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {m} | {mem['tokens']} | {mem['budget_tokens']} | {mem['requests']} | {mem['bytes']} "
                  f"| {mem.get('corpus_tokens', 0)} | {mem.get('corpus_bytes', 0)} |" for m, mem in memory]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="+", type=Path, help="results.json files written by specdraft-bench")
    ap.add_argument("--base", default="ngram", help="the method every other one is divided by")
    args = ap.parse_args()
    results = []
    for path in args.results:
        if not path.is_file():
            ap.error(f"{path}: no such file; give the results.json of a specdraft-bench run.")
        results.append(json.loads(path.read_text()))
    print(table(results, args.base))


if __name__ == "__main__":
    main()
