"""Early exit's shared KV: the verify forward reusing the draft's layers < E vs recomputing them.

    .venv/bin/python benchmarks/shared_kv.py > benchmarks/runs/shared_kv.txt

After early-exit drafting of K tokens, the target verifies [newest] + K drafts (k = K + 1
positions). With shared KV the first K of them already went through layers < E while drafting, so
the verify runs layers < E on 1 position and layers >= E on k; recomputing runs every layer on k.
The time the verify spends on the draft positions is T(k) - T(1) (the whole forward over k positions
minus the forward over the newest token alone); sharing should cut it by about E/L (the share of
layers reused; a little less, as the lm_head's extra rows are not reused). On this CPU a forward
over a few positions costs little more than over one (reading the weights dominates), so that
saving is a small part of the verify, largest at large K. Interleaved repetitions, medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdraft.data import corpus_documents
from specdraft.models import load_target
from specdraft.target import TargetModel


def verify_ms(target: TargetModel, ids: torch.Tensor, context: int, k: int, exit_layer: int, mode: str) -> float:
    """ms of the verify forward over ids[context-1 : context-1+k] after drafting its first k-1 with
    layers < exit_layer. mode: "shared" (reuse), "recompute" (discard the draft's layers), "ar" (k=1)."""
    target.crop(context - 1)
    if mode != "ar":
        for i in range(k - 1):  # the drafter's steps: [newest], d1, ..., d_{k-2}
            target.forward_prefix(ids[:, context - 1 + i : context + i], exit_layer)
        if mode == "recompute":
            target.discard_prefix()
    t0 = time.perf_counter()
    target.forward(ids[:, context - 1 : context - 1 + k])
    return 1000 * (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--exit-layers", default="2,6,12")
    ap.add_argument("--positions", default="2,4,8,16", help="k = K + 1 verified positions")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    target = load_target("smollm2-135m", device="cpu")
    text = "\n".join(t for _, t in corpus_documents("eval")[:10])  # held-out stdlib source
    ids = torch.tensor([target.tokenizer.encode(text)[: args.context + 32]])  # [1, T]
    target.reset()
    target.forward(ids[:, : args.context - 1], num_logits=0)
    exits = [int(e) for e in args.exit_layers.split(",")]
    ks = [int(k) for k in args.positions.split(",")]
    cells = [(e, k, m) for e in exits for k in ks for m in ("shared", "recompute")] + [(0, 1, "ar")]
    times: dict[tuple[int, int, str], list[float]] = {c: [] for c in cells}
    for rep in range(args.reps + 1):  # the first sweep warms up
        for cell in cells[rep % len(cells):] + cells[: rep % len(cells)]:
            ms = verify_ms(target, ids, args.context, cell[1], cell[0], cell[2])
            if rep:
                times[cell].append(ms)
    med = {c: statistics.median(v) for c, v in times.items()}
    t1 = med[(0, 1, "ar")]
    layers = target.num_layers
    print(f"context {args.context}, {layers} layers, {torch.get_num_threads()} threads, medians of "
          f"{args.reps} interleaved repetitions; T(1) = {t1:.1f} ms (the newest token alone)\n")
    print("| E | k | recompute ms | shared ms | saved ms | T(k) - T(1) ms | saved / (T(k) - T(1)) | E/L |")
    print("|---|---|---|---|---|---|---|---|")
    for e in exits:
        for k in ks:
            rec, sh = med[(e, k, "recompute")], med[(e, k, "shared")]
            marginal = rec - t1
            share = (rec - sh) / marginal if marginal > 0 else float("nan")
            print(f"| {e} | {k} | {rec:.1f} | {sh:.1f} | {rec - sh:.1f} | {marginal:.1f} | {share:.2f} | "
                  f"{e / layers:.2f} |")


if __name__ == "__main__":
    main()
