"""What copying adds to a draft, teacher-forced (RESULTS 3o): top-1 agreement with the target and
expected acceptance sum_x min(p, q') at temperature 1, where q' = (1 - w) q + w onehot(c) mixes in
the token c that followed the most recent earlier occurrence of the context's last
copy_ngram..max_ngram tokens (`DraftModelDrafter(copy_ngram=..., copy_weight=w)`), for several w.

    .venv/bin/python benchmarks/draft_copy_mix.py specdraft/artifacts/smollm2-135m/draft

Sets: the target's greedy answers to the built-in suite's prompts (--categories, --max-new-tokens as
the bench), held-out answers of the target (the recipe's eval split) and held-out stdlib/pydoc
blocks. Each position is predicted from the true prefix (the whole prompt + answer so far, or the
256-token block so far), so the top-1 column is greedy K = 1 acceptance at every position. w = 0 is
the draft alone; at temperature 0 every w >= 0.5 drafts the copy, so top-1 is one number per ngram.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch import Tensor

from drafters.ngram import NGramIndex
from specdraft.data import corpus_documents, token_blocks
from specdraft.models import load_target
from specdraft.suites import load_suite
from specdraft.train.distill import answer_sequences, load_draft_artifact, student_sub_logits
from specdraft.train.selfgen import load_selfgen_records

WEIGHTS = (0.0, 0.25, 0.5, 0.75, 0.9)


def copy_tokens(seq: list[int], first: int, min_ngram: int, max_ngram: int) -> list[int | None]:
    """For each position t >= first: the copy proposal for token t + 1 from seq[: t + 1]."""
    index = NGramIndex(min_ngram, max_ngram)
    index.extend(seq[:first])
    out = []
    for t in range(first, len(seq) - 1):
        index.extend([seq[t]])
        out.append(index.next_token(seq[max(0, t + 1 - max_ngram) : t + 1]))
    return out


@torch.inference_mode()
def score(target, student, head, vocab, seq: Tensor, first: int, ngrams: list[int], max_ngram: int) -> dict:  # noqa: ANN001
    """Sums over the positions t >= first of one sequence [T], for every (ngram, w)."""
    target.reset()
    p = torch.softmax(target.forward(seq[None]).logits[0, first:-1].float(), -1)  # [n, V]
    q = vocab.expand(torch.softmax(student_sub_logits(student, seq[None], head)[0, first:-1].float(), -1))  # [n, V]
    t_arg = p.argmax(-1)  # [n]
    base_min = torch.minimum(p, q)  # [n, V]
    out = {"positions": len(t_arg)}
    out["top1", 0] = int((q.argmax(-1) == t_arg).sum())
    out["summin", 0, 0.0] = float(base_min.sum())
    for n in ngrams:
        cps = copy_tokens(seq.tolist(), first, n, max_ngram)
        has = torch.tensor([c is not None for c in cps])  # [n]
        c = torch.tensor([c if c is not None else 0 for c in cps])  # [n]
        rows = torch.arange(len(cps))
        pred = torch.where(has, c, q.argmax(-1))
        out["top1", n] = int((pred == t_arg).sum())
        out["copies", n] = int(has.sum())
        for w in WEIGHTS[1:]:
            mixed_c = torch.minimum(p[rows, c], (1 - w) * q[rows, c] + w)  # [n]
            # sum_x min(p, (1 - w) q) with the copy token's term replaced by its mixed one  # [n]
            s = torch.minimum(p, (1 - w) * q).sum(-1) - torch.minimum(p[rows, c], (1 - w) * q[rows, c]) + mixed_c
            out["summin", n, w] = float(torch.where(has, s, base_min.sum(-1)).sum())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("draft", help="a draft artifact directory")
    ap.add_argument("--categories", default="chat,qa")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--eval-corpus-tokens", type=int, default=16384)
    ap.add_argument("--eval-selfgen", type=int, default=40, help="held-out answers scored (0 = none)")
    ap.add_argument("--ngrams", default="1,2,3")
    ap.add_argument("--max-ngram", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ngrams = [int(n) for n in args.ngrams.split(",")]
    target = load_target("smollm2-135m")
    tok = target.tokenizer
    student, vocab = load_draft_artifact(args.draft, target.model)
    head = vocab.head(student.lm_head.weight)  # [M, H]
    sets: dict[str, list[tuple[str, Tensor, int]]] = {}
    wanted = set(args.categories.split(","))
    suite = []
    for p in (p for p in load_suite("builtin") if p.category in wanted):
        ids = torch.tensor([p.token_ids(tok)])  # [1, P]
        with torch.inference_mode():
            seq = target.model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False)[0]  # [T]
        suite.append((p.id, seq, ids.shape[1] - 1))
    sets["suite " + args.categories] = suite
    if args.eval_selfgen:
        seqs, starts = answer_sequences(load_selfgen_records("eval")[: args.eval_selfgen], 320)
        sets["held-out answers"] = [(str(i), s, st) for i, (s, st) in enumerate(zip(seqs, starts))]
    if args.eval_corpus_tokens:
        blocks = token_blocks(tok, corpus_documents("eval"), 256, args.eval_corpus_tokens)  # [N, 256]
        sets["held-out stdlib/pydoc"] = [(str(i), b, 0) for i, b in enumerate(blocks)]
    print(f"draft {args.draft}; copy_max_ngram {args.max_ngram}; teacher-forced, every position\n")
    print("| set | copy_ngram | positions with a copy | top-1 pooled / median over prompts | "
          + " | ".join(f"sum min(p,q') w={w}" for w in WEIGHTS) + " |")
    print("|---|---|---|---|" + "---|" * len(WEIGHTS))
    for name, items in sets.items():
        per = [score(target, student, head, vocab, seq, first, ngrams, args.max_ngram) for _, seq, first in items]
        total = sum(r["positions"] for r in per)
        for n in [0, *ngrams]:
            top1 = sum(r["top1", n] for r in per) / total
            med = statistics.median(r["top1", n] / r["positions"] for r in per)
            copies = "-" if n == 0 else f"{sum(r['copies', n] for r in per) / total:.2f}"
            if n == 0:
                cells = [f"{sum(r['summin', 0, 0.0] for r in per) / total:.3f}"] + ["-"] * (len(WEIGHTS) - 1)
            else:
                cells = ["-"] + [f"{sum(r['summin', n, w] for r in per) / total:.3f}" for w in WEIGHTS[1:]]
            label = "off" if n == 0 else str(n)
            print(f"| {name} ({total}) | {label} | {copies} | {top1:.3f} / {med:.3f} | " + " | ".join(cells) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
