"""Held-out acceptance of EAGLE-3 heads, side by side on the same positions.

    .venv/bin/python benchmarks/eagle_heldout.py --heads smollm2-135m outputs/eagle_v2 \
        --selfgen-path data/smollm2-135m/selfgen_broad --cache-dir outputs/eagle_cache

The training-time-test evaluation of `specdraft-train-eagle` (`specdraft.train.eagle.evaluate`) on the
held-out split of the given selfgen sources (split by prompt: no training run saw these prompts), for
every head on the same greedy records: per draft position P(step s right | steps before it right),
the top-1 of each step and the mean number of drafts a chain of `--steps` accepts. The target's features
come from the recipe's own cache (`cache_dir`: shards are reused when present, computed otherwise).
Numbers: benchmarks/RESULTS.md ("EAGLE-3").
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from omegaconf import OmegaConf

from specdraft.formats.eagle_head import load_head
from specdraft.formats.target_info import guard_cache
from specdraft.models import load_target
from specdraft.train.eagle import evaluate, feature_sequences, selfgen_sequences

RECIPE = Path(__file__).resolve().parents[1] / "conf" / "train_eagle.yaml"  # eval_tokens, window, ttt_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m", help="the target the heads draft for (name, hub id, dir or .gguf)")
    parser.add_argument("--heads", nargs="+", required=True, help="head directories or shipped names")
    parser.add_argument("--selfgen-path", nargs="+", required=True, help="specdraft-selfgen out_dir(s) or .jsonl")
    parser.add_argument("--cache-dir", type=Path, required=True, help="the EAGLE recipe's feature cache")
    parser.add_argument("--eval-tokens", type=int, default=None, help="default: the recipe's data.eval_tokens")
    parser.add_argument("--steps", type=int, default=None, help="draft positions per chain (default: the recipe's ttt_steps)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    recipe = OmegaConf.load(RECIPE)
    eval_tokens = int(recipe.data.eval_tokens) if args.eval_tokens is None else args.eval_tokens
    steps = int(recipe.ttt_steps) if args.steps is None else args.steps
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}.")
    torch.set_num_threads(args.threads)

    target = load_target(args.target)
    guard_cache(args.cache_dir, target, "--cache-dir")
    raw = selfgen_sequences("eval", args.selfgen_path, eval_tokens, greedy_only=True)
    if not raw:
        raise ValueError(f"no held-out greedy records in {args.selfgen_path}: pass specdraft-selfgen outputs with an eval split.")
    heads = [(name, load_head(name, target).float().eval()) for name in args.heads]
    embed, rotary = target.model.get_input_embeddings(), target.model.base_model.rotary_emb
    print(f"held-out: {len(raw)} greedy sequences, {sum(len(ids) - first - 1 for ids, first in raw)} answer tokens")
    print(f"| head | aux layers | anchors | acceptance per position | top-1 per step | mean accepted of {steps} |")
    print("|---|---|---|---|---|---|")
    by_layers: dict[tuple[int, ...], list] = {}
    for name, head in heads:
        layers = tuple(head.config.aux_layers)
        if layers not in by_layers:  # one feature cache per layer set
            by_layers[layers] = feature_sequences(target, raw, layers, args.cache_dir, "eval")
        r = evaluate(head, embed, rotary, by_layers[layers], int(recipe.window), steps, head.vocab())
        acc = " / ".join(f"{x:.3f}" for x in r["acceptance_per_position"])
        top1 = " / ".join(f"{x:.3f}" for x in r["top1_per_step"])
        print(f"| {name} | {list(layers)} | {r['anchors']} | {acc} | {top1} | {r['expected_accepted_length']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
