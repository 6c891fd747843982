"""What the cost model's fallback costs: a drafter held at K = 0 against plain AR, on one batch, side by side.

    .venv/bin/python benchmarks/fallback_cost.py [--batch-size 16] [--drafters quantized medusa] [--repetitions 3]

Where drafting stops paying (large batches), `num_draft_tokens=auto` chooses K = 0 and the loop decodes as plain AR
with the drafter still bound (its per-round bookkeeping, the hidden states it asks for). This times the same
`generate_batch` call for AR, for each drafter with `auto` and for each drafter forced to K = 0, alternating the
methods in every repetition (this machine is shared and noisy), and prints each one's median seconds and its ratio
to AR's. The batch is the first --batch-size of the built-in suite's code_edit and summarize prompts (three each,
wrapping around), the prompts of the batch sweep in RESULTS.md ("Batches"); greedy, --new-tokens each.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from specdraft.build import drafter_config, make_drafter
from specdraft.decode import SpeculativeDecoder
from specdraft.models import load_target
from specdraft.suites import by_category, chat_prompt_ids, load_suite


def suite_batch(tokenizer: object, batch_size: int) -> list[list[int]]:
    """The first three code_edit and three summarize prompts of the built-in suite, cycled to batch_size rows."""
    groups = by_category(load_suite("builtin"))
    prompts = [chat_prompt_ids(tokenizer, p.messages) for cat in ("code_edit", "summarize") for p in groups[cat][:3]]
    return [prompts[i % len(prompts)] for i in range(batch_size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--drafters", nargs="+", default=["quantized", "medusa"], help="conf/drafter names or .yaml files")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.batch_size < 1 or args.repetitions < 1 or args.new_tokens < 1:
        raise ValueError("--batch-size, --repetitions and --new-tokens must be >= 1.")
    torch.set_num_threads(args.threads)
    target = load_target(args.target)
    batch = suite_batch(target.tokenizer, args.batch_size)
    stop = list(target.eos_token_ids)
    decoders = {"autoregressive": SpeculativeDecoder(target)}
    for name in args.drafters:
        for k in ("auto", 0):
            decoders[f"{name} K={k}"] = SpeculativeDecoder(target, make_drafter(drafter_config(name)), num_draft_tokens=k)
    seconds: dict[str, list[float]] = {name: [] for name in decoders}
    rows: dict[str, list[list[int]]] = {}
    for _ in range(args.repetitions):
        for name, decoder in decoders.items():
            res = decoder.generate_batch(batch, args.new_tokens, stop_token_ids=stop)
            seconds[name].append(res.stats.total_s)
            rows[name] = [r.token_ids[0].tolist() for r in res.results]
    ar = statistics.median(seconds["autoregressive"])
    print(f"batch size {args.batch_size}, {args.new_tokens} new tokens, {args.repetitions} repetitions, "
          f"{args.threads} threads; median seconds of the whole call (prefill included) and AR's / it:")
    for name, xs in seconds.items():
        same = "greedy = AR" if rows[name] == rows["autoregressive"] else "GREEDY DIFFERS FROM AR"
        print(f"  {name:28s} {statistics.median(xs):7.2f} s  {ar / statistics.median(xs):.3f}x  "
              f"({', '.join(f'{x:.2f}' for x in xs)})  {same}")


if __name__ == "__main__":
    main()
