"""Compare two sets of Medusa heads on the same held-out data (the cached target hidden states of
`specdraft-train-medusa`): per-head top-1 / top-5 agreement with the target.

    python benchmarks/medusa_heads_compare.py OLD_DIR NEW_DIR [--cache-dir outputs/medusa_cache]

Both directories are adapter dirs written by specdraft-train-medusa (with their vocab.json). The
held-out sets are those of conf/train_medusa.yaml (data.eval_tokens of the selfgen eval split and
of the stdlib eval split), so old and new heads are scored on exactly the same positions.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from omegaconf import OmegaConf

from drafters.medusa import VOCAB_FILE, load_heads
from specdraft.models import load_target
from specdraft.train.medusa import evaluate, load_data
from specdraft.vocab import PrunedVocab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("heads", nargs="+", help="adapter directories to compare")
    ap.add_argument("--cache-dir", default="outputs/medusa_cache")
    ap.add_argument("--positions", type=int, default=12000)
    args = ap.parse_args()
    torch.set_num_threads(2)
    cfg = OmegaConf.load(Path(__file__).resolve().parent.parent / "conf" / "train_medusa.yaml")
    cfg.cache_dir = args.cache_dir
    target = load_target(cfg.target, device="cpu")
    evals = load_data(cfg, target, "eval")
    print(f"held-out positions: { {n: len(d.choice) for n, d in evals.items()} }")
    print("| heads | held-out set | top-1 head 1 / 2 / 3 | top-5 head 1 / 2 / 3 |\n|---|---|---|---|")
    for heads in args.heads:
        model = load_heads(heads, target.lm_head.weight, target.model.get_input_embeddings().weight)
        vocab = Path(heads) / VOCAB_FILE
        rows = PrunedVocab.load(vocab).ids if vocab.is_file() else None
        k = model.get_base_model().num_heads
        for name, data in evals.items():
            acc = evaluate(model, data, k, args.positions, rows)
            print(f"| {heads} | {name} | {' / '.join(f'{x:.3f}' for x in acc['top1'])} "
                  f"| {' / '.join(f'{x:.3f}' for x in acc['top5'])} |", flush=True)


if __name__ == "__main__":
    main()
