"""Distil a small draft model from a target: `specdraft-train-draft` (conf/train_distill.yaml).

Recipe (full-vocabulary KL is too slow on CPU, so everything works on a pruned vocabulary):
1. Student = the target's token embeddings (shared, frozen) + a few of the target's decoder layers
   (copied, trained) + the target's final norm (trained) + a PRUNED lm_head: the target's own
   (frozen) output rows for the M most frequent tokens (`specdraft.vocab`). Which target layers
   initialise the student is chosen by measurement: every candidate in `student.init_candidates`
   is evaluated untrained on the held-out split and the best expected acceptance wins.
2. Teacher targets are cached ONCE as top-k logits per position: for the target's own greedy
   answers to chat-like prompts (self-distillation, `specdraft.train.selfgen`, captured during
   generation, or by one teacher pass saved to the same cache) and for blocks of the offline corpus
   (one batched teacher forward, or the early-exit recipe's cache: `data.exit_cache`). With
   `data.selfgen_labels=answer` the answers need no teacher at all: the token the target wrote at each
   position is its label (sequence-level distillation), which makes millions of answer tokens
   trainable on a CPU where a teacher pass over them would take hours.
3. Loss: cross-entropy of the student's subset distribution against the teacher's top-k
   distribution (= KL(p||q) up to a constant, restricted to the tokens the student can emit),
   trained by the one skeleton `specdraft.train.loop.train` (the `train:` group); the batch of a
   step is a function of the step, so a resumed run sees the batches an uninterrupted one would.
4. Evaluation on held-out data: greedy agreement (student argmax == teacher argmax) and expected
   acceptance sum_x min(p, q) at temperature 1 (exact: q is zero outside the subset, so only
   p on the subset is needed).

`run` is the steps in order: load_data -> build_vocab -> evaluation_sets -> choose_student ->
train_student -> export. Output (`out_dir`): `ckpt.pt` (resumable), `hf/` (`save_pretrained`, loads
with `AutoModelForCausalLM.from_pretrained`, includes the pruned vocabulary), `draft.json` (the
summary, with the target's record), and, with `export_dir`, the shipped artifact
(`specdraft.formats.draft`: only the NEW weights, float16, + `pruned_vocab.json` + `draft.json`),
which the drafter rebuilds from the target. `out_dir` is by default a folder under Hydra's run
directory; a non-empty `out_dir` / `export_dir` is written only with `overwrite=true` (which also
resumes a ckpt.pt there), checked before the target loads (`specdraft.outputs`).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import Tensor
from transformers import LlamaForCausalLM, PreTrainedModel

from specdraft.build import target_label
from specdraft.console import hydra_cli
from specdraft.data import corpus_documents, token_blocks
from specdraft.formats.draft import (
    META_FILE,
    NEW_WEIGHT_PREFIXES,
    build_student,
    draft_layer_ids,
    load_draft_artifact,
    save_draft_artifact,
)
from specdraft.formats.target_info import RECORD_KEY, guard_cache, target_info
from specdraft.shipped import require_artifact
from specdraft.target import TargetModel
from specdraft.train.early_exit import cached_top_k, load_blocks
from specdraft.train.loop import TrainLog, TrainSettings, train
from specdraft.train.losses import distill_loss
from specdraft.outputs import prepare_output_dir
from specdraft.train.selfgen import load_selfgen_records, load_selfgen_sequences
from specdraft.vocab import VOCAB_FILE, PrunedVocab, build_pruned_vocab


# ==================================================================================== student
def student_sub_logits(student: LlamaForCausalLM, input_ids: Tensor, head: Tensor) -> Tensor:
    """Student logits over the pruned vocabulary [B, T, M] (head: [M, H] rows of the lm_head)."""
    hidden = student.model(input_ids=input_ids, use_cache=False).last_hidden_state  # [B, T, H]
    return hidden @ head.T


# ==================================================================================== teacher data
SELFGEN_LABELS = ("teacher", "answer")  # data.selfgen_labels: what a self-generated answer is trained against


@dataclass(frozen=True)
class Example:
    """A token sequence with cached teacher top-k logits at some of its positions.

    ids: [T] int64; positions: [n] indices t whose next-token distribution is known;
    topk_values: [n, k] float16 teacher logits; topk_indices: [n, k] int64 target token ids.
    """

    ids: Tensor
    positions: Tensor
    topk_values: Tensor
    topk_indices: Tensor


@torch.inference_mode()
def teacher_examples(
    target: TargetModel, sequences: Sequence[Tensor], starts: Sequence[int], top_k: int,
    batch_size: int = 8, log_every: int = 0, max_batch_tokens: int = 8192,
) -> list[Example]:
    """Teacher top-k logits at positions starts[i]..T-1 of every sequence, returned in the input
    order. One batched forward per batch of similar-length sequences (taken shortest first, so little
    is padded, at most max_batch_tokens padded positions unless one sequence is longer, so long
    documents do not need gigabytes of logits); ragged sequences are right-padded, which causal
    attention ignores for the real positions."""
    out: list[Example | None] = [None] * len(sequences)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    chunks: list[list[int]] = []  # at most batch_size rows and, past one row, max_batch_tokens padded positions
    for i in order:
        if chunks and len(chunks[-1]) < batch_size and (len(chunks[-1]) + 1) * len(sequences[i]) <= max_batch_tokens:
            chunks[-1].append(i)
        else:
            chunks.append([i])
    t0, n, done = time.time(), 0, 0
    for b, chunk in enumerate(chunks):
        width = max(len(sequences[i]) for i in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)  # [B, T]
        for row, i in enumerate(chunk):
            ids[row, : len(sequences[i])] = sequences[i]
        target.reset()
        logits = target.forward(ids.to(target.device)).logits.float().cpu()  # [B, T, V]
        top = torch.topk(logits, top_k, dim=-1)
        for row, i in enumerate(chunk):
            pos = torch.arange(min(starts[i], len(sequences[i])), len(sequences[i]))  # none if cut before the start
            out[i] = Example(sequences[i], pos, top.values[row, pos].half(), top.indices[row, pos])
        n, done = n + sum(len(sequences[i]) for i in chunk), done + len(chunk)
        if log_every and b % log_every == 0:
            print(f"[distill] teacher cache {done}/{len(order)} seqs, {n / (time.time() - t0):.0f} tok/s", flush=True)
    target.reset()
    return out  # type: ignore[return-value]  # every slot is filled


def selfgen_examples(records: list[dict], cache_dir: str | Path | None, max_len: int) -> tuple[list[Example], list[dict]]:
    """Examples from self-generated records whose top-k was captured during generation; returns
    (examples, records that have no cached top-k and need a teacher forward)."""
    cached: dict[str, tuple[Tensor, Tensor]] = {}
    if cache_dir is not None and Path(cache_dir).is_dir():
        for shard in sorted(Path(cache_dir).glob("topk-*.pt")):
            cached.update(torch.load(shard))
    examples, missing = [], []
    for r in records:
        if r["id"] not in cached:
            missing.append(r)
            continue
        vals, idx = cached[r["id"]]
        ids, w = windowed_record(r, max_len)
        # the logits of generated step i sit at position len(prompt) - 1 + i (of the whole sequence)
        pos = torch.arange(len(r["prompt_ids"]) - 1, len(r["prompt_ids"]) - 1 + len(r["completion_ids"])) - w
        keep = (pos >= 0) & (pos < len(ids))  # the position's input is inside the window
        examples.append(Example(ids, pos[keep], vals[keep], idx[keep].long()))
    return examples, missing


def answer_label_examples(records: list[dict], max_len: int) -> list[Example]:
    """Examples whose label at every answer position is the token the target wrote there (one-hot:
    top-1 with the full weight), read from the records alone: sequence-level distillation (Kim & Rush,
    2016), no teacher pass. A greedy answer's token is the target's argmax, which is what greedy
    drafting must match; a sampled answer's token is a draw from p, an unbiased estimate of the
    soft target's gradient. This is what makes millions of answer tokens trainable on a CPU."""
    examples = []
    for ids, first in zip(*answer_sequences(records, max_len), strict=True):  # first: predicts the first answer token
        pos = torch.arange(max(first, 0), len(ids) - 1)  # [n] positions whose next token is an answer token
        labels = ids[pos + 1]  # [n]
        examples.append(Example(ids, pos, torch.zeros((len(pos), 1), dtype=torch.float16), labels[:, None]))
    return examples


def cache_selfgen_topk(target: TargetModel, records: list[dict], cache_dir: str | Path, top_k: int) -> Path:
    """Run the teacher over self-generated records whose top-k was not captured during generation
    and save it to cache_dir in the generation-time shard format ({id: (values [n, k] float16,
    indices [n, k] int32)}, one row per answer token), so the next run reads it instead."""
    whole = max(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in records)  # nothing cut
    examples = teacher_examples(target, *answer_sequences(records, whole), top_k, log_every=10)
    shard = {r["id"]: (e.topk_values[: len(r["completion_ids"])], e.topk_indices[: len(r["completion_ids"])].int())
             for r, e in zip(records, examples, strict=True)}
    path = Path(cache_dir) / f"topk-teacher-{len(list(Path(cache_dir).glob('topk-*.pt'))):06d}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(shard, path)
    return path


def exit_cache_stream(tokenizer: object, sources: Sequence[str], block_size: int, corpus_tokens: int) -> tuple[Tensor, int]:
    """The token stream [N, T] that `specdraft-train-early-exit` cached for `sources` (the target's
    answers first when "selfgen" is among them, then the corpus), long enough to hold corpus_tokens
    of corpus text after the answers, and the index of its first block with no answer token."""
    answers = sum(len(ids) for ids, _ in load_selfgen_sequences("train")) if "selfgen" in sources else 0
    first = -(-answers // block_size)  # ceil
    n = corpus_tokens // block_size
    if n == 0:
        raise ValueError(f"data.corpus_tokens={corpus_tokens} is less than one block of {block_size}; raise it.")
    stream = load_blocks(tokenizer, "train", (first + n) * block_size, list(sources), block_size)
    if stream.shape[0] < first + n:
        raise ValueError(f"the corpus has {(stream.shape[0] - first) * block_size} training tokens after the answers, "
                         f"fewer than data.corpus_tokens={corpus_tokens}; lower it.")
    return stream, first


def exit_cache_examples(stream: Tensor, first: int, cache_dir: str | Path) -> list[Example]:
    """Examples for the blocks stream[first:] ([N, T]) whose teacher top-k is read from the
    `precompute_teacher` cache of `stream` (the early-exit recipe's `train/` shards) instead of a
    new teacher pass: that recipe keeps the same target's top-k for every position.

    The cache stores no token ids, so the stream is checked against it: the next token must be
    among the cached top-k at most positions (a cache of another stream scores near 0)."""
    n_all, block_size = stream.shape
    values, ids = cached_top_k(Path(cache_dir).expanduser(), n_all, block_size)  # [n_all * T, k]
    values = values.view(n_all, block_size, -1)[first:]  # [N, T, k]
    ids = ids.view(n_all, block_size, -1)[first:]  # [N, T, k]
    blocks = stream[first:]  # [N, T]
    hit = (ids[:, :-1] == blocks[:, 1:, None]).any(-1).float().mean().item()  # next token in the top-k
    if hit < 0.5:
        raise ValueError(
            f"the teacher cache {str(cache_dir)!r} does not match the token stream: the next token is among its "
            f"top-k at only {hit:.1%} of positions; set data.exit_cache_sources to the sources the cache was made "
            "from (its directory name lists them), with the same target and block size."
        )
    pos = torch.arange(block_size)
    return [Example(blocks[i], pos, values[i], ids[i]) for i in range(blocks.shape[0])]


def answer_window(prompt_len: int, total_len: int, max_len: int) -> int:
    """Where a max_len window of a prompt + answer sequence starts: at 0 when it fits; else as late as
    keeps the whole answer, but never later than a quarter window before the answer's first
    prediction, so a long document prompt still leaves answer positions (with context) to train on."""
    if total_len <= max_len:
        return 0
    return max(0, min(total_len - max_len, prompt_len - 1 - max_len // 4))


def windowed_record(record: dict, max_len: int) -> tuple[Tensor, int]:
    """A self-generated record's prompt + answer ids [T <= max_len] int64 in its `answer_window`,
    and where that window starts in the whole sequence."""
    full = record["prompt_ids"] + record["completion_ids"]
    w = answer_window(len(record["prompt_ids"]), len(full), max_len)
    return torch.tensor(full[w : w + max_len], dtype=torch.long), w


def answer_sequences(records: list[dict], max_len: int) -> tuple[list[Tensor], list[int]]:
    """Self-generated records as token sequences [T] (`windowed_record`) and the position of each
    one's first answer prediction in it (the last prompt token)."""
    windows = [windowed_record(r, max_len) for r in records]
    return [ids for ids, _ in windows], [len(r["prompt_ids"]) - 1 - w for r, (_, w) in zip(records, windows, strict=True)]


def _cached(cache_dir: str | None, name: str, compute: Callable[[], list[Example]]) -> list[Example]:
    """compute() once and keep the result in cache_dir/name (None = no cache)."""
    if cache_dir is None:
        return compute()
    path = Path(cache_dir) / name
    if path.is_file():
        return [Example(*t) for t in torch.load(path)]
    out = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save([(e.ids, e.positions, e.topk_values, e.topk_indices) for e in out], path)
    return out


# ==================================================================================== loss / eval
@dataclass(frozen=True)
class EvalSet:
    """Held-out positions with the teacher's exact p restricted to the subset.

    ids: [B, T] inputs; mask: [B, T] bool positions that count; p_sub: [N, M] float16 teacher
    probabilities (temperature 1, full-vocabulary softmax) on the subset at masked positions;
    argmax: [N] teacher argmax (target ids) at masked positions.
    """

    ids: Tensor
    mask: Tensor
    p_sub: Tensor
    argmax: Tensor


@torch.inference_mode()
def make_eval_set(target: TargetModel, sequences: Sequence[Tensor], starts: Sequence[int], vocab: PrunedVocab) -> EvalSet:
    """Teacher p on the subset for evaluation (computed once)."""
    width = max(len(s) for s in sequences)
    ids = torch.zeros((len(sequences), width), dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.bool)
    for i, (s, st) in enumerate(zip(sequences, starts)):
        ids[i, : len(s)] = s
        mask[i, st : len(s)] = True
    p_sub, argmax = [], []
    for i in range(len(sequences)):
        target.reset()
        logits = target.forward(ids[i : i + 1].to(target.device)).logits[0].float().cpu()  # [T, V]
        probs = torch.softmax(logits[mask[i]], dim=-1)  # [n, V]
        p_sub.append(probs[:, vocab.ids].half())
        argmax.append(logits[mask[i]].argmax(-1))
    target.reset()
    return EvalSet(ids, mask, torch.cat(p_sub), torch.cat(argmax))


@torch.inference_mode()
def evaluate(student: LlamaForCausalLM, head: Tensor, vocab: PrunedVocab, ev: EvalSet) -> dict[str, float]:
    """Greedy agreement (top-1 match with the target) and expected acceptance sum min(p, q) at T=1."""
    agree, accept, n = 0.0, 0.0, 0
    offset = 0
    for i in range(ev.ids.shape[0]):
        m = ev.mask[i]
        logits = student_sub_logits(student, ev.ids[i : i + 1], head)[0][m]  # [n, M]
        q = torch.softmax(logits.float(), dim=-1)
        p = ev.p_sub[offset : offset + q.shape[0]].float()
        t_arg = ev.argmax[offset : offset + q.shape[0]]
        agree += float((vocab.to_target(logits.argmax(-1)) == t_arg).sum())
        accept += float(torch.minimum(p, q).sum())
        n += q.shape[0]
        offset += q.shape[0]
    return {"greedy_agreement": agree / max(n, 1), "expected_acceptance": accept / max(n, 1), "positions": n}


# ==================================================================================== training
def pack_batches(examples: Sequence[Example], batch_tokens: int, seed: int) -> list[list[Example]]:
    """The examples in a seeded random order, packed greedily into batches of at most
    `batch_tokens` padded tokens (width x rows; a longer example is a batch of its own)."""
    if batch_tokens < 1:
        raise ValueError(f"data.batch_tokens must be >= 1, got {batch_tokens}.")
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed)).tolist()
    batches: list[list[Example]] = []
    cur: list[Example] = []
    width = 0
    for i in order:
        ex = examples[i]
        w = max(width, len(ex.ids))
        if cur and w * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, w = [], len(ex.ids)
        cur.append(ex)
        width = w
    if cur:
        batches.append(cur)
    return batches


def batch_at(batches: Sequence[list[Example]], step: int, seed: int) -> list[Example]:
    """The batch of training step `step`: epoch e = step // len(batches) visits every batch once,
    in a permutation seeded by (seed, e). A function of the step alone, so resuming is exact."""
    epoch, index = divmod(step, len(batches))
    perm = torch.randperm(len(batches), generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
    return batches[int(perm[index])]


def collate(batch: Sequence[Example], vocab: PrunedVocab) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """ids [B, T] (right-padded), flat (row, pos) index [N, 2] of the scored positions, teacher
    top-k values [N, k] and their subset indices [N, k] (-1 outside the pruned vocabulary). Examples
    of different k (answer-token labels beside a teacher's top-k) are padded to the batch's largest k
    with -inf logits at index -1, which carry no teacher mass."""
    width = max(len(e.ids) for e in batch)
    k = max(e.topk_values.shape[1] for e in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    where, vals, subs = [], [], []
    for i, e in enumerate(batch):
        ids[i, : len(e.ids)] = e.ids
        where.append(torch.stack([torch.full_like(e.positions, i), e.positions], dim=1))
        pad = k - e.topk_values.shape[1]
        vals.append(torch.nn.functional.pad(e.topk_values, (0, pad), value=float("-inf")))
        subs.append(torch.nn.functional.pad(vocab.to_subset(e.topk_indices), (0, pad), value=-1))
    return ids, torch.cat(where), torch.cat(vals), torch.cat(subs)


def train_student(
    student: LlamaForCausalLM, vocab: PrunedVocab, examples: Sequence[Example], evals: Mapping[str, EvalSet],
    settings: TrainSettings, batch_tokens: int, seed: int, checkpoint: str | Path | None, log: bool = True,
) -> TrainLog:
    """Train `student`'s trainable weights in place with `specdraft.train.loop.train` (resuming from
    `checkpoint`), evaluating on every held-out set."""
    batches = pack_batches(examples, batch_tokens, seed)
    head = vocab.head(student.lm_head.weight)  # [M, H] frozen

    def step_loss(step: int) -> tuple[Tensor, dict[str, float]]:
        ids, where, vals, subs = collate(batch_at(batches, step, seed), vocab)
        hidden = student.model(input_ids=ids, use_cache=False).last_hidden_state  # [B, T, H]
        sub_logits = hidden[where[:, 0], where[:, 1]] @ head.T  # [N, M]
        # teacher tokens outside the subset are dropped (a position weighs the mass its subset covers)
        return distill_loss(sub_logits, vals, subs, renormalize=False), {"positions": float(where.shape[0])}

    def held_out(step: int) -> dict[str, dict[str, float]]:
        return {name: evaluate(student, head, vocab, ev) for name, ev in evals.items()}

    return train(student, step_loss, settings, name="distill", checkpoint=checkpoint,
                 evaluate=held_out if evals else None, log=log)


def evaluate_all(student: LlamaForCausalLM, vocab: PrunedVocab, evals: dict[str, EvalSet]) -> dict[str, dict[str, float]]:
    """`evaluate` on every named held-out set (e.g. "selfgen" chat answers, "corpus" text)."""
    head = vocab.head(student.lm_head.weight)
    return {name: evaluate(student, head, vocab, ev) for name, ev in evals.items()}


def _score(metrics: dict[str, dict[str, float]]) -> float:
    return sum(m["expected_acceptance"] for m in metrics.values()) / max(len(metrics), 1)


def choose_init(
    target_model: PreTrainedModel, candidates: Sequence[Sequence[int]], vocab: PrunedVocab, evals: dict[str, EvalSet]
) -> tuple[list[int], list[dict]]:
    """Evaluate every candidate layer list untrained; the best mean expected acceptance wins."""
    results = []
    for layer_ids in candidates:
        metrics = evaluate_all(build_student(target_model, layer_ids), vocab, evals)
        results.append({"layer_ids": list(layer_ids), "score": _score(metrics), **metrics})
    best = max(results, key=lambda r: r["score"])
    return best["layer_ids"], results


# ==================================================================================== the recipe's steps
@dataclass
class DistillData:
    """What the teacher gives the recipe: training examples, held-out sequences by name
    (sequences [T], first scored position of each), and token chunks (with weights) that rank the
    pruned vocabulary."""

    train: list[Example] = field(default_factory=list)
    held_out: dict[str, tuple[list[Tensor], list[int]]] = field(default_factory=dict)
    vocab_tokens: list[Tensor] = field(default_factory=list)
    vocab_weights: list[float] = field(default_factory=list)

    def extend(self, other: DistillData) -> None:
        self.train += other.train
        self.held_out.update(other.held_out)
        self.vocab_tokens += other.vocab_tokens
        self.vocab_weights += other.vocab_weights


def selfgen_data(target: TargetModel, d: Mapping[str, Any], weight: float) -> DistillData:
    """The target's own answers (`data.selfgen`), labelled per `data.selfgen_labels`: "teacher" =
    top-k from `data.selfgen_cache`, else one teacher pass (kept in that cache for the next run);
    "answer" = the answer's own tokens (`answer_label_examples`, no teacher pass). Each answer
    `data.selfgen_repeat` times."""
    top_k, max_len = int(d["top_k"]), int(d["max_len"])
    labels = d.get("selfgen_labels", "teacher")
    if labels not in SELFGEN_LABELS:
        raise ValueError(f"data.selfgen_labels must be one of {SELFGEN_LABELS}, got {labels!r}: \"teacher\" distils "
                         "the target's top-k (one teacher pass), \"answer\" trains on the answers' own tokens.")
    path = d["selfgen"] if d["selfgen"] is not True else None
    recs = load_selfgen_records("train", path)
    if labels == "answer":
        ex, missing = answer_label_examples(recs, max_len), []
    else:
        ex, missing = selfgen_examples(recs, d.get("selfgen_cache"), max_len)
    if missing and d.get("selfgen_cache"):  # a fresh machine: one teacher pass, kept for the next run
        print(f"[distill] teacher top-{top_k} for {len(missing)} answers -> "
              f"{cache_selfgen_topk(target, missing, d['selfgen_cache'], top_k)}", flush=True)
        ex, missing = selfgen_examples(recs, d["selfgen_cache"], max_len)
    if missing:
        ex += teacher_examples(target, *answer_sequences(missing, max_len), top_k, log_every=10)
    eval_recs = load_selfgen_records("eval", path)[: int(d["eval_selfgen"])]
    print(f"[distill] self-distillation: {len(ex)} answers, {sum(len(e.positions) for e in ex)} positions", flush=True)
    return DistillData(train=ex * int(d.get("selfgen_repeat", 1)),  # weight the answers against a large corpus
                       held_out={"selfgen": answer_sequences(eval_recs, max_len)},
                       vocab_tokens=[e.ids for e in ex], vocab_weights=[weight] * len(ex))


def corpus_data(target: TargetModel, d: Mapping[str, Any]) -> DistillData:
    """`data.corpus_tokens` of offline corpus blocks with a teacher pass (or the early-exit
    recipe's cache of it: `data.exit_cache`), and `data.eval_corpus_tokens` held out."""
    tok = target.tokenizer
    if tok is None:
        raise ValueError("corpus distillation needs the target's tokenizer; set data.corpus_tokens=0 or load a target with one.")
    bs, top_k = int(d["block_size"]), int(d["top_k"])
    if d.get("exit_cache"):  # reuse the early-exit recipe's teacher pass over the same corpus
        if d.get("extra_files"):
            raise ValueError("data.exit_cache reuses a cache of the built-in corpus; it cannot add data.extra_files "
                             "(set data.exit_cache=null to run the teacher on them).")
        stream, first = exit_cache_stream(tok, list(d["exit_cache_sources"]), bs, int(d["corpus_tokens"]))
        ex, blocks = exit_cache_examples(stream, first, d["exit_cache"]), stream[first:]
    else:
        docs = corpus_documents("train", extra_files=d.get("extra_files") or ())
        blocks = token_blocks(tok, docs, bs, int(d["corpus_tokens"]))
        ex = _cached(d.get("teacher_cache"), f"corpus-{len(blocks)}x{bs}-top{top_k}.pt",
                     lambda: teacher_examples(target, list(blocks), [0] * len(blocks), top_k, log_every=10))
    ev_blocks = token_blocks(tok, corpus_documents("eval"), bs, int(d["eval_corpus_tokens"]))
    print(f"[distill] corpus: {len(blocks)} blocks of {bs}", flush=True)
    return DistillData(train=ex, held_out={"corpus": (list(ev_blocks), [0] * len(ev_blocks))},
                       vocab_tokens=[blocks], vocab_weights=[1.0])


def sequence_data(target: TargetModel, seqs: Mapping[str, Any], top_k: int) -> DistillData:
    """In-memory token sequences {"train": [N, T], "eval": [n, T], "name"?} (`data.sequences`, tests)."""
    train_seqs = list(seqs["train"])
    return DistillData(train=teacher_examples(target, train_seqs, [0] * len(train_seqs), top_k),
                       held_out={seqs.get("name", "sequences"): (list(seqs["eval"]), [0] * len(seqs["eval"]))},
                       vocab_tokens=[seqs["train"]], vocab_weights=[1.0])


def load_data(cfg: Mapping[str, Any], target: TargetModel) -> DistillData:
    """Step 1: every enabled data source (`data.selfgen`, `data.corpus_tokens`, `data.sequences`)."""
    d = cfg["data"]
    repeat = d.get("selfgen_repeat", 1)
    if int(repeat) != repeat or int(repeat) < 1:
        raise ValueError(f"data.selfgen_repeat must be a whole number >= 1, got {repeat}; "
                         "use data.selfgen=false to leave the answers out.")
    data = DistillData()
    if d.get("selfgen"):
        data.extend(selfgen_data(target, d, float(cfg["vocab"].get("selfgen_weight", 1.0))))
    if int(d["corpus_tokens"]) > 0:
        data.extend(corpus_data(target, d))
    for seqs in d.get("sequences") or []:
        data.extend(sequence_data(target, seqs, int(d["top_k"])))
    if not data.train or not data.held_out:
        raise ValueError("no training or evaluation data: enable data.selfgen, data.corpus_tokens or pass sequences.")
    return data


def init_from_dir(cfg: Mapping[str, Any]) -> Path | None:
    """The exported draft `student.init_from` names (a directory or a shipped name), or None."""
    spec = cfg["student"].get("init_from")
    return require_artifact(spec, "student.init_from draft") if spec else None


def build_vocab(cfg: Mapping[str, Any], target: TargetModel, data: DistillData) -> PrunedVocab:
    """Step 2: the pruned vocabulary: the `vocab.size` most frequent tokens of the training data
    (plus `vocab.corpus_tokens` of corpus text counted without a teacher), or the one of the draft
    that `student.init_from` continues unless `vocab.rebuild` (new data may need other tokens; the
    head is the target's own rows, so the draft's layers carry over to any subset)."""
    v = cfg["vocab"]
    init = init_from_dir(cfg)
    if init is not None and not v.get("rebuild", False):
        return PrunedVocab.load(init / VOCAB_FILE)
    tokens, weights = list(data.vocab_tokens), list(data.vocab_weights)
    if int(v.get("corpus_tokens", 0)) > 0 and target.tokenizer is not None:  # counted, no teacher
        tokens.append(token_blocks(target.tokenizer, corpus_documents("train"), 1024, int(v["corpus_tokens"])))
        weights.append(1.0)
    always = list(target.eos_token_ids) + list(v.get("always_include") or [])
    return build_pruned_vocab(tokens, min(int(v["size"]), target.vocab_size), target.vocab_size, always, weights)


def evaluation_sets(target: TargetModel, data: DistillData, vocab: PrunedVocab) -> dict[str, EvalSet]:
    """Step 3: the teacher's exact p on the subset for every held-out set (computed once)."""
    evals = {name: make_eval_set(target, seqs, starts, vocab) for name, (seqs, starts) in data.held_out.items()}
    print(f"[distill] pruned vocab {vocab.size}/{target.vocab_size} covers held-out teacher argmax: "
          f"{vocab_coverage(vocab, evals)}", flush=True)
    return evals


def vocab_coverage(vocab: PrunedVocab, evals: Mapping[str, EvalSet]) -> dict[str, float]:
    """Per held-out set, the fraction of the teacher's argmax tokens the pruned vocabulary contains."""
    return {name: round(vocab.coverage(ev.argmax), 4) for name, ev in evals.items()}


def choose_student(
    cfg: Mapping[str, Any], target: TargetModel, vocab: PrunedVocab, evals: Mapping[str, EvalSet]
) -> tuple[list[int], LlamaForCausalLM, list[dict]]:
    """Step 4: the student to train (layer ids, module with only its new weights trainable, the
    measurements behind the choice): the draft `student.init_from` continues, else the best
    untrained candidate of `student.init_candidates`."""
    init = init_from_dir(cfg)
    if init is not None:
        layer_ids, student = draft_layer_ids(init), load_draft_artifact(init, target)
        results = [{"init_from": str(cfg["student"]["init_from"]), "layer_ids": layer_ids, **evaluate_all(student, vocab, evals)}]
    else:
        layer_ids, results = choose_init(target.model, cfg["student"]["init_candidates"], vocab, evals)
        student = build_student(target.model, layer_ids)
    print(f"[distill] initialisation: {results} -> {layer_ids}", flush=True)
    for name, p in student.named_parameters():
        p.requires_grad_(name.startswith(NEW_WEIGHT_PREFIXES))
    return layer_ids, student, results


def export(
    cfg: Mapping[str, Any], student: LlamaForCausalLM, vocab: PrunedVocab, layer_ids: Sequence[int], summary: dict
) -> None:
    """Step 6: `out_dir/hf` (save_pretrained + pruned vocabulary), `out_dir/draft.json`, and the
    shippable artifact in `export_dir` if set."""
    out = Path(cfg["out_dir"])
    student.save_pretrained(out / "hf")
    vocab.save(out / "hf" / VOCAB_FILE)
    (out / META_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    if cfg.get("export_dir"):
        save_draft_artifact(student, vocab, layer_ids, cfg["export_dir"], summary)


def run(cfg: Mapping[str, Any], target: TargetModel | None = None) -> dict:
    """The whole recipe from a plain dict config (see conf/train_distill.yaml); returns the
    summary written to draft.json. `target` may be injected (tests use a tiny random one)."""
    t0 = time.time()
    settings = TrainSettings.from_config(cfg["train"])  # checked before any teacher pass
    overwrite = bool(cfg.get("overwrite", False))
    prepare_output_dir(cfg["out_dir"], overwrite, "out_dir")  # before the target loads
    if cfg.get("export_dir"):
        prepare_output_dir(cfg["export_dir"], overwrite, "export_dir")
    target = target or instantiate(cfg["target"])
    for p in target.model.parameters():
        p.requires_grad_(False)
    guard_cache(cfg["data"].get("teacher_cache"), target, "data.teacher_cache")
    data = load_data(cfg, target)
    vocab = build_vocab(cfg, target, data)
    evals = evaluation_sets(target, data, vocab)
    layer_ids, student, init_results = choose_student(cfg, target, vocab, evals)
    log = train_student(student, vocab, data.train, evals, settings, int(cfg["data"]["batch_tokens"]),
                        int(cfg["seed"]), Path(cfg["out_dir"]) / "ckpt.pt", log=bool(cfg.get("log", True)))
    final = evaluate_all(student, vocab, evals)
    losses = [row["loss"] for row in log.history if "loss" in row]
    name = target_label(cfg["target"]) if isinstance(cfg["target"], Mapping) else str(cfg["target"])
    summary = {
        "target": name,
        RECORD_KEY: target_info(target, name),
        "command": cfg.get("command", ""),
        "init_candidates": init_results,
        "pruned_vocab_size": vocab.size,
        "pruned_vocab_coverage": vocab_coverage(vocab, evals),
        "train_positions": sum(len(e.positions) for e in data.train),
        "train_steps": log.step,
        "final_loss": losses[-1] if losses else None,
        "held_out": final,
        "wall_minutes": round((time.time() - t0) / 60, 1),
        "config": {**{k: cfg[k] for k in ("seed", "student", "vocab", "train") if k in cfg},
                   "data": {k: val for k, val in cfg["data"].items() if k != "sequences"}},
        "history": log.evals,
    }
    export(cfg, student, vocab, layer_ids, summary)
    print(f"[distill] done: {final}", flush=True)
    return summary


@hydra_cli("train_distill")
def main(cfg: DictConfig) -> None:
    """`specdraft-train-draft` (Hydra, conf/train_distill.yaml): seeds and threads, then `run`."""
    torch.set_num_threads(int(cfg.threads))
    torch.manual_seed(int(cfg.seed))
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain["command"] = "specdraft-train-draft " + " ".join(sys.argv[1:])
    run(plain)


if __name__ == "__main__":
    main()
