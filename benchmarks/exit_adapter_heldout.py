"""Held-out agreement of early-exit adapters with the target, side by side on the same tokens.

    .venv/bin/python benchmarks/exit_adapter_heldout.py smollm2-135m outputs/early_exit_broad \
        --selfgen-path data/smollm2-135m/selfgen_broad --cache-dir outputs/early_exit_heldout

Teacher-forced on two held-out sets no adapter trained on: the held-out split of the given selfgen sources (split
by prompt; the target's own conversations, prompt and answer tokens) and the held-out stdlib/pydoc stream. Per
adapter and set: top-1 / top-5 agreement of the exit (layer E -> adapter -> final norm -> lm_head, on the
adapter's pruned vocabulary) with the target's greedy choice, and the chained top-1 (the context adapter reading
its own output at the position before, as for every draft token after a round's first), which is what drafting
gains. The recipe's own numbers are on 4096 tokens of one selfgen set, so adapters trained on different selfgen
data are not comparable there. Numbers: benchmarks/RESULTS.md ("Training").
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from omegaconf import OmegaConf

from drafters.early_exit import resolve_adapter
from specdraft.formats.exit_adapter import check_adapter_target, load_adapter
from specdraft.formats.target_info import guard_cache
from specdraft.models import load_target
from specdraft.train.early_exit import agreement, load_blocks, precompute_teacher
from specdraft.vocab import AUTO, resolve_pruned_vocab

RECIPE = Path(__file__).resolve().parents[1] / "conf" / "train_early_exit.yaml"  # block_size, top_k of the recipe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("adapters", nargs="+", help="adapter directories or shipped names (smollm2-135m)")
    parser.add_argument("--selfgen-path", nargs="+", required=True, help="specdraft-selfgen out_dir(s) or .jsonl")
    parser.add_argument("--cache-dir", type=Path, required=True, help="where the held-out teacher outputs are cached")
    parser.add_argument("--eval-tokens", type=int, default=16384, help="held-out tokens per set")
    parser.add_argument("--exit-layer", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    recipe = OmegaConf.load(RECIPE)
    target = load_target("smollm2-135m")
    guard_cache(args.cache_dir, target, "--cache-dir")
    sets = {}
    for name, sources in (("selfgen", ["selfgen"]), ("stdlib+pydoc", ["stdlib", "pydoc"])):
        blocks = load_blocks(target.tokenizer, "eval", args.eval_tokens, sources, recipe.block_size,
                             args.selfgen_path)  # [N, T]
        sets[name] = precompute_teacher(target, blocks, args.exit_layer, recipe.top_k,
                                        args.cache_dir / f"E{args.exit_layer}_{name}_{args.eval_tokens}", with_prev=True)
    print("held-out tokens: " + ", ".join(f"{n} {s['hidden'].shape[0]}" for n, s in sets.items()))
    print("| adapter | " + " | ".join(f"{n}: top-1 / top-5 / chained top-1" for n in sets) + " |")
    print("|---|" + "---|" * len(sets))
    for name in args.adapters:
        path = resolve_adapter(name)
        adapter, meta = load_adapter(path)
        check_adapter_target(path, meta, target)
        if int(meta["exit_layer"]) != args.exit_layer:
            raise ValueError(f"adapter {name!r} exits after layer {meta['exit_layer']}, not --exit-layer {args.exit_layer}.")
        vocab = resolve_pruned_vocab(AUTO, path, target.vocab_size)  # the one saved with the adapter, if any
        cells = []
        for data in sets.values():
            a = agreement(target, adapter, data, vocab=vocab)
            cells.append(f"{a['top1']:.3f} / {a['top5']:.3f} / {a.get('top1_chained', float('nan')):.3f}")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
