"""Top-1 agreement of exit adapters on a larger held-out stdlib/pydoc set and on a sample of their
training tokens (RESULTS 3j): is a 5-point change the adapter or the 4096-token sample, and does
the adapter generalise or memorise?

    .venv/bin/python benchmarks/exit_adapter_heldout.py --eval-tokens 16384 --train-tokens 1600000 \
        specdraft/artifacts/smollm2-135m/early_exit outputs/s7/ee_ctx_big_do

The held-out set is the first --eval-tokens of the recipe's held-out stdlib/pydoc stream (so it
contains the recipe's own 4096); the training sample is `train_sample` (as the recipe's
`eval.train_sample`) of the recipe's cached training split for `sources=[selfgen,stdlib,pydoc]`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from omegaconf import OmegaConf

from specdraft.exit_adapter import VOCAB_FILE, load_adapter
from specdraft.models import load_target
from specdraft.train.early_exit import agreement, load_blocks, precompute_teacher, teacher_cache_dir, train_sample
from specdraft.vocab import PrunedVocab

CONF = Path(__file__).resolve().parents[1] / "conf/train_early_exit.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("adapters", nargs="+", help="adapter directories written by specdraft-train-early-exit")
    ap.add_argument("--eval-tokens", type=int, default=16384)
    ap.add_argument("--train-tokens", type=int, default=1600000, help="the cached training split to sample")
    ap.add_argument("--exit-layer", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target("smollm2-135m")
    cfg = OmegaConf.load(CONF)
    cfg.exit_layer, cfg.sources = args.exit_layer, ["selfgen", "stdlib", "pydoc"]
    root = teacher_cache_dir(cfg)
    corpus = ["stdlib", "pydoc"]
    held_blocks = load_blocks(target.tokenizer, "eval", args.eval_tokens, corpus, cfg.block_size)  # [N, T]
    held = precompute_teacher(target, held_blocks, args.exit_layer, cfg.top_k,
                              root / f"eval_stdlib+pydoc_{args.eval_tokens}", with_prev=True)
    train_blocks = load_blocks(target.tokenizer, "train", args.train_tokens, list(cfg.sources), cfg.block_size)  # [N, T]
    train = precompute_teacher(target, train_blocks, args.exit_layer, cfg.top_k, root / "train", with_prev=True)
    sample = train_sample(train, 8192, cfg.block_size)
    for directory in args.adapters:
        adapter, _ = load_adapter(directory)
        vocab = PrunedVocab.load(Path(directory) / VOCAB_FILE)
        print(directory, json.dumps({f"heldout_stdlib_pydoc_{args.eval_tokens}": agreement(target, adapter, held, vocab=vocab),
                                     "train_sample_8192": agreement(target, adapter, sample, vocab=vocab)}), flush=True)


if __name__ == "__main__":
    main()
