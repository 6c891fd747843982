"""Copying from the context: the target's induction heads, and whether distilled drafts copy
(RESULTS 3n).

    .venv/bin/python benchmarks/induction.py specdraft/artifacts/smollm2-135m/draft outputs/s11/draft_rep

On B sequences [a; a] of L random frequent tokens each (the same kind as the recipe's
`data.repeats`, another seed): for every target layer, the largest per-head mean attention from a
second-copy token to the token after its first occurrence (an induction head attends there) and to
the previous token (a previous-token head, the other half of the circuit); then the copy accuracy
(top-1 = the copied token, second copy) of the target, of drafts made of target layers, untrained,
and of each draft directory given.
"""

from __future__ import annotations

import argparse

import torch

from specdraft.models import load_target
from specdraft.train.distill import build_student, load_draft_artifact, student_sub_logits
from specdraft.train.repeats import repeat_sequences, token_pool
from specdraft.vocab import PrunedVocab

VOCAB = "specdraft/artifacts/smollm2-135m/draft/pruned_vocab.json"


def copy_accuracy(logits_ids: torch.Tensor, seqs: torch.Tensor, span: int) -> float:
    """Top-1 = copied token at positions span .. 2*span-2 (ids [B, 2L] of predictions and inputs)."""
    return float((logits_ids[:, span:-1] == seqs[:, span + 1 :]).float().mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drafts", nargs="*", help="draft artifact directories (specdraft-train-draft export_dir=...)")
    ap.add_argument("--span", type=int, default=40)
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target("smollm2-135m")
    model = target.model
    vocab = PrunedVocab.load(VOCAB)
    pool = token_pool(vocab.ids, 4000, target.eos_token_ids)
    seqs = torch.stack(repeat_sequences(pool, args.sequences, args.span, seed=1234))  # [B, 2L]
    model.set_attn_implementation("eager")  # attention weights are only returned by eager attention
    with torch.inference_mode():
        out = model(input_ids=seqs, output_attentions=True, use_cache=False)
    span = args.span
    q = torch.arange(span, 2 * span)  # second-copy positions
    print("| layer | induction: max head (head) | previous token: max head |")
    print("|---|---|---|")
    for li, att in enumerate(out.attentions):  # [B, H, T, T]
        ind = att[:, :, q, q - span + 1].mean(dim=(0, 2))  # [H]
        prev = att[:, :, torch.arange(1, 2 * span), torch.arange(0, 2 * span - 1)].mean(dim=(0, 2))  # [H]
        print(f"| {li} | {ind.max():.2f} ({int(ind.argmax())}) | {prev.max():.2f} |")
    print()
    print("| model | copy accuracy, second copy |")
    print("|---|---|")
    print(f"| target | {copy_accuracy(out.logits.argmax(-1), seqs, span):.3f} |")
    head = vocab.head(model.lm_head.weight)  # [M, H]
    for ids in ([0, 1], [0, 1, 2], [0, 1, 17], [0, 1, 16, 17], [0, 1, 2, 3, 4, 5]):
        student = build_student(model, ids)
        with torch.inference_mode():
            pred = vocab.ids[student_sub_logits(student, seqs, head).argmax(-1)]  # [B, 2L]
        print(f"| target layers {ids}, untrained | {copy_accuracy(pred, seqs, span):.3f} |", flush=True)
    for directory in args.drafts:
        student, dvocab = load_draft_artifact(directory, model)
        with torch.inference_mode():
            pred = dvocab.ids[student_sub_logits(student, seqs, dvocab.head(student.lm_head.weight)).argmax(-1)]
        print(f"| {directory} | {copy_accuracy(pred, seqs, span):.3f} |", flush=True)


if __name__ == "__main__":
    main()
