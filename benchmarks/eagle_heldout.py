"""Held-out acceptance of EAGLE-3 heads, side by side on the same positions.

    .venv/bin/python benchmarks/eagle_heldout.py --heads smollm2-135m outputs/eagle_v2 \
        --selfgen-path data/smollm2-135m/selfgen_broad --cache-dir outputs/eagle_cache

The training-time-test evaluation of `specdraft-train-eagle` (`specdraft.train.eagle.evaluate`) on the
held-out split of the given selfgen sources (split by prompt: no training run saw these prompts), for
every head on the same greedy records: per draft position P(step s right | steps before it right),
the top-1 of each step and the mean number of drafts a chain of `--steps` accepts. The target's features
come from the recipe's own cache (`cache_dir`: shards are reused when present, computed otherwise).
`--online N` measures the same heads in use instead: each drafts a chain of `--steps` tokens every round
(no copying) while the target decodes the first N held-out greedy prompts (128 new tokens), and the
acceptance per position counts the rounds that reached each position. Online a round starts right
after the target corrected a rejected draft, so these are lower than the teacher-forced numbers, which
count every answer position as an anchor. Numbers: benchmarks/RESULTS.md ("EAGLE-3").

    .venv/bin/python benchmarks/eagle_heldout.py --heads smollm2-135m \
        --selfgen-path data/smollm2-135m/selfgen_broad --online 12
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from omegaconf import OmegaConf

from drafters.eagle import EagleDrafter
from specdraft.batch_bench import pooled_acceptance_per_position
from specdraft.decode import SpeculativeDecoder
from specdraft.formats.eagle_head import load_head
from specdraft.formats.target_info import guard_cache
from specdraft.models import load_target
from specdraft.target import TargetModel
from specdraft.train.eagle import evaluate, feature_sequences, selfgen_sequences

RECIPE = Path(__file__).resolve().parents[1] / "conf" / "train_eagle.yaml"  # eval_tokens, window, ttt_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m", help="the target the heads draft for (name, hub id, dir or .gguf)")
    parser.add_argument("--heads", nargs="+", required=True, help="head directories or shipped names")
    parser.add_argument("--selfgen-path", nargs="+", required=True, help="specdraft-selfgen out_dir(s) or .jsonl")
    parser.add_argument("--cache-dir", type=Path, default=None, help="the EAGLE recipe's feature cache (teacher-forced mode)")
    parser.add_argument("--online", type=int, default=0, help="N > 0: decode N held-out prompts with each head instead")
    parser.add_argument("--eval-tokens", type=int, default=None, help="default: the recipe's data.eval_tokens")
    parser.add_argument("--steps", type=int, default=None, help="draft positions per chain (default: the recipe's ttt_steps)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    recipe = OmegaConf.load(RECIPE)
    eval_tokens = int(recipe.data.eval_tokens) if args.eval_tokens is None else args.eval_tokens
    steps = int(recipe.ttt_steps) if args.steps is None else args.steps
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}.")
    if args.online < 0 or (args.online == 0 and args.cache_dir is None):
        raise ValueError("pass --cache-dir (teacher-forced acceptance) or --online N with N >= 1 (decoding).")
    torch.set_num_threads(args.threads)

    target = load_target(args.target)
    raw = selfgen_sequences("eval", args.selfgen_path, eval_tokens, greedy_only=True)
    if not raw:
        raise ValueError(f"no held-out greedy records in {args.selfgen_path}: pass specdraft-selfgen outputs with an eval split.")
    if args.online:
        online(target, args.heads, [ids[: first + 1] for ids, first in raw[: args.online]], steps)
        return
    guard_cache(args.cache_dir, target, "--cache-dir")
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


def online(target: TargetModel, heads: list[str], prompts: list[torch.Tensor], steps: int) -> None:
    """Per head: decode every prompt (128 new tokens, greedy) drafting a `steps`-token chain each round
    with the head alone; print the acceptance per position over all rounds (accepted / reached)."""
    print(f"online: {len(prompts)} held-out prompts, a chain of {steps} every round, no copying")
    print("| head | rounds | acceptance per position (accepted / reached) | tokens per round |")
    print("|---|---|---|---|")
    for name in heads:
        drafter = EagleDrafter(name, tree=None, copy_ngram=None)
        decoder = SpeculativeDecoder(target, drafter, num_draft_tokens=steps, max_draft_tokens=steps)
        runs = [decoder.generate(prompt, 128).stats for prompt in prompts]
        acc = " / ".join(f"{a:.3f}" for a in pooled_acceptance_per_position(runs))
        rounds, tokens = sum(s.rounds for s in runs), sum(s.new_tokens for s in runs)
        print(f"| {name} | {rounds} | {acc} | {tokens / max(rounds, 1):.2f} |", flush=True)


if __name__ == "__main__":
    main()
