"""Teacher-forced agreement of distilled drafts on larger held-out sets than the recipe's own
(RESULTS 3k): top-1 agreement with the target and expected acceptance sum_x min(p, q) at
temperature 1, on the held-out stdlib/pydoc stream and on held-out answers of the target, every
draft scored on the same positions.

    .venv/bin/python benchmarks/draft_heldout.py --eval-corpus-tokens 16384 \
        specdraft/artifacts/smollm2-135m/draft outputs/s9/draft_code

The corpus set is the first --eval-corpus-tokens of the recipe's held-out stream (so it contains
the recipe's own `data.eval_corpus_tokens`); the answers are the first --eval-selfgen held-out
records (all 118 by default; the recipe's `data.eval_selfgen` are the first 12); with --copy-chats N
also on N copy chats made of held-out answers (`specdraft.train.copy_chats`: the answer asked for
again; scored on the repeated answer), which measures whether a draft copies from its context. Each
draft is scored over its own pruned vocabulary (q is zero outside it), as it drafts.
"""

from __future__ import annotations

import argparse
import json

import torch

from specdraft.data import corpus_documents, token_blocks
from specdraft.models import load_target
from specdraft.train.copy_chats import copy_chat_sequences
from specdraft.train.distill import answer_sequences, evaluate, load_draft_artifact, make_eval_set
from specdraft.train.selfgen import load_selfgen_records


TITLES = {"corpus": "held-out stdlib/pydoc", "selfgen": "held-out answers", "copy": "held-out copy chats"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drafts", nargs="+", help="draft artifact directories written by specdraft-train-draft export_dir=...")
    ap.add_argument("--eval-corpus-tokens", type=int, default=16384)
    ap.add_argument("--eval-selfgen", type=int, default=0, help="0 = all held-out answers")
    ap.add_argument("--max-len", type=int, default=320, help="as the recipe's data.max_len")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--copy-chats", type=int, default=0, help="also score on this many held-out copy chats")
    ap.add_argument("--copy-max-len", type=int, default=640, help="as the recipe's data.copy_max_len")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target("smollm2-135m")
    blocks = token_blocks(target.tokenizer, corpus_documents("eval"), 256, args.eval_corpus_tokens)  # [N, 256]
    records = load_selfgen_records("eval")
    records = records[: args.eval_selfgen] if args.eval_selfgen else records
    sets = {
        "corpus": (list(blocks), [0] * len(blocks)),
        "selfgen": answer_sequences(records, args.max_len),
    }
    if args.copy_chats:
        sets["copy"] = copy_chat_sequences(records, target.tokenizer, target.eos_token_ids, args.copy_chats,
                                             args.copy_max_len)
    results = {}
    for directory in args.drafts:
        student, vocab = load_draft_artifact(directory, target.model)
        head = vocab.head(student.lm_head.weight)  # [M, H]
        results[directory] = {name: evaluate(student, head, vocab, make_eval_set(target, seqs, starts, vocab))
                              for name, (seqs, starts) in sets.items()}
        print(json.dumps({directory: results[directory]}), flush=True)
    print("| draft | " + " | ".join(f"{TITLES[name]} top-1 / sum min(p,q)" for name in sets) + " |")
    print("|---|" + "---|" * len(sets))
    for directory, r in results.items():
        cells = [f"{r[n]['greedy_agreement']:.3f} / {r[n]['expected_acceptance']:.3f} ({r[n]['positions']} positions)" for n in sets]
        print(f"| {directory} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
