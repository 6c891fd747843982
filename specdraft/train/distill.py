"""Distil a small draft model from a target: `specdraft-train-draft` (conf/train_distill.yaml).

Recipe (DESIGN §8 measured that naive full-vocabulary KL is too slow on CPU):
1. Student = the target's token embeddings (shared, frozen) + a few of the target's decoder layers
   (copied, trained) + the target's final norm (trained) + a PRUNED lm_head: the target's own
   (frozen) output rows for the M most frequent tokens (`specdraft.vocab`). Which target layers
   initialise the student is chosen by measurement: every candidate in `student.init_candidates`
   is evaluated untrained on the held-out split and the best expected acceptance wins.
2. Teacher targets are cached ONCE as top-k logits per position: for the target's own greedy
   answers to chat-like prompts (self-distillation, `specdraft.train.selfgen`, captured during
   generation, or by one teacher pass saved to the same cache) and for blocks of the offline corpus
   (one batched teacher forward, or the early-exit recipe's cache: `data.exit_cache`); optionally
   on "copy chats", the answers asked for again (`specdraft.train.copy_chats`, `data.copy_chats`).
3. Loss: cross-entropy of the student's subset distribution against the teacher's top-k
   distribution (= KL(p||q) up to a constant, restricted to the tokens the student can emit).
4. Evaluation on held-out data: greedy agreement (student argmax == teacher argmax) and expected
   acceptance sum_x min(p, q) at temperature 1 (exact: q is zero outside the subset, so only
   p on the subset is needed).

Output (`out_dir`): `ckpt.pt` (resumable), `hf/` (`save_pretrained`, loads with
`AutoModelForCausalLM.from_pretrained`, includes the pruned vocabulary), and, with `export_dir`,
the shipped artifact: only the NEW weights (layers + norm, float16) + `pruned_vocab.json` +
`draft.json` (how it was made); `load_draft_artifact` rebuilds the rest from the target.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import LlamaForCausalLM, PreTrainedModel

from specdraft.target import TargetModel
from specdraft.vocab import PrunedVocab

ARTIFACT_FILE = "draft.safetensors"
VOCAB_FILE = "pruned_vocab.json"
META_FILE = "draft.json"


# ==================================================================================== student
def build_student(target_model: PreTrainedModel, layer_ids: Sequence[int]) -> LlamaForCausalLM:
    """A Llama draft: the target's embeddings (shared tensor), copies of the target's decoder
    layers `layer_ids` (in order), a copy of its final norm, and an lm_head tied to the embeddings.

    Works for Llama-architecture targets (the default); other targets need their own builder.
    """
    cfg = target_model.config
    if getattr(cfg, "model_type", None) != "llama":
        raise ValueError(
            f"build_student initialises drafts from Llama targets, got model_type="
            f"{getattr(cfg, 'model_type', None)!r}; pass your own draft model to DraftModelDrafter."
        )
    n_target = int(cfg.num_hidden_layers)
    if not layer_ids or any(not 0 <= i < n_target for i in layer_ids):
        raise ValueError(f"student layer ids must be in [0, {n_target}), got {list(layer_ids)}.")
    dcfg = cfg.__class__.from_dict(cfg.to_dict())
    dcfg.num_hidden_layers = len(layer_ids)
    dcfg.tie_word_embeddings = True
    if hasattr(dcfg, "layer_types") and dcfg.layer_types is not None:
        dcfg.layer_types = [dcfg.layer_types[i] for i in layer_ids]
    with torch.device("meta"):
        student = LlamaForCausalLM(dcfg)
    student.model.embed_tokens = target_model.get_input_embeddings()
    student.model.layers = nn.ModuleList()
    for new_idx, i in enumerate(layer_ids):
        layer = _clone_module(target_model.model.layers[i])
        layer.self_attn.layer_idx = new_idx
        layer.self_attn.config = student.config  # the clone's own config copy would ignore set_attn_implementation
        student.model.layers.append(layer)
    student.model.norm = _clone_module(target_model.model.norm)
    student.model.rotary_emb = _clone_module(target_model.model.rotary_emb)
    student.lm_head = nn.Linear(dcfg.hidden_size, dcfg.vocab_size, bias=False)
    student.lm_head.weight = student.model.embed_tokens.weight
    student.model.embed_tokens.weight.requires_grad_(False)
    return student.eval()


def _clone_module(module: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(module)


def new_weights(student: LlamaForCausalLM) -> dict[str, Tensor]:
    """The student's weights that the target does not have: decoder layers + final norm."""
    return {
        k: v.detach() for k, v in student.state_dict().items()
        if k.startswith(("model.layers.", "model.norm."))
    }


def student_sub_logits(student: LlamaForCausalLM, input_ids: Tensor, head: Tensor) -> Tensor:
    """Student logits over the pruned vocabulary [B, T, M] (head: [M, H] rows of the lm_head)."""
    hidden = student.model(input_ids=input_ids, use_cache=False).last_hidden_state  # [B, T, H]
    return hidden @ head.T


# ==================================================================================== artifact
def save_draft_artifact(
    student: LlamaForCausalLM, vocab: PrunedVocab, layer_ids: Sequence[int], export_dir: str | Path,
    meta: dict,
) -> None:
    """Write only the new weights (float16), the pruned vocabulary and how the draft was made."""
    from safetensors.torch import save_file

    out = Path(export_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.half().contiguous() for k, v in new_weights(student).items()}, str(out / ARTIFACT_FILE))
    vocab.save(out / VOCAB_FILE)
    (out / META_FILE).write_text(json.dumps({"layer_ids": list(layer_ids), **meta}, indent=2) + "\n")


def load_draft_artifact(export_dir: str | Path, target_model: PreTrainedModel) -> tuple[LlamaForCausalLM, PrunedVocab]:
    """Rebuild a draft saved by `save_draft_artifact` from the target it was distilled from."""
    from safetensors.torch import load_file

    d = Path(export_dir)
    for name in (ARTIFACT_FILE, VOCAB_FILE, META_FILE):
        if not (d / name).is_file():
            raise ValueError(
                f"draft artifact {str(d)!r} has no {name}; train one with `specdraft-train-draft "
                f"export_dir={d}` or pass an existing draft."
            )
    meta = json.loads((d / META_FILE).read_text())
    student = build_student(target_model, meta["layer_ids"])
    weights = load_file(str(d / ARTIFACT_FILE))
    dtype = target_model.get_input_embeddings().weight.dtype
    missing = student.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, strict=False)
    if missing.unexpected_keys:
        raise ValueError(f"draft artifact {str(d)!r} has unexpected weights {missing.unexpected_keys[:3]}.")
    device = target_model.get_input_embeddings().weight.device
    return student.to(device).eval(), PrunedVocab.load(d / VOCAB_FILE)


# ==================================================================================== teacher data
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
    batch_size: int = 8, log_every: int = 0,
) -> list[Example]:
    """Teacher top-k logits at positions starts[i]..T-1 of every sequence, returned in the input
    order. One batched forward per batch of similar-length sequences (taken shortest first, so little
    is padded); ragged sequences are right-padded, which causal attention ignores for the real
    positions."""
    out: list[Example | None] = [None] * len(sequences)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    t0, n = time.time(), 0
    for b in range(0, len(order), batch_size):
        chunk = order[b : b + batch_size]
        width = max(len(sequences[i]) for i in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)  # [B, T]
        for row, i in enumerate(chunk):
            ids[row, : len(sequences[i])] = sequences[i]
        target.reset()
        logits = target.forward(ids.to(target.device)).logits.float().cpu()  # [B, T, V]
        top = torch.topk(logits, top_k, dim=-1)
        for row, i in enumerate(chunk):
            pos = torch.arange(starts[i], len(sequences[i]))
            out[i] = Example(sequences[i], pos, top.values[row, pos].half(), top.indices[row, pos])
        n += sum(len(sequences[i]) for i in chunk)
        if log_every and (b // batch_size) % log_every == 0:
            print(f"[distill] teacher cache {b + len(chunk)}/{len(order)} seqs, {n / (time.time() - t0):.0f} tok/s", flush=True)
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
        ids = torch.tensor(r["prompt_ids"] + r["completion_ids"], dtype=torch.long)[:max_len]
        # the logits of generated step i sit at position len(prompt) - 1 + i
        pos = torch.arange(len(r["prompt_ids"]) - 1, len(r["prompt_ids"]) - 1 + len(r["completion_ids"]))
        keep = pos < len(ids)  # the position's input survived truncation
        examples.append(Example(ids, pos[keep], vals[keep], idx[keep].long()))
    return examples, missing


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
    from specdraft.train.early_exit import load_blocks
    from specdraft.train.selfgen import load_selfgen_sequences

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
    from specdraft.train.early_exit import cached_top_k

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


def answer_sequences(records: list[dict], max_len: int) -> tuple[list[Tensor], list[int]]:
    """Self-generated records as token sequences [T] (prompt + answer, cut at max_len) and the
    position of each one's first answer prediction (the last prompt token)."""
    return ([torch.tensor(r["prompt_ids"] + r["completion_ids"])[:max_len] for r in records],
            [len(r["prompt_ids"]) - 1 for r in records])


def _cached(cache_dir: str | None, name: str, compute):  # noqa: ANN001, ANN202
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
def distill_loss(sub_logits: Tensor, topk_values: Tensor, topk_sub: Tensor) -> Tensor:
    """Mean over positions of -sum_k p_k log q(sub_k).

    sub_logits: [N, M] student logits over the subset; topk_values: [N, k] teacher logits;
    topk_sub: [N, k] subset index of each teacher token, -1 outside the subset (weight 0).
    """
    p = torch.softmax(topk_values.float(), dim=-1) * (topk_sub >= 0)  # [N, k]
    logq = torch.log_softmax(sub_logits.float(), dim=-1).gather(-1, topk_sub.clamp(min=0))  # [N, k]
    return -(p * logq).sum(-1).mean()


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
def _batches(examples: list[Example], batch_tokens: int, rng: random.Random) -> list[list[Example]]:
    order = list(range(len(examples)))
    rng.shuffle(order)
    batches, cur, width = [], [], 0
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


def _collate(batch: list[Example], vocab: PrunedVocab) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """ids [B, T], flat (row, pos) index [N, 2], topk values [N, k], topk subset ids [N, k]."""
    width = max(len(e.ids) for e in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    where, vals, subs = [], [], []
    for i, e in enumerate(batch):
        ids[i, : len(e.ids)] = e.ids
        where.append(torch.stack([torch.full_like(e.positions, i), e.positions], dim=1))
        vals.append(e.topk_values)
        subs.append(vocab.to_subset(e.topk_indices))
    return ids, torch.cat(where), torch.cat(vals), torch.cat(subs)


@dataclass(frozen=True)
class TrainSettings:
    """Optimisation settings (flat, from conf/train_distill.yaml `train:`)."""

    steps: int = 300
    batch_tokens: int = 2048
    lr: float = 5e-4
    warmup: int = 20
    weight_decay: float = 0.0
    eval_every: int = 50
    ckpt_every: int = 25
    max_minutes: float | None = None
    seed: int = 0


def lr_at(step: int, s: TrainSettings, elapsed_s: float = 0.0) -> float:
    """Linear warmup then cosine decay to 10% of lr. Progress is the larger of step / steps and,
    with a time budget (max_minutes), elapsed / budget, so a time-limited run still anneals."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    frac = (step - s.warmup) / max(1, s.steps - s.warmup)
    if s.max_minutes:
        frac = max(frac, elapsed_s / (60 * s.max_minutes))
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def train_student(
    student: LlamaForCausalLM, vocab: PrunedVocab, train: list[Example], evals: dict[str, EvalSet],
    settings: TrainSettings, out_dir: str | Path, log: bool = True,
) -> list[dict]:
    """Train `student` in place (resuming from out_dir/ckpt.pt); returns the log of evaluations
    and losses. Checkpoints hold only the trainable weights + optimizer state."""
    from tqdm import tqdm

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    head = vocab.head(student.lm_head.weight)  # [M, H] frozen
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    step, history, elapsed0 = 0, [], 0.0
    ckpt = out / "ckpt.pt"
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        student.load_state_dict(state["weights"], strict=False)
        opt.load_state_dict(state["optimizer"])
        step, history, elapsed0 = state["step"], state["history"], state.get("elapsed_s", 0.0)
        if log:
            print(f"[distill] resumed from {ckpt} at step {step}", flush=True)
    rng = random.Random(settings.seed)
    torch.manual_seed(settings.seed)
    epoch_batches: list[list[Example]] = []
    for _ in range(step):  # replay the data order so a resumed run sees the same batches
        if not epoch_batches:
            epoch_batches = _batches(train, settings.batch_tokens, rng)
        epoch_batches.pop()
    t_start, tokens = time.time(), 0
    bar = tqdm(total=settings.steps, initial=step, disable=not log, file=sys.stdout, mininterval=10)
    student.train()
    while step < settings.steps:
        if not epoch_batches:
            epoch_batches = _batches(train, settings.batch_tokens, rng)
        ids, where, vals, subs = _collate(epoch_batches.pop(), vocab)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, settings, elapsed0 + time.time() - t_start)
        hidden = student.model(input_ids=ids, use_cache=False).last_hidden_state  # [B, T, H]
        sub_logits = hidden[where[:, 0], where[:, 1]] @ head.T  # [N, M]
        loss = distill_loss(sub_logits, vals, subs)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        tokens += int(ids.numel())
        history.append({"step": step, "loss": loss.item()})
        bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{tokens / (time.time() - t_start):.0f}")
        bar.update(1)
        elapsed = elapsed0 + time.time() - t_start
        timeout = settings.max_minutes is not None and elapsed > 60 * settings.max_minutes
        last = step >= settings.steps or timeout
        if evals and (step % settings.eval_every == 0 or last):
            student.eval()
            metrics = {name: evaluate(student, head, vocab, ev) for name, ev in evals.items()}
            student.train()
            history.append({"step": step, **metrics})
            if log:
                print(f"\n[distill] step {step} loss {loss.item():.3f} eval {metrics}", flush=True)
        if step % settings.ckpt_every == 0 or last:
            trainable = {k: v for k, v in student.state_dict().items() if k.startswith(("model.layers.", "model.norm."))}
            torch.save({"weights": trainable, "optimizer": opt.state_dict(), "step": step, "history": history, "elapsed_s": elapsed}, ckpt)
        if timeout:
            if log:
                print(f"[distill] stopping after {settings.max_minutes} minutes at step {step}", flush=True)
            break
    bar.close()
    student.eval()
    return history


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


# ==================================================================================== entry point
def run(cfg: dict, target: TargetModel | None = None) -> dict:
    """The whole recipe from a plain dict config (see conf/train_distill.yaml); returns the
    summary written to draft.json. `target` may be injected (tests use a tiny random one)."""
    from specdraft.data import corpus_documents, token_blocks
    from specdraft.models import load_target
    from specdraft.train.repeats import induction_warmup, repeat_examples, repeat_sequences, token_pool
    from specdraft.train.selfgen import load_selfgen_records
    from specdraft.vocab import build_pruned_vocab

    torch.manual_seed(cfg["seed"])
    torch.set_num_threads(int(cfg.get("threads", 1)))
    t0 = time.time()
    target = target or load_target(cfg["target"], device="cpu")
    for p in target.model.parameters():
        p.requires_grad_(False)
    d, s, v = cfg["data"], cfg["student"], cfg["vocab"]
    top_k, max_len = int(d["top_k"]), int(d["max_len"])

    # ---- data: self-generated answers (top-k cached during generation) + corpus blocks
    train_ex: list[Example] = []
    eval_data: dict[str, tuple[list[Tensor], list[int]]] = {}
    vocab_tokens: list[Tensor] = []
    vocab_weights: list[float] = []
    repeat = int(d.get("selfgen_repeat", 1))
    if repeat < 1:
        raise ValueError(f"data.selfgen_repeat must be a whole number >= 1, got {repeat}; "
                         "use data.selfgen=false to leave the answers out.")
    if int(d.get("copy_chats", 0)) and (target.tokenizer is None or not d.get("selfgen")):
        raise ValueError("data.copy_chats repeats the target's answers in its chat template: it needs data.selfgen "
                         "and the target's tokenizer; set data.copy_chats=0.")
    if d.get("selfgen"):
        recs = load_selfgen_records("train", d["selfgen"] if d["selfgen"] is not True else None)
        ex, missing = selfgen_examples(recs, d.get("selfgen_cache"), max_len)
        if missing and d.get("selfgen_cache"):  # a fresh machine: one teacher pass, kept for the next run
            print(f"[distill] teacher top-{top_k} for {len(missing)} answers -> "
                  f"{cache_selfgen_topk(target, missing, d['selfgen_cache'], top_k)}", flush=True)
            ex, missing = selfgen_examples(recs, d["selfgen_cache"], max_len)
        if missing:
            ex += teacher_examples(target, *answer_sequences(missing, max_len), top_k, log_every=10)
        train_ex += ex * repeat  # weight the answers against a large corpus
        vocab_tokens += [e.ids for e in ex]
        vocab_weights += [float(v.get("selfgen_weight", 1.0))] * len(ex)
        ev_recs = load_selfgen_records("eval", d["selfgen"] if d["selfgen"] is not True else None)
        ev_recs = ev_recs[: int(d["eval_selfgen"])]
        eval_data["selfgen"] = answer_sequences(ev_recs, max_len)
        print(f"[distill] self-distillation: {len(ex)} answers, {sum(len(e.positions) for e in ex)} positions", flush=True)
        copies = int(d.get("copy_chats", 0))
        if copies:  # the answers asked for again: positions that reward copying from the context
            from specdraft.train.copy_chats import copy_chat_sequences

            cmax = int(d.get("copy_max_len", 640))
            seqs, starts = copy_chat_sequences(recs, target.tokenizer, target.eos_token_ids, copies, cmax, int(cfg["seed"]))
            digest = hashlib.sha1(b"".join(q.numpy().tobytes() for q in seqs)).hexdigest()[:12]  # the exact chats
            ex = _cached(d.get("teacher_cache"), f"copy-{len(seqs)}-{digest}-top{top_k}.pt",
                         lambda: teacher_examples(target, seqs, starts, top_k, log_every=10))
            train_ex += ex
            print(f"[distill] copy chats: {len(ex)} repeated answers, {sum(len(e.positions) for e in ex)} positions", flush=True)
    if int(d["corpus_tokens"]) > 0:
        tok = target.tokenizer
        if tok is None:
            raise ValueError("corpus distillation needs the target's tokenizer; set data.corpus_tokens=0 or load a target with one.")
        bs = int(d["block_size"])
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
        train_ex += ex
        vocab_tokens.append(blocks)
        vocab_weights.append(1.0)
        ev_blocks = token_blocks(tok, corpus_documents("eval"), bs, int(d["eval_corpus_tokens"]))
        eval_data["corpus"] = (list(ev_blocks), [0] * len(ev_blocks))
        print(f"[distill] corpus: {len(blocks)} blocks of {bs}", flush=True)
    for seqs in d.get("sequences") or []:  # in-memory token sequences (tests)
        train_ex += teacher_examples(target, list(seqs["train"]), [0] * len(seqs["train"]), top_k)
        vocab_tokens.append(seqs["train"])
        vocab_weights.append(1.0)
        eval_data[seqs.get("name", "sequences")] = (list(seqs["eval"]), [0] * len(seqs["eval"]))
    if not train_ex or not eval_data:
        raise ValueError("no training or evaluation data: enable data.selfgen, data.corpus_tokens or pass sequences.")

    # ---- pruned vocabulary, eval set, initialisation by measurement
    init_from = s.get("init_from")  # continue from an exported draft: its layers and its pruned vocabulary
    if init_from:
        init_student, init_vocab = load_draft_artifact(init_from, target.model)
        init_layers = json.loads((Path(init_from) / META_FILE).read_text())["layer_ids"]
    if int(v.get("corpus_tokens", 0)) > 0 and target.tokenizer is not None and not init_from:  # counted, no teacher
        vocab_tokens.append(token_blocks(target.tokenizer, corpus_documents("train"), 1024, int(v["corpus_tokens"])))
        vocab_weights.append(1.0)
    always = list(target.eos_token_ids) + list(v.get("always_include") or [])
    size = min(int(v["size"]), target.vocab_size)
    vocab = init_vocab if init_from else build_pruned_vocab(vocab_tokens, size, target.vocab_size, always, vocab_weights)
    repeats, warmup = int(d.get("repeats", 0)), int(d.get("induction_warmup_steps", 0))
    spans = int(d.get("repeat_min_span", 16)), int(d.get("repeat_max_span", 96))
    pool = token_pool(vocab.ids, int(d.get("repeat_pool", 4000)), always) if repeats or warmup else None
    if repeats:  # synthetic copying: a one-hot teacher on the copied token (specdraft.train.repeats)
        train_ex += repeat_examples(pool, repeats, *spans, top_k, int(cfg["seed"]))
        ev_seqs = repeat_sequences(pool, 16, *spans, int(cfg["seed"]) + 1)
        eval_data["repeats"] = (ev_seqs, [len(q) // 2 for q in ev_seqs])
        print(f"[distill] repeated random sequences: {repeats} of 2 x {spans} tokens from {pool.numel()} tokens", flush=True)
    evals = {name: make_eval_set(target, seqs, starts, vocab) for name, (seqs, starts) in eval_data.items()}
    coverage = {name: round(vocab.coverage(ev.argmax), 4) for name, ev in evals.items()}
    print(f"[distill] pruned vocab {vocab.size}/{target.vocab_size} covers held-out teacher argmax: {coverage}", flush=True)
    if init_from:
        layer_ids, student = init_layers, init_student
        init_results = [{"init_from": str(init_from), "layer_ids": layer_ids, **evaluate_all(student, vocab, evals)}]
    else:
        layer_ids, init_results = choose_init(target.model, s["init_candidates"], vocab, evals)
        student = build_student(target.model, layer_ids)
    print(f"[distill] initialisation: {init_results} -> {layer_ids}", flush=True)
    for p in student.parameters():
        p.requires_grad_(False)
    for name, p in student.named_parameters():
        if name.startswith(("model.layers.", "model.norm.")):
            p.requires_grad_(True)

    induction = None
    if warmup and not (Path(cfg["out_dir"]) / "ckpt.pt").is_file():  # a resumed run has its weights already
        induction = induction_warmup(student, vocab, pool, warmup, *spans, seed=int(cfg["seed"]), log=bool(cfg.get("log", True)))
        print(f"[distill] induction warm-up: {induction}", flush=True)
    settings = TrainSettings(**{k: cfg["train"][k] for k in TrainSettings.__dataclass_fields__ if k in cfg["train"]})
    history = train_student(student, vocab, train_ex, evals, settings, cfg["out_dir"], log=bool(cfg.get("log", True)))
    final = evaluate_all(student, vocab, evals)
    summary = {
        "target": str(cfg["target"]),
        "command": cfg.get("command", ""),
        "init_candidates": init_results,
        "induction_warmup": induction,
        "pruned_vocab_size": vocab.size,
        "pruned_vocab_coverage": coverage,
        "train_positions": sum(len(e.positions) for e in train_ex),
        "train_steps": next((h["step"] for h in reversed(history) if "loss" in h), 0),
        "final_loss": next((h["loss"] for h in reversed(history) if "loss" in h), None),
        "held_out": final,
        "wall_minutes": round((time.time() - t0) / 60, 1),
        "config": {**{k: cfg[k] for k in ("seed", "student", "vocab", "train") if k in cfg},
                   "data": {k: val for k, val in d.items() if k != "sequences"}},
        "history": [h for h in history if "loss" not in h],
    }
    out = Path(cfg["out_dir"])
    student.save_pretrained(out / "hf")
    vocab.save(out / "hf" / VOCAB_FILE)
    (out / META_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    if cfg.get("export_dir"):
        save_draft_artifact(student, vocab, layer_ids, cfg["export_dir"], summary)
    print(f"[distill] done: {final}", flush=True)
    return summary


def main() -> None:
    """`specdraft-train-draft` (Hydra, conf/train_distill.yaml)."""
    import hydra
    from omegaconf import OmegaConf

    @hydra.main(version_base="1.3", config_path="pkg://conf", config_name="train_distill")
    def _main(cfg) -> None:  # noqa: ANN001 - DictConfig
        plain = OmegaConf.to_container(cfg, resolve=True)
        plain["command"] = "specdraft-train-draft " + " ".join(sys.argv[1:])
        run(plain)

    _main()
