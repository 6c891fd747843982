"""One pass over every projection and the lm_head of a model, in each weight format of
`specdraft.linear_formats`, side by side in one run: what a decode step (rows = 1) or a verify /
catch-up forward (rows = k) costs in products alone, and the bytes per second that streams.

    .venv/bin/python benchmarks/weight_formats.py [--target smollm2-135m] [--rows 1 4 8] [--threads 2]

Formats are timed interleaved (one pass of each per repetition) so drift hits all alike; medians.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from specdraft.linear_formats import FORMATS, Linear, WeightFormat
from specdraft.models import load_target
from specdraft.target import TargetModel


def linears(target: TargetModel, fmt: WeightFormat) -> list[Linear]:
    """Every product of one forward of `target`'s model in format `fmt` (a fresh fast stack)."""
    stack = TargetModel(target.model, fast=True, weights=fmt)._stack
    found = [lin for layer in stack.layers for lin in (layer.qkv, layer.out, layer.gate_up, layer.down)]
    return found + [stack.lm_head]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 5, 8, 16])
    ap.add_argument("--formats", nargs="+", default=["float", "bfloat16", "int4:32", "int4:64", "int8"])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.target, device="cpu", fast=True)
    formats = {}
    for spec in args.formats:
        kind, _, group = spec.partition(":")
        if kind not in FORMATS:
            raise SystemExit(f"error: unknown format {kind!r}; choose from {FORMATS} (int4:<group_size>).")
        formats[spec] = WeightFormat(kind, int(group) if group else 32)
    built = {name: linears(target, fmt) for name, fmt in formats.items()}
    print(f"target {args.target}, {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}, reps {args.reps}")
    print("\n| format | MB | " + " | ".join(f"rows={m} ms" for m in args.rows) + " | GB/s at rows=1 |")
    print("|---|---|" + "---|" * (len(args.rows) + 1))
    times: dict[tuple[str, int], list[float]] = {(n, m): [] for n in built for m in args.rows}
    with torch.inference_mode():
        sizes = set(_input_sizes(target, 5))
        inputs = {m: {size: torch.randn(m, size) for size in sizes} for m in args.rows}
        for rep in range(args.reps + 1):
            for m in args.rows:
                for name, lins in built.items():
                    t0 = time.perf_counter()
                    for lin, size in zip(lins, _input_sizes(target, len(lins))):
                        lin(inputs[m][size])
                    if rep:  # the first repetition warms up
                        times[name, m].append(time.perf_counter() - t0)
    for name, lins in built.items():
        nbytes = sum(lin.nbytes for lin in lins)
        meds = [statistics.median(times[name, m]) for m in args.rows]
        rate = nbytes / meds[0] / 1e9 if args.rows[0] == 1 else float("nan")
        print(f"| {name} | {nbytes / 1e6:.0f} | " + " | ".join(f"{t * 1000:.2f}" for t in meds) + f" | {rate:.1f} |")


def _input_sizes(target: TargetModel, count: int) -> list[int]:
    """The input width of each product in `linears` order (qkv, out, gate_up, down per layer; head)."""
    hidden, inter = target.hidden_size, int(target.config.intermediate_size)
    return [hidden, hidden, hidden, inter] * ((count - 1) // 4) + [hidden]


if __name__ == "__main__":
    main()
