"""Write a validation suite from the held-out split of self-generated data, to choose defaults on.

    .venv/bin/python benchmarks/validation_suite.py [--data data/smollm2-135m/selfgen_broad]
        [--out outputs/validation.jsonl] [--per-kind 4] [--magpie 20]
    .venv/bin/specdraft-bench suite.path=outputs/validation.jsonl ...

A drafter's default settings must be chosen neither on `general` (the held-out suite its numbers
are reported on) nor on `builtin` alone (the categories the first training prompts were templated
on). This suite is a third set: first turns of conversations in the selfgen data's "eval" split,
which training never reads (the split is by conversation), with their own system prompts. It takes
the `magpie` first MAGPIE conversations (the target's own chat requests) and the first `per_kind`
of every corpus kind (summarise, translate, passages QA, ...), in id order, so the same data always
gives the same suite. Each line is a `messages` prompt whose category is the conversation's kind.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from specdraft.train.selfgen import load_selfgen_records

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT / "data" / "smollm2-135m" / "selfgen_broad"


def validation_lines(records: list[dict], magpie: int, per_kind: int) -> list[dict]:
    """Suite lines (id, category, messages) from held-out records: first turns, one per conversation."""
    by_kind: dict[str, list[dict]] = defaultdict(list)
    seen: set[str] = set()
    for r in sorted(records, key=lambda r: r["id"]):
        if r["turn"] != 1 or r["mode"] != "greedy" or r["conversation"] in seen:
            continue
        seen.add(r["conversation"])
        by_kind[r["kind"]].append(r)
    lines = []
    for kind in sorted(by_kind):
        for r in by_kind[kind][: magpie if kind == "magpie" else per_kind]:
            lines.append({"id": r["conversation"], "category": kind, "messages": r["messages"]})
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="a specdraft-selfgen out_dir or selfgen.jsonl")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "validation.jsonl")
    parser.add_argument("--magpie", type=int, default=20, help="chat requests the target wrote (Magpie)")
    parser.add_argument("--per-kind", type=int, default=4, help="conversations of every other kind")
    args = parser.parse_args()
    if args.magpie < 0 or args.per_kind < 0:
        raise SystemExit("--magpie and --per-kind must be >= 0.")
    lines = validation_lines(load_selfgen_records("eval", args.data), args.magpie, args.per_kind)
    if not lines:
        raise SystemExit(f"{args.data} has no held-out first turns; make data with specdraft-selfgen first.")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    kinds: dict[str, int] = defaultdict(int)
    for line in lines:
        kinds[line["category"]] += 1
    print(f"{len(lines)} prompts -> {args.out}: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))


if __name__ == "__main__":
    main()
