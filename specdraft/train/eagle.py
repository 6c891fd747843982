"""specdraft-train-eagle: train an EAGLE-3 head on the target's cached layer features.

The target stays frozen. For every training sequence (the target's own answers from
`specdraft-selfgen`, prompt + answer) it runs once and its features (the hidden states entering the
head's `aux_layers`) and greedy choices a_t are cached in resumable shards
(`specdraft.train.shard_cache`). Training then never runs the target again.

Training-time test (EAGLE-3): the head is unrolled `ttt_steps` times over a window of a sequence.
Step 0 reads the verified pairs (fc(features_j), x_{j+1}) causally, as drafting does after a
verify forward; step s >= 1 reads, at every anchor j, its own output of step s - 1 with the token
x_{j+1+s}, at position j + s, attending to the verified pairs up to j and its own chain at j
(steps 1..s): exactly what the s-th draft token after anchor j sees at inference when the drafts
before it were accepted. The loss of step s is the cross-entropy on answer positions, over the
draft vocabulary, with the target's next-token distribution there (`soft_labels`, as EAGLE-3
trains: its SOFT_TOPK most probable tokens, cached with the features) or with its choice
a_{j+1+s} alone; a position whose choice is outside the draft vocabulary is skipped. Step s
weighs decay^s. Anchors whose chains end before the answer (most of a prompt) never reach a loss:
they give step 0 its keys and values alone (`head_keys`), and only the rest are unrolled.

Held-out numbers (greedy records of the held-out split; a target choice outside the draft
vocabulary counts as a miss): per draft position the acceptance
P(step s right | steps < s right) and the expected accepted length per round at K = ttt_steps
(sum over s of P(steps 0..s right)): on greedy data the teacher-forced tokens are the drafts that
greedy drafting accepted, so these are the drafter's greedy acceptance. The head is written in
the speculators EAGLE-3 format (`specdraft.formats.eagle_head`) with how it was made.

    specdraft-train-eagle                       # the recipe (conf/train_eagle.yaml)
    specdraft-train-eagle stage=precompute      # only fill the feature cache
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from specdraft.build import target_label
from specdraft.console import hydra_cli
from specdraft.formats.eagle_head import EagleConfig, EagleHead, head_keys, save_head
from specdraft.formats.target_info import guard_cache
from specdraft.target import TargetModel
from specdraft.train.loop import TrainSettings, recipe_settings
from specdraft.train.loop import train as train_loop
from specdraft.train.losses import distill_loss
from specdraft.outputs import prepare_output_dir
from specdraft.train.shard_cache import Sequences, cached_shards, shard_digest
from specdraft.verify import leading_true
from specdraft.vocab import PrunedVocab, build_pruned_vocab


# ------------------------------------------------------------------------------- the feature cache
SOFT_TOPK = 16  # the target's most probable next tokens cached per position (the soft labels)


@dataclass(frozen=True)
class FeatureSeq:
    """One cached sequence: ids [T] int64, features [T, F] (float16 on disk), the target's greedy
    choice at every position [T] int64, its SOFT_TOPK most probable next tokens top_ids [T, k]
    int64 with their logits top_logits [T, k] (float16 on disk), and `first`: the first
    position whose choice is trained on (the one that produced the first answer token)."""

    ids: Tensor
    features: Tensor
    choice: Tensor
    first: int
    top_ids: Tensor
    top_logits: Tensor


@torch.inference_mode()
def _features(target: TargetModel, layers: Sequence[int], shard: Sequences) -> dict[str, Tensor]:
    feats, choice, top_ids, top_logits, lengths, firsts = [], [], [], [], [], []
    for ids, first in shard:
        target.reset()
        out = target.forward(ids[None].to(target.device), features=layers)  # logits [1, T, V]
        feats.append(out.features[0].half().cpu())
        choice.append(out.logits[0].argmax(-1).int().cpu())
        top = out.logits[0].topk(SOFT_TOPK, dim=-1)  # [T, k]
        top_ids.append(top.indices.int().cpu())
        top_logits.append(top.values.half().cpu())
        lengths.append(len(ids))
        firsts.append(first)
    target.reset()
    return {"features": torch.cat(feats), "choice": torch.cat(choice), "top_ids": torch.cat(top_ids),
            "top_logits": torch.cat(top_logits), "lengths": torch.tensor(lengths), "firsts": torch.tensor(firsts)}


def feature_sequences(target: TargetModel, sequences: Sequences, layers: Sequence[int], cache_dir: Path,
                      split: str) -> list[FeatureSeq]:
    """The target's features and choices for every (ids, first) sequence of `split` ("train" or
    "eval"), cached under `<split>-<layers>-top<SOFT_TOPK>` (one cache per split and layer set)."""
    name = f"{split}-" + "-".join(str(j) for j in layers) + f"-top{SOFT_TOPK}"
    parts = cached_shards(sequences, cache_dir, name, lambda shard: _features(target, layers, shard))
    out, k = [], 0
    for part in parts:
        offset = 0
        for n, first in zip(part["lengths"].tolist(), part["firsts"].tolist()):
            ids = sequences[k][0]
            span = slice(offset, offset + n)
            out.append(FeatureSeq(ids.long(), part["features"][span], part["choice"][span].long(), int(first),
                                  part["top_ids"][span].long(), part["top_logits"][span]))
            offset, k = offset + n, k + 1
    return out


def selfgen_sequences(split: str, path: str | Sequence[str] | None, max_tokens: int, greedy_only: bool = False) -> list[tuple[Tensor, int]]:
    """(prompt + answer ids, the position that produced the answer's first token) of selfgen records,
    up to max_tokens answer tokens."""
    from specdraft.train.selfgen import load_selfgen_records

    out, total = [], 0
    for r in load_selfgen_records(split, path):
        if greedy_only and r.get("mode", "greedy") != "greedy":
            continue
        if len(r["completion_ids"]) < 2:
            continue
        out.append((torch.tensor(r["prompt_ids"] + r["completion_ids"], dtype=torch.long), len(r["prompt_ids"]) - 1))
        total += len(r["completion_ids"])
        if total >= max_tokens:
            break
    return out


# ------------------------------------------------------------------------------- training-time test
def chain_mask(n: int, steps: int, dtype: torch.dtype, context: int = 0) -> Tensor:
    """Additive mask [n, context + n + steps n] of unroll step `steps` for n unrolled anchors after
    `context` anchors that are not unrolled: query j sees the verified pairs up to its own (block 0,
    context + n long) and its own chain's entries at j in blocks 1..steps."""
    idx = torch.arange(n)
    block0 = torch.arange(context + n)[None, :] <= (idx + context)[:, None]  # [n, context + n]
    ok = torch.cat([block0] + [idx[None, :] == idx[:, None]] * steps, dim=1)  # [n, context + (steps+1) n]
    return torch.zeros(ok.shape, dtype=dtype).masked_fill(~ok, float("-inf"))


class UnrollStep(NamedTuple):
    """One unroll step over a window's m unrolled anchors: logits [m, M] over the draft vocabulary;
    labels [m] the target's choice as a draft index, -100 where not trained (past the window, before
    the answer, or outside the draft vocabulary); scored [m] bool: the answer positions inside the
    window, where a held-out evaluation counts the draft (a choice outside the draft vocabulary as a
    miss); the target's top tokens there, top_index [m, k] as draft indices (-1 outside the draft
    vocabulary) with their logits top_logits [m, k]."""

    logits: Tensor
    labels: Tensor
    scored: Tensor
    top_index: Tensor
    top_logits: Tensor


def unroll(head: EagleHead, embed: nn.Module, rotary: nn.Module, seq: FeatureSeq, start: int, end: int,
           steps: int, vocab: PrunedVocab) -> list[UnrollStep]:
    """The training-time test over the window [start, end) of `seq` (module docstring): one
    UnrollStep per step s, over the anchors j = start + r .. end - 2 whose chains reach the answer
    (r = the anchors before them, which step 0 attends to but nothing unrolls)."""
    m = end - start - 1  # anchors: pair j = (features_j, x_{j+1})
    r = min(max(seq.first - start - (steps - 1), 0), m)  # anchors r.. have a chain step on the answer
    ids = seq.ids[start:end]
    hidden = head.fuse(seq.features[start : start + m][None].to(head.fc.weight.dtype))  # [1, m, H]
    cache = None
    if r:  # the anchors not unrolled: their pairs (features_j, x_{j+1}) as keys and values
        context = embed(ids[1 : r + 1][None])  # [1, r, H]
        cache = head_keys(head, context, hidden[:, :r], rotary(context, position_ids=(torch.arange(r) + start)[None]))
    hidden = hidden[:, r:]  # [1, m - r, H]
    label_pos = torch.arange(r, m)  # offsets of the unrolled anchors
    out_steps = []
    for s in range(steps):
        tok_pos = label_pos + 1 + s  # x_{j+1+s}, offsets in the window
        live = tok_pos < ids.shape[0]
        tokens = ids[tok_pos.clamp(max=ids.shape[0] - 1)][None]  # [1, m - r]
        positions = (label_pos + start + s)[None]  # [1, m - r]
        embeds = embed(tokens)
        cos_sin = rotary(embeds, position_ids=positions)
        mask = None if s == 0 else chain_mask(m - r, s, embeds.dtype, context=r)
        logits, out, cache = head(embeds, hidden, cos_sin, cache, mask)
        choice_pos = (start + tok_pos).clamp(max=seq.choice.shape[0] - 1)
        labels = vocab.index_of[seq.choice[choice_pos]]  # [m - r] draft index or -1
        scored = live & (start + tok_pos >= seq.first + 1)  # a_{j+1+s} predicts an answer token
        trained = scored & (labels >= 0)
        out_steps.append(UnrollStep(logits[0], torch.where(trained, labels, torch.full_like(labels, -100)), scored,
                                    vocab.index_of[seq.top_ids[choice_pos]], seq.top_logits[choice_pos]))
        hidden = out
    return out_steps


def step_loss(step: UnrollStep, soft_labels: bool) -> Tensor:
    """Cross-entropy of one unroll step on its trained anchors: with the target's choice, or with its
    top-k distribution renormalised over the draft vocabulary (`soft_labels`, EAGLE-3's target;
    `distill_loss`). Zero (with a graph) when the step has no trained anchor."""
    trained = step.labels >= 0  # [m]
    if not bool(trained.any()):
        return step.logits.sum() * 0.0
    if not soft_labels:
        return F.cross_entropy(step.logits, step.labels, ignore_index=-100)
    return distill_loss(step.logits[trained], step.top_logits[trained], step.top_index[trained], renormalize=True)


def windows(seqs: Sequence[FeatureSeq], window: int) -> list[tuple[int, int, int]]:
    """(sequence, start, end) training windows: each sequence's last `window` positions (the answer
    and as much of its prompt as fits), plus earlier windows when the answer is longer."""
    out = []
    for i, s in enumerate(seqs):
        end = s.ids.shape[0]
        while end > s.first + 1:
            out.append((i, max(0, end - window), end))
            end -= window - 1
    return out


def chain_acceptance(right: Tensor) -> tuple[list[float], float]:
    """From right [A, S] (step s of the chain from anchor a drafts the target's choice): per step s,
    P(step s right | steps before it right), and the mean number of drafts a chain of S accepts."""
    accepted = leading_true(right)  # [A] the accepted prefix of each anchor's chain
    depth = torch.arange(right.shape[1] + 1)  # [S + 1]
    reaching = (accepted[:, None] >= depth[None]).sum(0).double()  # [S + 1] anchors whose first s steps are right
    per_position = (reaching[1:] / reaching[:-1].clamp(min=1)).tolist()
    return per_position, float(accepted.double().mean()) if len(accepted) else 0.0


@torch.no_grad()
def evaluate(head: EagleHead, embed: nn.Module, rotary: nn.Module, seqs: Sequence[FeatureSeq], window: int,
             steps: int, vocab: PrunedVocab) -> dict[str, Any]:
    """Held-out per-position acceptance and expected accepted length (module docstring)."""
    right_all: list[Tensor] = []
    for i, start, end in windows(seqs, window):
        unrolled = unroll(head, embed, rotary, seqs[i], start, end, steps, vocab)
        valid = torch.stack([u.scored for u in unrolled], dim=1)  # [m, S]
        right = torch.stack([u.logits.argmax(-1) == u.labels for u in unrolled], dim=1)  # [m, S]: -100 never
        keep = valid.all(dim=1)  # anchors whose whole chain is on answer positions
        right_all.append(right[keep])
    right = torch.cat(right_all) if right_all else torch.zeros((0, steps), dtype=torch.bool)
    per_position, expected = chain_acceptance(right)
    return {"anchors": int(right.shape[0]), "acceptance_per_position": [round(x, 4) for x in per_position],
            "expected_accepted_length": round(expected, 4),
            "top1_per_step": [round(float(x), 4) for x in right.double().mean(0).tolist()] if len(right) else []}


def new_head(target: TargetModel, vocab: PrunedVocab, layers: Sequence[int], seed: int) -> EagleHead:
    """A fresh head: its lm_head rows and final norm start from the target's (the same output
    space), the rest from a small random init."""
    config = EagleConfig.for_target(target, vocab.size, layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = EagleHead(config, d2t=vocab.ids - torch.arange(vocab.size))
        for name, p in head.named_parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.lm_head.weight.detach().float().cpu()[vocab.ids])
        head.norm.copy_(target.model.base_model.norm.weight.detach().float().cpu())
    return head.float()


def run_identity(cfg: DictConfig, vocab: PrunedVocab, wins: Sequence[tuple[int, int, int]]) -> dict[str, Any]:
    """What a training run trains, for its checkpoint: the head's settings, the schedule (not the
    step or time budget), the draft vocabulary and the training windows (the data)."""
    settings = OmegaConf.to_container(OmegaConf.masked_copy(
        cfg, ["aux_layers", "ttt_steps", "decay", "soft_labels", "window", "seed"]), resolve=True)
    schedule = {k: v for k, v in OmegaConf.to_container(cfg.train, resolve=True).items()
                if k not in ("max_steps", "max_minutes", "eval_every", "checkpoint_every")}
    return {**settings, "schedule": schedule, "vocab": shard_digest([(vocab.ids, 0)]).item(),
            "windows": shard_digest([(torch.tensor(wins).flatten(), 0)]).item()}


def train_head(cfg: DictConfig, target: TargetModel, train_seqs: Sequence[FeatureSeq],
               eval_seqs: Sequence[FeatureSeq], vocab: PrunedVocab, ckpt: Path | None) -> tuple[EagleHead, dict]:
    """Train through the shared skeleton (schedule, budget, resumable checkpoint); each step's
    window is drawn from the step number alone."""
    settings = TrainSettings.from_config(cfg.train)
    head = new_head(target, vocab, tuple(cfg.aux_layers), int(cfg.seed))
    embed = target.model.get_input_embeddings()
    rotary = target.model.base_model.rotary_emb
    embed.requires_grad_(False)
    if ckpt is not None and not cfg.resume:
        ckpt.unlink(missing_ok=True)
    wins = windows(train_seqs, int(cfg.window))
    if not wins:
        raise ValueError("no training windows: the training sequences have no answer positions.")
    weights = [float(cfg.decay) ** s for s in range(int(cfg.ttt_steps))]

    soft = bool(cfg.soft_labels)

    def window_loss(step: int) -> tuple[Tensor, Mapping[str, float]]:
        gen = torch.Generator().manual_seed(int(cfg.seed) * 1_000_003 + step)
        i, start, end = wins[int(torch.randint(len(wins), (1,), generator=gen))]
        unrolled = unroll(head, embed, rotary, train_seqs[i], start, end, int(cfg.ttt_steps), vocab)
        losses = [step_loss(u, soft) for u in unrolled]
        total = sum(w * loss for w, loss in zip(weights, losses))
        return total, {f"s{s}": round(float(loss.detach()), 4) for s, loss in enumerate(losses)}

    def run_eval(step: int) -> dict[str, Any]:
        return evaluate(head, embed, rotary, eval_seqs, int(cfg.window), int(cfg.ttt_steps), vocab)

    run = train_loop(head, window_loss, settings, name="eagle", checkpoint=ckpt, evaluate=run_eval if eval_seqs else None,
                     identity=run_identity(cfg, vocab, wins))
    log = {"steps": run.step, "train_seconds": round(run.elapsed_s, 1), "stopped_by_budget": run.stopped_by_budget,
           "loss_every_100": [[r["step"], r["loss"]] for r in run.history if "loss" in r][::100]}
    return head.eval(), log


# ------------------------------------------------------------------------------- entry point
def run(cfg: DictConfig, target: TargetModel | None = None) -> dict[str, Any]:
    """Precompute and/or train as cfg.stage says; returns the held-out evaluation. The output
    folder is checked before the target loads."""
    if cfg.stage not in ("precompute", "train", "all"):
        raise ValueError(f"stage must be precompute, train or all, got {cfg.stage!r}.")
    TrainSettings.from_config(cfg.train)
    if cfg.stage != "precompute":
        prepare_output_dir(cfg.out_dir, bool(cfg.get("overwrite", False)))
    t_start = time.time()
    target = target if target is not None else instantiate(cfg.target)
    layers = tuple(cfg.aux_layers) if cfg.aux_layers is not None else None
    if layers is None:
        from specdraft.formats.eagle_head import default_aux_layers

        layers = default_aux_layers(target.num_layers)
    OmegaConf.set_struct(cfg, False)
    cfg.aux_layers = list(layers)
    cache = Path(cfg.cache_dir)
    guard_cache(cache, target, "cache_dir")
    d = cfg.data
    train_raw = selfgen_sequences("train", d.selfgen_path, int(d.train_tokens))
    eval_raw = selfgen_sequences("eval", d.selfgen_path, int(d.eval_tokens), greedy_only=True)
    if not train_raw:
        raise ValueError(f"no training sequences in {d.selfgen_path!r}: make them with specdraft-selfgen.")
    eval_seqs = feature_sequences(target, eval_raw, layers, cache, "eval")
    train_seqs = feature_sequences(target, train_raw, layers, cache, "train")
    if cfg.stage == "precompute":
        return {}
    vocab = build_pruned_vocab([s.choice[s.first :] for s in train_seqs], min(int(cfg.draft_vocab), target.vocab_size),
                               target.vocab_size, always_include=target.eos_token_ids)
    head, log = train_head(cfg, target, train_seqs, eval_seqs, vocab, Path(cfg.checkpoint) if cfg.checkpoint else None)
    embed, rotary = target.model.get_input_embeddings(), target.model.base_model.rotary_emb
    result = evaluate(head, embed, rotary, eval_seqs, int(cfg.window), int(cfg.ttt_steps), vocab)
    print(f"[eagle] held-out acceptance per position {result['acceptance_per_position']}, expected accepted "
          f"length {result['expected_accepted_length']} over {result['anchors']} anchors", flush=True)
    provenance = {
        "command": "specdraft-train-eagle " + " ".join(cfg.get("overrides", [])),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "data": {"train_sequences": len(train_seqs), "train_answer_tokens": sum(s.ids.shape[0] - s.first - 1 for s in train_seqs),
                 "eval_sequences": len(eval_seqs)},
        "eval": result, "wall_seconds": round(time.time() - t_start, 1), **log,
    }
    save_head(head, cfg.out_dir, target, verifier=target_label(cfg.target), speculative_tokens=int(cfg.ttt_steps),
              provenance=provenance, dtype=getattr(torch, cfg.save_dtype))
    print(f"[eagle] saved {cfg.out_dir}", flush=True)
    return result


@hydra_cli("train_eagle")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: check the output folder, load the target, then precompute / train / save."""
    run(recipe_settings(cfg))


if __name__ == "__main__":
    main()
