"""Batch-1 `generate` of two source trees side by side (A/B): does a change slow the single-prompt path?

    git worktree add /tmp/before <commit>
    .venv/bin/python benchmarks/ab_checkouts.py /tmp/before . [--rounds 3] [--new-tokens 64] [--prompts 4]

Each round runs one worker process per tree, alternating A, B, B, A, ... (so drift hits both alike); a
worker imports `specdraft` and `drafters` from its tree (PYTHONPATH), loads the default target, and times
`generate` of the AR baseline and of the n-gram drafter (num_draft_tokens=auto, greedy) on the first
--prompts prompts of the built-in suite's copy-heavy categories (code_edit, summarize), after one untimed
warm-up. Prints each tree's tok/s per method (median over rounds) and B / A. Numbers: RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORKER = """
import json, sys, time, torch
torch.set_num_threads({threads})
from drafters.ngram import NGramDrafter
from specdraft.decode import SpeculativeDecoder
from specdraft.models import load_target
from specdraft.sampling import SamplingConfig
from specdraft.suites import load_suite
target = load_target("smollm2-135m", device="cpu")
prompts = [p for p in load_suite("builtin") if p.category in ("code_edit", "summarize")][:{prompts}]
ids = [p.token_ids(target.tokenizer) for p in prompts]
greedy = SamplingConfig(temperature=0.0)
out = {{}}
for name, drafter in (("ar", None), ("ngram", NGramDrafter())):
    dec = SpeculativeDecoder(target, drafter, "auto", greedy)
    dec.generate(ids[0], 8, stop_token_ids=[])  # warm-up (and the cost measurements)
    tokens, seconds = 0, 0.0
    for p in ids:
        t0 = time.perf_counter()
        res = dec.generate(p, {new}, stop_token_ids=[])
        seconds += time.perf_counter() - t0
        tokens += res.token_ids.shape[1]
    out[name] = tokens / seconds
print(json.dumps(out))
"""


def run_worker(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    """One worker on `tree`: {method: tok/s}."""
    code = WORKER.format(threads=args.threads, prompts=args.prompts, new=args.new_tokens)
    env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the worker on {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", type=Path, help="the tree before (e.g. a git worktree of the base commit)")
    ap.add_argument("b", type=Path, help="the tree after (e.g. .)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    for tree in (args.a, args.b):
        if not (tree / "specdraft" / "decode.py").is_file():
            ap.error(f"{tree} is not a specdraft source tree (no specdraft/decode.py); give two checkouts.")
    runs: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        order = [("A", args.a), ("B", args.b)] if r % 2 == 0 else [("B", args.b), ("A", args.a)]
        for label, tree in order:
            runs[label].append(run_worker(tree, args))
    print(f"A = {args.a}, B = {args.b}; {args.rounds} rounds, {args.prompts} prompts x {args.new_tokens} tokens, "
          f"{args.threads} threads, {time.perf_counter() - t0:.0f} s")
    print("| method | A tok/s | B tok/s | B / A |")
    print("|---|---|---|---|")
    for method in runs["A"][0]:
        a = statistics.median(x[method] for x in runs["A"])
        b = statistics.median(x[method] for x in runs["B"])
        print(f"| {method} | {a:.1f} | {b:.1f} | {b / a:.3f} |")


if __name__ == "__main__":
    main()
