"""Where a draft disagrees with the target on the built-in suite: teacher-forced top-1 agreement
of distilled drafts with the target's greedy answers to suite prompts (RESULTS 3m).

    .venv/bin/python benchmarks/draft_suite_agreement.py --categories chat,qa --misses \
        specdraft/artifacts/smollm2-135m/draft outputs/s10/draft_copy

The target answers each prompt greedily (max_new_tokens, as the bench); each draft then predicts
every answer token from the true prefix. This is greedy K = 1 acceptance at EVERY position, while a
K = 1 bench run drafts only the positions after a rejection or a bonus token, so the bench's rate is
somewhat lower (easy positions come in runs). With --misses (one draft) it prints each answer and the
(target token, draft token) pairs where they differ: what the draft does not know.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from specdraft.models import load_target
from specdraft.suites import load_suite
from specdraft.train.distill import load_draft_artifact, student_sub_logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drafts", nargs="+", help="draft artifact directories written by specdraft-train-draft export_dir=...")
    ap.add_argument("--categories", default="chat,qa", help="comma-separated suite categories")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--misses", action="store_true", help="print the target's answers and the draft's misses")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target("smollm2-135m")
    tok = target.tokenizer
    wanted = set(args.categories.split(","))
    answers = []  # (prompt id, prompt length, prompt + answer [T])
    for p in (p for p in load_suite("builtin") if p.category in wanted):
        ids = torch.tensor([p.token_ids(tok)])  # [1, P]
        with torch.inference_mode():
            out = target.model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False)  # [1, T]
        answers.append((p.id, ids.shape[1], out[0]))
    print("| draft | pooled agreement | median over prompts | per prompt |")
    print("|---|---|---|---|")
    for directory in args.drafts:
        student, vocab = load_draft_artifact(directory, target.model)
        head = vocab.head(student.lm_head.weight)  # [M, H]
        hits = total = 0
        per_prompt = []
        for pid, n0, seq in answers:
            with torch.inference_mode():
                sub = student_sub_logits(student, seq[None], head)[0]  # [T, M]
            pred = vocab.ids[sub.argmax(-1)][n0 - 1 : -1]  # [A] draft's guess for each answer token
            truth = seq[n0:]  # [A]
            same = pred == truth
            hits, total = hits + int(same.sum()), total + len(truth)
            per_prompt.append((pid, float(same.float().mean())))
            if args.misses:
                print(f"{pid}: {tok.decode(truth)!r}")
                print("   misses (target, draft):", [(tok.decode([int(t)]), tok.decode([int(q)]))
                                                     for t, q, ok in zip(truth, pred, same, strict=True) if not ok])
        cells = ", ".join(f"{pid} {a:.2f}" for pid, a in per_prompt)
        print(f"| {directory} | {hits / total:.3f} ({total} tokens) | {statistics.median(a for _, a in per_prompt):.3f} | {cells} |",
              flush=True)


if __name__ == "__main__":
    main()
