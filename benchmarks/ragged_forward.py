"""A ragged batch's forwards: packed (the rows' real tokens only) against padded and masked, side by side.

    .venv/bin/python benchmarks/ragged_forward.py [--batch-sizes 4 8 16] [--suite builtin] [--repetitions 3]
                                                  [--draft-tokens 4] [--drafting 0.25 0.5 0.75]

The default target's fast stack runs two kinds of ragged forward two ways on the same inputs, alternating:
packed (what `TargetModel.forward` runs on the fast stack: the projections see only the rows' real tokens)
and padded with the row layout's mask (every row computed to the widest row; the Hugging Face stack's way).

- prefill: a batch of chat prompts of different lengths (the suite's first turns, cycled), each run from an
  empty cache: `prefill_packed` (each row attends causally over its own tokens) against the padded forward;
- verify: after that prefill, one round of `[newest] + K drafts` where only a fraction of the rows drafted
  (the others bring their newest token alone, as an n-gram row with no match does): `forward_packed` against
  the padded forward over [B, K + 1]; the cache is cropped back after each.

Prints the tokens each one computes, the median time of each, their ratio and the largest difference of the
hidden states at the real positions. The whole effect on batched decoding is in the bench's batch sweep
(RESULTS.md, "Batches").
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from specdraft.cpu_info import cpu_description
from specdraft.fast_stack import FastStack
from specdraft.models import load_target
from specdraft.ragged import RowLayout
from specdraft.suites import load_suite


def side_by_side(runs: dict[str, Callable[[], torch.Tensor]], repetitions: int) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """Median seconds and the last output of each run, alternating their order every repetition."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    outs: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        for fn in runs.values():
            fn()  # warm-up (oneDNN primitives for these shapes)
        for rep in range(repetitions):
            for name, fn in list(runs.items())[:: 1 if rep % 2 == 0 else -1]:
                t0 = time.perf_counter()
                outs[name] = fn()
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}, outs


def left_padded_batch(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, W] left padded with 0 and valid [B, W] bool."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    valid = torch.zeros(ids.shape, dtype=torch.bool)
    for i, p in enumerate(prompts):
        valid[i, width - len(p):] = True
    return ids, valid


def prefill_row(stack: FastStack, b: int, ids: torch.Tensor, valid: torch.Tensor, repetitions: int) -> str:
    mask, positions = RowLayout(valid[:, :0]).inputs(valid, torch.float32)

    def padded() -> torch.Tensor:
        stack.reset(b)
        return stack.forward(ids, mask, positions)[0]

    def packed() -> torch.Tensor:
        stack.reset(b)
        return stack.prefill_packed(ids, valid)

    t, outs = side_by_side({"padded": padded, "packed": packed}, repetitions)
    diff = float((outs["packed"][valid] - outs["padded"][valid]).abs().max())
    return (f"| prefill | {b} | - | {int(valid.sum())} | {valid.numel()} | {t['padded']:.3f} | {t['packed']:.3f} | "
            f"{t['padded'] / t['packed']:.2f}x | {diff:.1e} |")


def verify_row(stack: FastStack, b: int, ids: torch.Tensor, valid: torch.Tensor, k: int, drafting: float,
               repetitions: int, vocab: int) -> str:
    stack.reset(b)
    layout = RowLayout(valid[:, :0])
    stack.start_layout(layout)
    with torch.inference_mode():
        stack.prefill_packed(ids, valid)
    layout.append(valid)
    width = stack.seq_length(0)
    gen = torch.Generator().manual_seed(b)
    tokens = torch.randint(0, vocab, (b, k + 1), generator=gen)  # [B, K+1]
    drafted = torch.arange(b) < round(drafting * b)  # [B]: these rows bring K drafts, the others none
    real = torch.arange(k + 1)[None] <= torch.where(drafted, k, 0)[:, None]  # [B, K+1]
    mask, positions = layout.inputs(real, torch.float32)

    def padded() -> torch.Tensor:
        out = stack.forward(tokens, mask, positions)[0]
        stack.crop(width, stack.num_layers)
        return out

    def packed() -> torch.Tensor:
        out = stack.forward_packed(tokens, real, mask, positions)
        stack.crop(width, stack.num_layers)
        return out

    t, outs = side_by_side({"padded": padded, "packed": packed}, repetitions)
    diff = float((outs["packed"][real] - outs["padded"][real]).abs().max())
    return (f"| verify K={k} | {b} | {drafting:.2f} | {int(real.sum())} | {real.numel()} | {t['padded'] * 1e3:.1f} ms | "
            f"{t['packed'] * 1e3:.1f} ms | {t['padded'] / t['packed']:.2f}x | {diff:.1e} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--suite", default="builtin", help="a built-in suite name or a JSONL path")
    ap.add_argument("--repetitions", type=int, default=3, help="prefill repetitions (verify runs 20x as many)")
    ap.add_argument("--draft-tokens", type=int, default=4, help="K of the verify round")
    ap.add_argument("--drafting", type=float, nargs="+", default=[0.25, 0.5, 0.75],
                    help="fractions of the rows that drafted K tokens in the verify round")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.repetitions < 1 or min(args.batch_sizes) < 1 or args.draft_tokens < 1:
        ap.error("--repetitions, --draft-tokens and every batch size must be >= 1.")
    if not all(0.0 <= f <= 1.0 for f in args.drafting):
        ap.error("every --drafting fraction must be in [0, 1].")
    torch.set_num_threads(args.threads)
    target = load_target("smollm2-135m", device="cpu")
    stack = target._stack  # both paths of the one stack, driven directly on the same inputs
    if not isinstance(stack, FastStack):
        raise ValueError("packed forwards are the fast stack's; this target runs the Hugging Face stack.")
    firsts = [sp.token_ids(target.tokenizer) for sp in load_suite(args.suite)]
    print(f"Machine: {cpu_description()}, {args.threads} threads; suite {args.suite!r}, {args.repetitions} repetitions")
    print("| forward | batch | rows drafting | real tokens | padded tokens | padded | packed | padded / packed | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for b in args.batch_sizes:
        ids, valid = left_padded_batch([firsts[i % len(firsts)] for i in range(b)])
        print(prefill_row(stack, b, ids, valid, args.repetitions), flush=True)
        for fraction in args.drafting:
            print(verify_row(stack, b, ids, valid, args.draft_tokens, fraction, 20 * args.repetitions,
                             target.vocab_size), flush=True)
    stack.reset(1)


if __name__ == "__main__":
    main()
