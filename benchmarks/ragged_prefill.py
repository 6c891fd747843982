"""A batch's prefill: packed (the rows' own tokens only) against padded and masked, side by side.

    .venv/bin/python benchmarks/ragged_prefill.py [--batch-sizes 4 8 16] [--suite builtin] [--repetitions 3]

The default target's fast stack prefills a batch of chat prompts of different lengths (the suite's first
turns, cycled) two ways on the same inputs, alternating, each from an empty cache: `prefill_packed` (what
`TargetModel.forward` runs for a left-padded batch: the projections see only the rows' own tokens and each
row attends causally over its own) and the padded forward with the row layout's mask (what it ran before:
every row computed to the longest prompt's length). Prints the tokens each one computes, the median time of
each, their ratio and the largest difference of the hidden states at the rows' own positions. The whole
effect on batched decoding is in the bench's batch sweep (RESULTS.md, "Batches").
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdraft.cpu_info import cpu_description
from specdraft.models import load_target
from specdraft.ragged import RowLayout
from specdraft.suites import load_suite


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--suite", default="builtin", help="a built-in suite name or a JSONL path")
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.repetitions < 1 or min(args.batch_sizes) < 1:
        ap.error("--repetitions and every batch size must be >= 1.")
    torch.set_num_threads(args.threads)
    target = load_target("smollm2-135m", device="cpu")
    if not target.fast:
        raise ValueError("the packed prefill is the fast stack's; this target runs the Hugging Face stack.")
    stack = target._stack  # both paths of the one stack, driven directly on the same inputs
    firsts = [sp.token_ids(target.tokenizer) for sp in load_suite(args.suite)]
    print(f"Machine: {cpu_description()}, {args.threads} threads; suite {args.suite!r}, {args.repetitions} repetitions")
    print("| batch | own tokens | padded tokens | padded s | packed s | padded / packed | max abs diff |")
    print("|---|---|---|---|---|---|---|")
    for b in args.batch_sizes:
        prompts = [firsts[i % len(firsts)] for i in range(b)]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # [B, W] left padded
        valid = ids.new_zeros(ids.shape, dtype=torch.bool)
        for i, p in enumerate(prompts):
            valid[i, width - len(p):] = True
        mask, positions = RowLayout(valid[:, :0]).inputs(valid, torch.float32)

        def padded() -> torch.Tensor:
            stack.reset(b)
            return stack.forward(ids, mask, positions)[0]

        def packed() -> torch.Tensor:
            stack.reset(b)
            return stack.prefill_packed(ids, valid)

        times: dict[str, list[float]] = {"padded": [], "packed": []}
        outs: dict[str, torch.Tensor] = {}
        with torch.inference_mode():
            packed()  # warm-up (oneDNN primitives for these shapes)
            padded()
            for rep in range(args.repetitions):
                order = [("padded", padded), ("packed", packed)][:: 1 if rep % 2 == 0 else -1]
                for name, fn in order:
                    t0 = time.perf_counter()
                    outs[name] = fn()
                    times[name].append(time.perf_counter() - t0)
        diff = float((outs["packed"][valid] - outs["padded"][valid]).abs().max())
        t_pad, t_pack = statistics.median(times["padded"]), statistics.median(times["packed"])
        print(f"| {b} | {int(valid.sum())} | {valid.numel()} | {t_pad:.2f} | {t_pack:.2f} | {t_pad / t_pack:.2f}x | "
              f"{diff:.1e} |", flush=True)
    stack.reset(1)


if __name__ == "__main__":
    main()
