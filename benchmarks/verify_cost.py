"""T_p(k): the target's forward cost for k new positions after a cached context, as ratios to
T_p(1) measured in the same run, plus a profile of the top operators at k=1 and k=5.

    .venv/bin/python benchmarks/verify_cost.py [--target smollm2-135m] [--contexts 128 512 2048]

Each (context, k) is timed `--reps` times interleaved with the others (so drift hits all k alike);
the median is reported. The cache is cropped back after every forward, exactly as the decoder does
after a fully rejected draft.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from specdraft.data import corpus_documents, token_blocks
from specdraft.models import load_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 2048])
    ap.add_argument("--max-k", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    target = load_target(args.target, device="cpu")
    tokens = token_blocks(target.tokenizer, corpus_documents("eval"), max(args.contexts) + args.max_k, max_tokens=50_000)[0]
    print(f"torch threads: {torch.get_num_threads()}")
    print("| context | " + " | ".join(f"k={k}" for k in range(1, args.max_k + 1)) + " |")
    print("|---|" + "---|" * args.max_k)
    for ctx in args.contexts:
        target.reset()
        target.forward(tokens[None, :ctx], num_logits=0)
        times: dict[int, list[float]] = {k: [] for k in range(1, args.max_k + 1)}
        for _ in range(args.reps):
            for k in times:
                t0 = time.perf_counter()
                target.forward(tokens[None, ctx : ctx + k])
                times[k].append(time.perf_counter() - t0)
                target.crop(ctx)
        t1 = statistics.median(times[1])
        ratios = " | ".join(f"{statistics.median(times[k]) / t1:.2f}" for k in times)
        print(f"| {ctx} (T_p(1) = {t1 * 1000:.1f} ms) | {ratios} |")

    for k in (1, 5):
        target.reset()
        target.forward(tokens[None, :512], num_logits=0)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                target.forward(tokens[None, 512 : 512 + k])
                target.crop(512)
        print(f"\nTop operators, k={k}, context 512 (5 forwards):")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))


if __name__ == "__main__":
    main()
