"""Check the hand-written held-out suite `specdraft/suites/general.jsonl` and print its shape.

    .venv/bin/python benchmarks/check_general_suite.py [--suite PATH] [--target smollm2-135m]

Each line must be one JSON object with exactly the fields question_id (string, unique), category
(string) and turns (a list of 1 or 2 non-empty strings: user messages, MT-bench / Spec-Bench
question format). The suite must have the nine categories below with at least 8 prompts each and
64 in all; every multiturn_chat prompt has 2 turns. Token lengths are of the first turn's text alone
(plain encode, no chat template) under the target's tokenizer; every summarization prompt must be at
least 1000 tokens and every rag prompt at least 1500. Prints a Markdown table of per-category counts
and min / median / max first-turn tokens; exits 1 with one line per problem otherwise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

CATEGORIES = ("multiturn_chat", "translation", "summarization", "extraction", "qa", "math", "code",
              "rag", "writing")
MIN_PER_CATEGORY = 8
MIN_TOTAL = 64
MIN_FIRST_TURN_TOKENS = {"summarization": 1000, "rag": 1500}
FIELDS = {"question_id", "category", "turns"}
DEFAULT_SUITE = Path(__file__).resolve().parent.parent / "specdraft" / "suites" / "general.jsonl"


def read_suite(path: Path) -> tuple[list[dict], list[str]]:
    """The records of a suite file and the problems found in its format (empty when it is valid)."""
    records, problems, seen = [], [], set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(f"line {n}: not valid JSON ({e})")
            continue
        if not isinstance(rec, dict) or set(rec) != FIELDS:
            problems.append(f"line {n}: fields must be exactly {sorted(FIELDS)}")
            continue
        qid, cat, turns = rec["question_id"], rec["category"], rec["turns"]
        if not isinstance(qid, str) or not qid:
            problems.append(f"line {n}: question_id must be a non-empty string")
        elif qid in seen:
            problems.append(f"line {n}: duplicate question_id {qid!r}")
        seen.add(qid)
        if cat not in CATEGORIES:
            problems.append(f"line {n}: unknown category {cat!r}")
        if (not isinstance(turns, list) or not 1 <= len(turns) <= 2
                or not all(isinstance(t, str) and t.strip() for t in turns)):
            problems.append(f"line {n}: turns must be a list of 1 or 2 non-empty strings")
            continue
        if cat == "multiturn_chat" and len(turns) != 2:
            problems.append(f"line {n}: multiturn_chat prompt {qid!r} must have 2 turns")
        records.append(rec)
    return records, problems


def check(path: Path, tokenizer: object) -> tuple[list[str], list[str]]:
    """(Markdown table lines of per-category counts and first-turn token lengths, problems)."""
    records, problems = read_suite(path)
    lengths: dict[str, list[int]] = {c: [] for c in CATEGORIES}
    two_turn: dict[str, int] = {c: 0 for c in CATEGORIES}
    for rec in records:
        cat = rec["category"]
        if cat not in lengths:
            continue
        n_tok = len(tokenizer.encode(rec["turns"][0], add_special_tokens=False))  # type: ignore[attr-defined]
        lengths[cat].append(n_tok)
        two_turn[cat] += len(rec["turns"]) == 2
        floor = MIN_FIRST_TURN_TOKENS.get(cat)
        if floor is not None and n_tok < floor:
            problems.append(f"{rec['question_id']}: first turn has {n_tok} tokens, {cat} needs >= {floor}")
    table = ["| category | prompts | 2-turn | min tokens | median tokens | max tokens |", "|---|---|---|---|---|---|"]
    for cat in CATEGORIES:
        xs = lengths[cat]
        if len(xs) < MIN_PER_CATEGORY:
            problems.append(f"category {cat}: {len(xs)} prompts, needs >= {MIN_PER_CATEGORY}")
        stats = f"{min(xs)} | {statistics.median(xs):g} | {max(xs)}" if xs else "- | - | -"
        table.append(f"| {cat} | {len(xs)} | {two_turn[cat]} | {stats} |")
    if len(records) < MIN_TOTAL:
        problems.append(f"{len(records)} prompts in all, needs >= {MIN_TOTAL}")
    return table, problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", type=Path, default=DEFAULT_SUITE)
    ap.add_argument("--target", default="smollm2-135m", help="whose tokenizer counts the tokens")
    args = ap.parse_args()

    from specdraft.models import load_tokenizer

    table, problems = check(args.suite, load_tokenizer(args.target))
    print(f"{args.suite} (first-turn tokens under {args.target}'s tokenizer)\n")
    print("\n".join(table))
    if problems:
        print(f"\nFAILED: {len(problems)} problem(s) in {args.suite}:", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    print("\nOK: format valid, question_ids unique, every category has enough prompts, "
          "summarization >= 1000 and rag >= 1500 first-turn tokens.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
