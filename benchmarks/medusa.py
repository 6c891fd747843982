"""Benchmark the shipped Medusa heads; writes benchmarks/medusa.md.

1. Per-head top-1 / top-5 agreement with the target on held-out data: the target's own greedy
   generations (selfgen eval split, completion positions) and stdlib code (corpus eval split), from
   the hidden-state cache of specdraft-train-medusa (computed if missing).
2. Greedy generation on held-out selfgen prompts, side by side in one run (interleaved per prompt):
   autoregressive, Medusa chain, Medusa tree. Mean accepted length (tokens per target forward),
   tokens/s and speedup vs AR per prompt, medians over prompts; outputs checked equal to AR.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/medusa.py --prompts 8 --max-new-tokens 96
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_module

from drafters.medusa import MedusaDrafter, load_heads, resolve_heads_dir
from specdraft.decode import SpeculativeDecoder
from specdraft.models import load_target
from specdraft.train.medusa import evaluate, load_data
from specdraft.train.selfgen import load_selfgen_records
from specdraft.tree import grow_tree

OUT = Path(__file__).resolve().parent / "medusa.md"
BIG_TREE = 16  # a fixed larger tree (best-first, 16 nodes) next to the cost-model choice


def agreement(target, heads: str) -> dict[str, dict]:  # noqa: ANN001
    """Per-head agreement on the held-out hidden sets of the training config."""
    with initialize_config_module(config_module="conf", version_base="1.3"):
        cfg = compose(config_name="train_medusa")
    drafter = MedusaDrafter(heads=heads)  # the heads + pruned vocabulary exactly as drafting uses them
    drafter.bind(target)
    num_heads = drafter.model.get_base_model().num_heads
    return {name: evaluate(drafter.model, data, num_heads, 100000, drafter.rows)
            for name, data in load_data(cfg, target, "eval").items()}


def run_generation(target, heads: str, prompts: list[list[int]], max_new: int,
                   tree_nodes: int) -> list[dict]:  # noqa: ANN001
    """AR / chain / tree on every prompt, interleaved."""
    chain = MedusaDrafter(heads=heads, tree=None)
    tree = MedusaDrafter(heads=heads, tree="auto")
    acc = json.loads((resolve_heads_dir(heads) / "accuracy.json").read_text())
    big = grow_tree(acc["rank_accuracy"]["selfgen"], BIG_TREE, torch.tensor(acc["label_ranks"]["selfgen"]))
    decoders = {
        "ar": SpeculativeDecoder(target, None),
        "chain": SpeculativeDecoder(target, chain, num_draft_tokens=chain_k(target, heads)),
        "tree": SpeculativeDecoder(target, tree, num_draft_tokens=tree_nodes),
        "tree16": SpeculativeDecoder(target, MedusaDrafter(heads=heads, tree=[list(p) for p in big]),
                                     num_draft_tokens=BIG_TREE),
    }
    rows = []
    for i, prompt in enumerate(prompts):
        row: dict = {"prompt": i, "prompt_tokens": len(prompt)}
        ref = None
        for name, dec in decoders.items():
            out = dec.generate(prompt, max_new_tokens=max_new)
            toks = out.token_ids[0].tolist()
            ref = toks if ref is None else ref
            row[name] = {"tok_s": out.stats.tokens_per_s, "mal": out.stats.mean_accepted_length,
                         "tokens": len(toks), "rounds": out.stats.rounds, "same_as_ar": toks == ref}
        rows.append(row)
        print(f"prompt {i}: " + "  ".join(
            f"{n} {row[n]['tok_s']:.1f} tok/s mal {row[n]['mal']:.2f}" for n in decoders), flush=True)
    return rows


def chain_k(target, heads: str) -> int:  # noqa: ANN001
    embed = target.model.get_input_embeddings().weight
    return load_heads(heads, target.lm_head.weight, embed).get_base_model().num_heads


MODES = ("chain", "tree", "tree16")


def write_report(acc: dict, rows: list[dict], args: argparse.Namespace, tree_size: int) -> str:
    lines = ["# Medusa heads (SmolLM2-135M-Instruct, shipped heads)", "",
             f"Command: `{' '.join(['python', *sys.argv])}`  ",
             f"Machine: {platform.processor() or platform.machine()}, torch threads "
             f"{torch.get_num_threads()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
             "the 2 CPU cores were shared with other jobs while this ran, so tok/s are noisy.", "",
             "## Per-head agreement with the target (held out)", ""]
    num_heads = len(next(iter(acc.values()))["top1"]) if acc else 0
    if acc:
        lines += ["| data | positions | " + " | ".join(
                      f"head {k + 1} top-1 | head {k + 1} top-5" for k in range(num_heads)) + " |",
                  "|---|---|" + "---|---|" * num_heads]
    else:
        lines.append("(skipped: --skip-agreement)")
    for name, r in acc.items():
        label = {"selfgen": "target's own generations", "stdlib": "stdlib code"}.get(name, name)
        cells = " | ".join(f"{a:.3f} | {b:.3f}" for a, b in zip(r["top1"], r["top5"]))
        lines.append(f"| {label} | {int(r['positions'][0])} | {cells} |")
    lines += ["", f"## Greedy generation: AR vs chain vs tree ({len(rows)} held-out selfgen prompts, "
              f"{args.max_new_tokens} new tokens, tree of {tree_size} nodes)", "",
              "| prompt | AR tok/s | " + " | ".join(f"{m} tok/s | {m} MAL | {m} speedup" for m in MODES)
              + " | outputs equal AR |",
              "|---|---|" + "---|---|---|" * len(MODES) + "---|"]
    for r in rows:
        ar = r["ar"]["tok_s"]
        same = all(r[m]["same_as_ar"] for m in MODES)
        cells = " | ".join(f"{r[m]['tok_s']:.1f} | {r[m]['mal']:.2f} | {r[m]['tok_s'] / ar:.2f}x" for m in MODES)
        lines.append(f"| {r['prompt']} | {ar:.1f} | {cells} | {same} |")

    def med(key: str, mode: str) -> float:
        return statistics.median(r[mode][key] if key != "speedup" else r[mode]["tok_s"] / r["ar"]["tok_s"]
                                 for r in rows)

    def pooled_mal(mode: str) -> float:
        return sum(r[mode]["tokens"] for r in rows) / sum(r[mode]["rounds"] for r in rows)

    lines += ["", "| mode | mean accepted length (pooled) | median speedup vs AR |", "|---|---|---|",
              "| AR | 1.00 | 1.00x |",
              *[f"| {m} | {pooled_mal(m):.2f} | {med('speedup', m):.2f}x |" for m in MODES], "",
              f"chain = {rows and 'top-1 of every head'}; tree = the cost-model choice "
              f"({tree_size} nodes, `tree=auto`); tree16 = best-first tree of {BIG_TREE} nodes from "
              "the joint held-out label ranks.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-agreement", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target("smollm2-135m", device="cpu")
    acc = {} if args.skip_agreement else agreement(target, args.heads)
    for name, r in acc.items():
        print(f"{name}: top1 {r['top1']} top5 {r['top5']}", flush=True)
    prompts = [r["prompt_ids"] for r in load_selfgen_records("eval")][: args.prompts]
    tree = MedusaDrafter(heads=args.heads, tree="auto")
    tree.bind(target)
    tree_size = len(tree.paths or [])
    rows = run_generation(target, args.heads, prompts, args.max_new_tokens, max(tree_size, 1))
    report = write_report(acc, rows, args, tree_size)
    OUT.write_text(report)
    print(report)


if __name__ == "__main__":
    main()
