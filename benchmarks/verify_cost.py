"""T_p(k): the target's forward cost for k new positions after a cached context, for the fast layer
stack and the plain Hugging Face forward side by side, as ratios to T_p(1) of the same stack
measured in the same run, plus fast T_p(1) / plain T_p(1) and a profile of the top operators at k=1
and k=5 for both stacks.

    .venv/bin/python benchmarks/verify_cost.py [--target smollm2-135m] [--contexts 128 512 2048]

Each (context, k, stack) is timed `--reps` times after a warm-up sweep, interleaved with the others
(`specdraft.costs.time_forwards`, so drift hits all alike); the median is reported. The cache is cropped back after every forward, exactly as the
decoder does after a fully rejected draft.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from specdraft.costs import time_forwards
from specdraft.data import corpus_documents, token_blocks
from specdraft.models import load_target
from specdraft.target import TargetModel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 2048])
    ap.add_argument("--max-k", type=int, default=16)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()

    fast = load_target(args.target, device="cpu", fast=True)
    plain = TargetModel(fast.model, fast.tokenizer, fast.eos_token_ids, fast=False)
    stacks = {"fast": fast, "plain": plain}
    tokens = token_blocks(fast.tokenizer, corpus_documents("eval"), max(args.contexts) + args.max_k, max_tokens=50_000)[0]
    ks = list(range(1, args.max_k + 1))
    print(f"target {args.target}, torch {torch.__version__}, threads {torch.get_num_threads()}, reps {args.reps}")
    print("\nT_p(k) / T_p(1) of the same stack (k = new positions; verifying K drafts uses k = K + 1):\n")
    print("| context | stack | T_p(1) ms | " + " | ".join(f"k={k}" for k in ks) + " |")
    print("|---|---|---|" + "---|" * len(ks))
    for ctx in args.contexts:
        times = time_forwards(stacks, tokens[None], ctx, ks, args.reps)
        med = {key: statistics.median(v) for key, v in times.items()}
        for name in stacks:
            t1 = med[name, 1]
            ratios = " | ".join(f"{med[name, k] / t1:.2f}" for k in ks)
            print(f"| {ctx} | {name} | {t1 * 1000:.1f} | {ratios} |")
        print(f"| {ctx} | fast/plain | {med['fast', 1] / med['plain', 1]:.2f} | "
              + " | ".join(f"{med['fast', k] / med['plain', k]:.2f}" for k in ks) + " |")

    if args.no_profile:
        return
    for name, target in stacks.items():
        for k in (1, 5):
            target.reset()
            target.forward(tokens[None, :512], num_logits=0)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(5):
                    target.forward(tokens[None, 512 : 512 + k])
                    target.crop(512)
            print(f"\nTop operators, {name} stack, k={k}, context 512 (5 forwards):")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))


if __name__ == "__main__":
    main()
