"""Copying from the context: the target's induction heads, and whether distilled drafts copy
(RESULTS 3n).

    .venv/bin/python benchmarks/induction.py specdraft/artifacts/smollm2-135m/draft outputs/s11/draft_rep

On B sequences [a; a] of L random frequent tokens each (the same kind as the recipe's
`data.repeats`, another seed): for every target layer, the largest per-head mean attention from a
second-copy token to the token after its first occurrence (an induction head attends there) and to
the previous token (a previous-token head, the other half of the circuit); then the copy accuracy
(top-1 = the copied token, second copy) of the target, of drafts made of target layers, untrained,
and of each draft directory given, at several spans L (a draft that copies at one span only has
learned an offset, not induction).
"""

from __future__ import annotations

import argparse

import torch

from specdraft.models import load_target
from specdraft.train.distill import build_student, load_draft_artifact
from specdraft.train.repeats import copy_accuracy, repeat_sequences, token_pool
from specdraft.vocab import PrunedVocab

VOCAB = "specdraft/artifacts/smollm2-135m/draft/pruned_vocab.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drafts", nargs="*", help="draft artifact directories (specdraft-train-draft export_dir=...)")
    ap.add_argument("--spans", default="40,64", help="comma-separated L; the first is used for the attention table")
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target("smollm2-135m")
    model = target.model
    vocab = PrunedVocab.load(VOCAB)
    pool = token_pool(vocab.ids, 4000, target.eos_token_ids)
    spans = [int(x) for x in args.spans.split(",")]
    batches = {L: torch.stack(repeat_sequences(pool, args.sequences, L, L, seed=1234 + L)) for L in spans}  # [B, 2L]
    span, seqs = spans[0], batches[spans[0]]
    model.set_attn_implementation("eager")  # attention weights are only returned by eager attention
    with torch.inference_mode():
        out = model(input_ids=seqs, output_attentions=True, use_cache=False)
    q = torch.arange(span, 2 * span)  # second-copy positions
    print("| layer | induction: max head (head) | previous token: max head |")
    print("|---|---|---|")
    for li, att in enumerate(out.attentions):  # [B, H, T, T]
        ind = att[:, :, q, q - span + 1].mean(dim=(0, 2))  # [H]
        prev = att[:, :, torch.arange(1, 2 * span), torch.arange(0, 2 * span - 1)].mean(dim=(0, 2))  # [H]
        print(f"| {li} | {ind.max():.2f} ({int(ind.argmax())}) | {prev.max():.2f} |")
    print()
    print("| model | " + " | ".join(f"copy accuracy, L = {L}" for L in spans) + " |")
    print("|---|" + "---|" * len(spans))
    full = PrunedVocab(range(model.config.vocab_size), model.config.vocab_size)  # the target over all its tokens
    drafts = [("target", model, full)]
    drafts += [(f"target layers {ids}, untrained", build_student(model, ids), vocab)
               for ids in ([0, 1], [0, 1, 2], [0, 1, 17], [0, 1, 16, 17], [0, 1, 2, 3, 4, 5])]
    drafts += [(d, *load_draft_artifact(d, model)) for d in args.drafts]
    for name, student, dvocab in drafts:
        head = dvocab.head(student.lm_head.weight)  # [M, H]
        cells = [copy_accuracy(student, head, dvocab, list(b)) for b in batches.values()]
        print(f"| {name} | " + " | ".join(f"{c:.3f}" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
