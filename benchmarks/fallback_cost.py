"""What the cost model's fallback costs: a drafter held at K = 0 against plain AR, on one batch, side by side.

    .venv/bin/python benchmarks/fallback_cost.py [--batch-size 16] [--drafters quantized medusa] [--repetitions 3]

Where drafting stops paying (large batches), `num_draft_tokens=auto` chooses K = 0 and the loop decodes as plain AR
with the drafter still bound (its per-round bookkeeping, the hidden states it asks for). This times the same
`generate_batch` call for AR, for each drafter with `auto` and for each drafter forced to K = 0, interleaved the way
the bench's batch sweep does it (`specdraft.batch_bench.time_batches`: the order rotates every repetition; this
machine is shared and noisy), and prints each one's median seconds and its ratio to AR's. The batch is the sweep's
first batch of --batch-size rows over the built-in suite's code_edit and summarize prompts (three each, wrapping
around), the prompts of the batch sweep in RESULTS.md ("Batches"); greedy, --new-tokens each.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

import torch

from specdraft.batch_bench import draw_batches, time_batches
from specdraft.bench_checks import select_prompts
from specdraft.build import drafter_config, make_drafter
from specdraft.decode import SpeculativeDecoder
from specdraft.models import load_target
from specdraft.sampling import SamplingConfig
from specdraft.suites import load_suite


@dataclass(frozen=True)
class Method:
    """One timed variant (what `time_batches` reads of a bench method)."""

    name: str
    decoder: SpeculativeDecoder
    baseline: str = "autoregressive"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--drafters", nargs="+", default=["quantized", "medusa"], help="conf/drafter names or .yaml files")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=0, help="untimed repetitions first")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.batch_size < 1 or args.repetitions < 1 or args.new_tokens < 1 or args.warmup < 0:
        raise ValueError("--batch-size, --repetitions and --new-tokens must be >= 1, --warmup >= 0.")
    torch.set_num_threads(args.threads)
    target = load_target(args.target)
    prompts = select_prompts(load_suite("builtin"), ["code_edit", "summarize"], 3)
    ids = [p.token_ids(target.tokenizer) for p in prompts]
    (batch,) = draw_batches(len(ids), args.batch_size, 1)
    methods = [Method("autoregressive", SpeculativeDecoder(target))]
    for name in args.drafters:
        for k in ("auto", 0):
            methods.append(Method(f"{name} K={k}", SpeculativeDecoder(target, make_drafter(drafter_config(name)),
                                                                       num_draft_tokens=k)))
    runs = time_batches(methods, target, [[ids[i] for i in batch]], [args.new_tokens], SamplingConfig(),
                        args.warmup, args.repetitions, lambda: None)
    seconds = {name: [rep[0].seconds for rep in reps] for name, reps in runs.items()}
    ar = statistics.median(seconds["autoregressive"])
    print(f"batch size {args.batch_size}, {args.new_tokens} new tokens, {args.repetitions} repetitions, "
          f"{args.threads} threads; median seconds of the whole call (prefill included) and AR's / it:")
    for name, xs in seconds.items():
        same = "greedy = AR" if runs[name][-1][0].rows == runs["autoregressive"][-1][0].rows else "GREEDY DIFFERS FROM AR"
        print(f"  {name:28s} {statistics.median(xs):7.2f} s  {ar / statistics.median(xs):.3f}x  "
              f"({', '.join(f'{x:.2f}' for x in xs)})  {same}")


if __name__ == "__main__":
    main()
