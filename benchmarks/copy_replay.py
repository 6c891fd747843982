"""Replay model-free drafters on the target's recorded greedy outputs, and the ceiling of copying.

    .venv/bin/python benchmarks/copy_replay.py [--suites repeated general] [--outputs outputs/copy_replay.json]

Step 1 (once, cached in --outputs): the default target's greedy answers to every turn of the suites, in bench
order (the n-gram drafter makes them; greedy output is the target's own). Step 2, no model: every drafter is
replayed on those outputs in the same order - each round it proposes, the longest correct prefix (or tree path)
is accepted, the target's token follows - and a round costs T_v(n) / T_v(0) of the target's measured verify-cost
curve for its n drafted tokens. The printed numbers are therefore modelled speedups (new tokens per unit of
verify cost), not wall-clock ones: they show how many rounds each drafter saves, free of machine noise.
`ceiling` is an oracle that knows the true output: each round it copies, from any earlier occurrence of the
newest token in this request or any earlier output, the continuation that agrees longest with the truth. No
drafter that copies what it has seen can save more rounds.

`recycling` rows replay Token Recycling (Luo et al., 2024): an adjacency table {token: the target's top-k
next tokens the last time that token was an input}, filled from every position the target kept (prompt and
output, teacher-forced once per record and cached next to the outputs: the same ids the verify forward would hand
over) and kept across requests; the chain follows the top-1 entries, the tree expands the top entries breadth
first (widths per depth) up to a node budget. Measured to see whether the target's own earlier predictions are a
second source worth building into a drafter (they are not on this target: RESULTS "Suffix decoding").
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch

from drafters.ngram import NGramDrafter
from drafters.suffix import SuffixDrafter
from specdraft import costs
from specdraft.bench import Run, answer_text, visible_text
from specdraft.decode import SpeculativeDecoder
from specdraft.draft_length import make_draft_length_policy, non_decreasing
from specdraft.models import load_target
from specdraft.protocol import Draft, DraftContext, Drafter
from specdraft.sampling import SamplingConfig
from specdraft.suites import load_suite
from specdraft.target import TargetModel
from specdraft.train.distill import teacher_examples
from specdraft.tree import greedy_verify_tree, tree_depths
from specdraft.verify import greedy_verify


def record_outputs(suites: list[str], max_new: int) -> list[dict[str, Any]]:
    """Greedy outputs of every turn of the suites (multi-turn: the earlier answers appended)."""
    target = load_target("smollm2-135m", device="cpu")
    tok = target.tokenizer
    decoder = SpeculativeDecoder(target, NGramDrafter(), num_draft_tokens=4)
    out = []
    for suite in suites:
        for prompt in load_suite(suite):
            answers: list[str] = []
            for turn in range(prompt.num_turns):
                ids = prompt.token_ids(tok, answers)
                new = decoder.generate(ids, prompt.max_new_tokens or max_new, learn=False).token_ids[0].tolist()
                out.append({"suite": suite, "id": prompt.turn_id(turn + 1), "category": prompt.category,
                            "prompt": ids, "output": new})
                answers.append(answer_text(Run(0.0, new), visible_text(tok), tok, max_new))
    return out


def target_topk(records: list[dict[str, Any]], target: TargetModel, k: int, path: Path) -> list[torch.Tensor]:
    """Per record [T, k] int64: the target's top-k next tokens after every position of prompt + output
    (teacher-forced, `teacher_examples`; row p predicts token p + 1), cached in `path` (recomputed when the
    cache does not fit the records)."""
    sequences = [torch.tensor(r["prompt"] + r["output"]) for r in records]
    if path.is_file():
        tops = torch.load(path)
        if [t.shape[0] for t in tops] == [s.shape[0] for s in sequences]:
            return tops
    tops = [e.topk_indices for e in teacher_examples(target, sequences, [0] * len(sequences), k)]
    torch.save(tops, path)
    return tops


class RecyclingReplay:
    """Token Recycling over recorded top-k (module docstring), optionally after an n-gram copy: with
    `ngram`, a round whose n-gram lookup finds a match drafts the copy (a chain then extends it from the
    table); only a round without one drafts from the table. `tree_widths` None = a chain."""

    needs_target_hidden: ClassVar[bool] = False
    feature_layers: tuple[int, ...] = ()
    draft_sources: tuple[str, ...] = ()
    hf_counterpart: ClassVar[str | None] = None
    verify_curve_tokens: ClassVar[int] = 0
    sizes_own_drafts: ClassVar[bool] = False
    batched: ClassVar[bool] = False

    def __init__(self, tops: list[torch.Tensor], ngram: bool, tree_widths: tuple[int, ...] | None = None) -> None:
        self.tops, self.tree_widths = tops, tree_widths
        self.ngram = NGramDrafter() if ngram else None
        self.table: dict[int, list[int]] = {}  # token -> the target's top-k after its latest kept occurrence
        self.record, self.seen = -1, 0  # record being replayed (replay resets once per record, in order)

    def bind(self, target: TargetModel) -> None:
        if self.ngram is not None:
            self.ngram.bind(target)

    def reset(self) -> None:
        self.record, self.seen = self.record + 1, 0
        if self.ngram is not None:
            self.ngram.reset()

    def learn(self, token_ids: torch.Tensor, prompt_len: int) -> dict[str, Any]:
        return {}

    def keep_rows(self, rows: Any) -> None:
        pass

    def commit(self, ctx: DraftContext, num_accepted: Any) -> None:
        if self.ngram is not None:
            self.ngram.commit(ctx, num_accepted)

    def source_of(self, ctx: DraftContext) -> list[int]:
        """One source."""
        return [0] * ctx.batch_size

    def propose(self, ctx: DraftContext, num_tokens: int) -> Draft:
        toks = ctx.token_ids[0].tolist()
        top = self.tops[self.record]
        for p in range(self.seen, len(toks) - 1):  # every kept position but the newest token's
            self.table[toks[p]] = top[p].tolist()
        self.seen = max(self.seen, len(toks) - 1)
        copy = self.ngram.propose(ctx, num_tokens).token_ids[0].tolist() if self.ngram is not None else []
        if self.tree_widths is None:  # a chain: the copy (if any), then the table's top-1 after its last token
            out = list(copy)
            while len(out) < num_tokens and (out or toks)[-1] in self.table:
                out.append(self.table[(out or toks)[-1]][0])
            return Draft(torch.tensor([out], dtype=torch.long))
        if copy:  # a tree only where the n-gram lookup found nothing
            return Draft(torch.tensor([copy], dtype=torch.long))
        nodes: list[int] = []
        parents: list[int] = []
        frontier = [(-1, toks[-1])]
        for width in self.tree_widths:
            nxt = []
            for parent, tok in frontier:
                for child in self.table.get(tok, [])[:width][: num_tokens - len(nodes)]:
                    nodes.append(child)
                    parents.append(parent)
                    nxt.append((len(nodes) - 1, child))
            frontier = nxt
        if not nodes:
            return Draft(torch.zeros((1, 0), dtype=torch.long))
        return Draft(torch.tensor([nodes]), parents=torch.tensor([parents]))


def accepted(draft: Draft, truth: list[int], vocab: int) -> int:
    """Draft tokens the decoder's own greedy verifier keeps (chain or tree) when the target's argmax
    after every position is the true continuation (one-hot logits [1, N+1, V] built from it)."""
    n = draft.num_tokens
    # row r of [newest] + nodes must argmax to the truth at its depth (a chain: depth r)
    depths = list(range(n + 1)) if draft.parents is None else [0, *tree_depths(draft.parents[0].tolist())]
    logits = torch.zeros((1, n + 1, vocab))
    logits[0, torch.arange(n + 1), torch.tensor([truth[d] for d in depths])] = 1.0
    if draft.parents is None:
        return int(greedy_verify(draft.token_ids, logits).num_accepted[0])
    return len(greedy_verify_tree(draft.token_ids, draft.parents, logits).path)


def replay(records: list[dict[str, Any]], make: Callable[[], Drafter], target: TargetModel, curve: list[float],
           fixed_k: int | None, max_k: int = 8, draft_cost: float = 0.02) -> dict[str, list[float]]:
    """{category: [new tokens, verify cost]} of one drafter (bound to `target`, whose forward is
    never run) replayed over the records in order."""
    drafter = make()
    drafter.bind(target)
    greedy, gen = SamplingConfig(), torch.Generator()
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in records:
        prompt, truth = r["prompt"], r["output"]
        drafter.reset()
        policy = make_draft_length_policy(fixed_k if fixed_k else "auto", max_k, curve, draft_cost)
        committed, pos, cost = list(prompt), 0, 0.0
        while pos < len(truth):
            k = policy.choose(len(truth) - pos - 1)
            n = acc = 0
            if k > 0:
                draft = drafter.propose(DraftContext(torch.tensor([committed]), None, greedy, gen), k)
                n, acc = draft.num_tokens, accepted(draft, truth[pos:], target.vocab_size)
            emitted = truth[pos : pos + acc + 1]
            committed += emitted
            pos += len(emitted)
            drafter.commit(DraftContext(torch.tensor([committed]), None, greedy, gen), [acc])
            policy.observe(n, acc)
            cost += curve[n] + draft_cost * n
        drafter.learn(torch.tensor(prompt + truth), len(prompt))
        for key in (r["category"], "overall"):
            totals[key][0] += len(truth)
            totals[key][1] += cost
    return totals


def ceiling(records: list[dict[str, Any]], curve: list[float], max_k: int = 8) -> dict[str, list[float]]:
    """The copying oracle of the module docstring, with the same cost model."""
    history: list[list[int]] = []
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in records:
        truth, context, pos, cost = r["output"], list(r["prompt"]), 0, 0.0
        while pos < len(truth):
            k = min(max_k, len(truth) - pos - 1)
            best = 0
            want = truth[pos : pos + k]
            for seq in [*history, context]:
                for i in range(len(seq) - 1):
                    if seq[i] == context[-1]:
                        n = 0
                        while n < k and i + 1 + n < len(seq) and seq[i + 1 + n] == want[n]:
                            n += 1
                        best = max(best, n)
            cost += curve[best]  # the oracle drafts exactly what will be accepted
            context += truth[pos : pos + best + 1]
            pos += best + 1
        history.append(truth)
        for key in (r["category"], "overall"):
            totals[key][0] += len(truth)
            totals[key][1] += cost
    return totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suites", nargs="+", default=["repeated", "general"])
    ap.add_argument("--outputs", type=Path, default=Path("outputs/copy_replay.json"))
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(2)
    if not args.outputs.is_file():
        args.outputs.parent.mkdir(parents=True, exist_ok=True)
        args.outputs.write_text(json.dumps(record_outputs(args.suites, args.max_new_tokens)))
    records = json.loads(args.outputs.read_text())
    target = load_target("smollm2-135m", device="cpu")
    curve = non_decreasing(costs.verify_curve(target, 32))  # as the K policy takes it
    rows = {
        "ngram (auto)": replay(records, NGramDrafter, target, curve, None),
        "suffix": replay(records, SuffixDrafter, target, curve, 8),  # it sizes its own drafts: offered 8 every round
        "suffix, no corpus": replay(records, lambda: SuffixDrafter(corpus=None), target, curve, 8),
        "suffix_tree": replay(records, lambda: SuffixDrafter(tree=True), target, curve, 8),
        "suffix_cold": replay(records, lambda: SuffixDrafter(store_tokens=0, corpus=None), target, curve, 8),
        "ceiling (copying oracle)": ceiling(records, curve),
    }
    tops = target_topk(records, target, 8, args.outputs.with_name(args.outputs.stem + "_top8.pt"))
    rows |= {
        "recycling chain": replay(records, lambda: RecyclingReplay(tops, ngram=False), target, curve, None),
        "ngram, then recycling chain": replay(records, lambda: RecyclingReplay(tops, ngram=True), target, curve, None),
        "recycling tree (8 nodes)": replay(records, lambda: RecyclingReplay(tops, False, (4, 2, 1, 1, 1)), target, curve, 8),
        "ngram, else recycling tree (6 nodes)": replay(records, lambda: RecyclingReplay(tops, True, (3, 2, 1, 1)),
                                                       target, curve, 6),
    }
    base = rows["ngram (auto)"]
    cats = ["overall", *sorted(c for c in base if c != "overall")]
    print("modelled speedup over AR (new tokens / verify cost in T_v(0) units), and / ngram\n")
    print("| method | " + " | ".join(cats) + " |")
    print("|---|" + "---|" * len(cats))
    for name, tot in rows.items():
        cells = []
        for c in cats:
            speed = tot[c][0] / tot[c][1]
            cells.append(f"{speed:.2f}" if tot is base else f"{speed:.2f} ({speed / (base[c][0] / base[c][1]):.2f})")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
