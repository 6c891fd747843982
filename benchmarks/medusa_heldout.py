"""Held-out agreement of Medusa head sets with the target, side by side on the same positions.

    .venv/bin/python benchmarks/medusa_heldout.py --heads smollm2-135m/medusa smollm2-135m/medusa_recurrent \
        outputs/medusa_rec_broad --selfgen-path data/smollm2-135m/selfgen_broad --cache-dir outputs/medusa_cache_broad

Teacher-forced on the held-out split of the given selfgen sources (split by prompt: no training run saw these
prompts): per head, top-1 / top-5 agreement with the target's greedy choice, and the chain's mean accepted
length with one draft per head (1 + sum_k P(heads 1..k all right)), which is what a verify round gains before its
cost. The target's hidden states come from the recipe's own cache (`specdraft-train-medusa`'s cache_dir: the
shards are reused when present, computed otherwise). Numbers: benchmarks/RESULTS.md ("Training").
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from specdraft.formats.medusa_heads import base_heads, check_heads_target, load_heads, resolve_heads_dir
from specdraft.formats.target_info import guard_cache
from specdraft.models import load_target
from specdraft.train.medusa import evaluate, precompute, selfgen_sequences
from specdraft.verify import leading_true
from specdraft.vocab import AUTO, resolve_pruned_vocab


def chain_accepted_length(label_ranks: list[list[int]]) -> float:
    """1 + sum_k P(heads 1..k all rank the target's choice first), over positions where every head has a label."""
    if not label_ranks:
        return float("nan")
    return 1.0 + leading_true(torch.tensor(label_ranks) == 0).double().mean().item()  # ranks [M, K]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m", help="the target the heads draft for (name, hub id, dir or .gguf)")
    parser.add_argument("--heads", nargs="+", required=True, help="head directories or shipped names")
    parser.add_argument("--selfgen-path", nargs="+", required=True, help="specdraft-selfgen out_dir(s) or .jsonl")
    parser.add_argument("--cache-dir", type=Path, required=True, help="the Medusa recipe's hidden-state cache")
    parser.add_argument("--eval-tokens", type=int, default=12000, help="as the recipe's data.eval_tokens")
    parser.add_argument("--positions", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    target = load_target(args.target)
    guard_cache(args.cache_dir, target, "--cache-dir")
    seqs = selfgen_sequences("eval", args.selfgen_path, args.eval_tokens)
    if not seqs:
        raise ValueError(f"no held-out sequences in {args.selfgen_path}: pass specdraft-selfgen outputs with an eval split.")
    data = precompute(target, seqs, args.cache_dir, "selfgen-eval")
    embed = target.model.get_input_embeddings().weight
    print(f"held-out: {len(seqs)} sequences, {len(data.inputs(1))} answer positions (first {args.positions} used)")
    print("| heads | top-1 per head | top-5 per head | chain mean accepted length (K = its heads) |")
    print("|---|---|---|---|")
    for name in args.heads:
        path = resolve_heads_dir(name)
        vocab = resolve_pruned_vocab(AUTO, path, target.vocab_size)  # the one saved with the heads, if any
        check_heads_target(path, target)
        model = load_heads(path, target.lm_head.weight, embed)
        acc = evaluate(model, data, base_heads(model).num_heads, args.positions, vocab)
        top1 = " / ".join(f"{x:.3f}" for x in acc["top1"])
        top5 = " / ".join(f"{x:.3f}" for x in acc["top5"])
        print(f"| {name} | {top1} | {top5} | {chain_accepted_length(acc['label_ranks']):.2f} |", flush=True)


if __name__ == "__main__":
    main()
