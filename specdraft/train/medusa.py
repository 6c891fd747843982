"""specdraft-train-medusa: train Medusa heads with PEFT on cached target hidden states.

The target stays frozen. Its last-layer (post-norm) hidden states h_t and greedy choices
a_t = argmax lm_head(h_t) are computed ONCE per sequence and cached in shards on disk (resumable);
training then never runs the decoder again. Head k (0-based) reads h_t and learns the target's
choice two-plus-k positions ahead, a_{t+k+1} (h_t itself produced x_{t+1}):

    loss = sum_k decay^k * CE(head_k(h_t), a_{t+k+1})            (loss=ce, default)
    loss = sum_k decay^k * KL(softmax(lm_head(h_{t+k+1})) || head_k(h_t))   (loss=kl)

recurrent=true trains Hydra-style heads (specdraft.formats.medusa_heads): head k also reads the tokens before
it, teacher-forced with the sequence's own tokens y_k = x_{t+k+1} (on the target's greedy
generations these are its choices a_{t+k}, exactly what an accepted draft prefix holds).

Data: the target's own greedy generations (`specdraft.train.selfgen`, completion positions only) and
blocks of the offline stdlib corpus; each has a held-out split on which per-head top-1 / top-5
agreement with the target is reported. PEFT: `modules_to_save` for the blocks, LoRA for the shared
projections (`lora_config`). The steps run through the one training skeleton
(`specdraft.train.loop.train`: schedule, time budget `train.max_minutes`, resumable checkpoint,
progress bar); each step's batch is drawn from the step number alone, so a resumed run sees the
batches an uninterrupted one would. Output (`specdraft.formats.medusa_heads`): a PEFT adapter
directory + medusa_config.json (with the target's record) + provenance.json (how it was made) +
accuracy.json (per-head top-k accuracies, which choose the candidate tree) + pruned_vocab.json, in
`out_dir`: by default a folder under Hydra's run directory; a non-empty one (e.g. the shipped heads'
folder) only with `overwrite=true`, checked before the target loads (`specdraft.outputs`). The
hidden-state cache records its target too (`specdraft.formats.target_info.guard_cache`).

    specdraft-train-medusa                      # the shipped heads' recipe (see conf/train_medusa.yaml)
    specdraft-train-medusa stage=precompute     # only fill the hidden-state cache
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from drafters.medusa_forms import CompiledHeads
from specdraft.build import target_label
from specdraft.console import hydra_cli
from specdraft.formats.medusa_heads import MedusaHeads, save_accuracy, save_heads
from specdraft.formats.target_info import guard_cache, target_info
from specdraft.linear_formats import cpu_has_bf16
from specdraft.target import TargetModel
from specdraft.train.loop import TrainLog, TrainSettings, recipe_settings
from specdraft.train.loop import train as train_loop
from specdraft.outputs import prepare_output_dir
from specdraft.train.shard_cache import cached_shards
from specdraft.vocab import VOCAB_FILE, PrunedVocab, build_pruned_vocab

TOPK_STATS = 10  # accuracy of each head's rank-0..9 candidates (chooses the tree)


# ------------------------------------------------------------------------------- hidden cache
@dataclass(frozen=True)
class HiddenSet:
    """Cached target states of many sequences, concatenated.

    hidden: [N, H] float16 post-norm last-layer hidden state of every position, as cached (float16
        halves the memory of a million-position set; `states` hands out float32 rows).
    choice: [N] int64 target's greedy next token a_t = argmax lm_head(h_t).
    end: [N] int64 end (exclusive) of the sequence that position t belongs to.
    use: [N] bool whether position t is a training/eval input (e.g. completion positions only).
    ids: [N] int64 the token at every position (x_t; recurrent heads read x_{t+1..t+K}).
    """

    hidden: Tensor
    choice: Tensor
    end: Tensor
    use: Tensor
    ids: Tensor

    def states(self, idx: Tensor) -> Tensor:
        """float32 hidden states [M, H] of positions idx [M] (float16 -> float32 is exact)."""
        return self.hidden[idx].float()

    def _ahead(self, idx: Tensor, num_heads: int) -> tuple[Tensor, Tensor]:
        """(positions t + k + 1 of head k at positions idx [M], clamped to the data [M, K];
        whether each is still inside its sequence [M, K])."""
        pos = idx[:, None] + torch.arange(1, num_heads + 1)[None]  # [M, K]
        return pos.clamp(max=len(self.choice) - 1), pos < self.end[idx][:, None]

    def labels(self, idx: Tensor, num_heads: int) -> Tensor:
        """Targets [M, K] for head k at positions idx [M]: a_{t+k+1}, or -1 past the sequence end."""
        pos, valid = self._ahead(idx, num_heads)
        return torch.where(valid, self.choice[pos], torch.full_like(pos, -1))

    def path_tokens(self, idx: Tensor, num_heads: int) -> Tensor:
        """Recurrent heads' inputs [M, K] at positions idx [M]: y_k = x_{t+k+1}, the token after
        which head k guesses a_{t+k+1} (teacher forcing; past the sequence end the label is -1)."""
        return self.ids[self._ahead(idx, num_heads)[0]]

    def inputs(self, num_heads: int) -> Tensor:
        """Positions usable as inputs: marked `use` and with a label for head 0."""
        n = torch.arange(len(self.choice))
        return n[self.use & (n + 1 < self.end)]


@torch.inference_mode()
def precompute(
    target: TargetModel,
    sequences: Sequence[tuple[Tensor, int]],
    cache_dir: Path,
    name: str,
    shard_tokens: int = 8192,
) -> HiddenSet:
    """Run the target once over every (ids [T], first input position) and cache h_t, a_t in
    resumable shards (`specdraft.train.shard_cache`)."""
    parts = cached_shards(sequences, cache_dir, name, lambda shard: _states(target, shard), shard_tokens)
    return HiddenSet(
        hidden=torch.cat([p["hidden"] for p in parts]).half(),
        choice=torch.cat([p["choice"] for p in parts]).long(),
        end=torch.cat(_ends(parts)),
        use=torch.cat([p["use"] for p in parts]),
        ids=torch.cat([ids.long().cpu() for ids, _ in sequences]),
    )


def _ends(parts: list[dict]) -> list[Tensor]:
    offset, out = 0, []
    for p in parts:
        out.append(p["end"].long() + offset)
        offset += len(p["choice"])
    return out


def _states(target: TargetModel, shard: list[tuple[Tensor, int]]) -> dict[str, Tensor]:
    hidden, choice, end, use = [], [], [], []
    offset = 0
    for ids, first in shard:
        h = target.decoder(input_ids=ids[None].to(target.device)).last_hidden_state[0]  # [T, H]
        hidden.append(h.half().cpu())
        choice.append(target.lm_head(h).argmax(-1).int().cpu())  # [T]
        offset += len(ids)
        end.append(torch.full((len(ids),), offset, dtype=torch.int32))
        mask = torch.zeros(len(ids), dtype=torch.bool)
        mask[max(first, 0) :] = True
        use.append(mask)
    return {
        "hidden": torch.cat(hidden),
        "choice": torch.cat(choice),
        "end": torch.cat(end),
        "use": torch.cat(use),
    }


def stdlib_sequences(tokenizer: object, split: str, tokens: int, block_size: int) -> list[tuple[Tensor, int]]:
    """Blocks of the stdlib corpus (`specdraft.data`) as (ids, 0)."""
    from specdraft.data import corpus_documents, token_blocks

    if tokenizer is None:
        raise ValueError("the stdlib training and held-out sets (data.stdlib_tokens, data.eval_tokens) are text: "
                         "they need the target's tokenizer, and this target has none; load it with its tokenizer.")

    docs = corpus_documents(split, sources=("stdlib",))
    random.Random(0).shuffle(docs)
    blocks = token_blocks(tokenizer, docs, block_size, max_tokens=tokens)  # [N, L]
    return [(b, 0) for b in blocks]


def selfgen_sequences(split: str, path: str | Sequence[str] | None, max_tokens: int) -> list[tuple[Tensor, int]]:
    """The target's own generations as (ids, position producing the first completion token)."""
    from specdraft.train.selfgen import load_selfgen_sequences

    out, total = [], 0
    for ids, prompt_len in load_selfgen_sequences(split, path):
        if len(ids) - prompt_len < 2:
            continue
        out.append((ids, prompt_len - 1))
        total += len(ids)
        if total >= max_tokens:
            break
    return out


# ------------------------------------------------------------------------------- PEFT setup
def lora_config(
    num_heads: int, num_layers: int, rank: int, alpha: float, full_projection: bool,
    recurrent: bool = False,
):  # noqa: ANN201
    """The PEFT LoraConfig for Medusa heads: every head's blocks (and recurrent input blocks) fully
    trained (`modules_to_save`), LoRA (rank `rank`) on the shared projections; with full_projection
    the projections are trained whole (`modules_to_save`) and the LoRA sits on the blocks instead."""
    from peft import LoraConfig

    if rank < 1:
        raise ValueError(f"lora_rank must be >= 1, got {rank}.")
    heads = range(num_heads)
    if recurrent:
        if full_projection:
            raise ValueError("recurrent heads share the target's projection: set full_projection=false.")
        names = [f"lm_heads.{k}" for k in heads]
        saved = [f"blocks.{k}" for k in heads if num_layers > 0] + [f"inputs.{k}" for k in heads]
        return LoraConfig(r=rank, lora_alpha=alpha, target_modules=names, modules_to_save=saved)
    if full_projection:
        # PEFT needs a LoRA target: the blocks get LoRA, the whole projections are trained.
        blocks = [f"blocks.{k}.{j}.linear" for k in heads for j in range(num_layers)]
        if not blocks:
            raise ValueError("full_projection needs num_layers >= 1 (the blocks carry the LoRA).")
        saved = [f"lm_heads.{k}" for k in heads]
        return LoraConfig(r=rank, lora_alpha=alpha, target_modules=blocks, modules_to_save=saved)
    names = [f"lm_heads.{k}" for k in heads]
    saved = [f"blocks.{k}" for k in heads]
    return LoraConfig(r=rank, lora_alpha=alpha, target_modules=names, modules_to_save=saved)


def build_peft_heads(heads: MedusaHeads, rank: int = 8, alpha: float = 16.0):  # noqa: ANN201
    """Wrap heads in a PEFT model ready to train (target weights frozen)."""
    from peft import get_peft_model

    for p in heads.parameters():
        p.requires_grad_(False)
    cfg = lora_config(heads.num_heads, heads.num_layers, rank, alpha, heads.full_projection,
                      heads.recurrent)
    return get_peft_model(heads, cfg)


# ------------------------------------------------------------------------------- training
def labels_on(vocab: PrunedVocab | None, labels: Tensor) -> Tensor:
    """Target-id labels [...] (-1 = none) -> column indices of the heads' logits: indices into the
    pruned vocabulary, -1 where the label is -1 or outside it (ignored by the loss)."""
    if vocab is None:
        return labels
    return torch.where(labels >= 0, vocab.to_subset(labels.clamp_min(0)), torch.full_like(labels, -1))


def head_losses(heads: CompiledHeads, data: HiddenSet, idx: Tensor, loss: str) -> Tensor:
    """Per-head mean loss [K] on positions idx [M] (over heads.vocab when the vocab is pruned)."""
    num_heads = len(heads.blocks)
    labels = labels_on(heads.vocab, data.labels(idx, num_heads))  # [M, K]
    tokens = data.path_tokens(idx, num_heads) if heads.recurrent else None  # [M, K]
    logits = heads(data.states(idx), tokens)  # [M, K, V']
    out = []
    for k in range(num_heads):
        lk = logits[:, k].float()  # [M, V']
        if loss == "ce":
            out.append(F.cross_entropy(lk, labels[:, k], ignore_index=-1))
            continue
        valid = data.labels(idx, num_heads)[:, k] >= 0
        with torch.no_grad():  # teacher: the target's own distribution at t+k+1 (on the pruned vocabulary)
            w = heads.weights[0].detach()
            w = w if heads.vocab is None else heads.vocab.head(w)
            teacher = F.log_softmax(F.linear(data.states(idx[valid] + k + 1), w).float(), dim=-1)
        student = F.log_softmax(lk[valid], dim=-1)
        out.append(F.kl_div(student, teacher, log_target=True, reduction="batchmean"))
    return torch.stack(out)


@torch.inference_mode()
def evaluate(model: torch.nn.Module, data: HiddenSet, num_heads: int, max_positions: int,
             vocab: PrunedVocab | None = None, batch: int = 256) -> dict[str, list[float]]:
    """Per-head agreement with the target: top-1, top-5 and the accuracy of each rank 0..9.

    vocab: the pruned vocabulary the heads project onto (a target token outside it is a miss).
    """
    heads = CompiledHeads(model, vocab)
    heads.truncate(num_heads)
    idx = data.inputs(num_heads)[:max_positions]
    hits = torch.zeros(num_heads, TOPK_STATS)
    counts = torch.zeros(num_heads)
    ranks = []  # per position with every head's label: rank of the label in each head's list
    for s in range(0, len(idx), batch):
        b = idx[s : s + batch]
        target_ids = data.labels(b, num_heads)  # [M, K]
        labels = labels_on(vocab, target_ids)
        tokens = data.path_tokens(b, num_heads) if heads.recurrent else None  # [M, K]
        top = heads(data.states(b), tokens).topk(TOPK_STATS, dim=-1).indices  # [M, K, 10]
        match = (top == labels[..., None]) & (labels[..., None] >= 0)  # [M, K, 10]
        hits += match.float().sum(0)
        counts += (target_ids >= 0).float().sum(0)
        rank = torch.where(match.any(-1), match.float().argmax(-1), torch.full_like(labels, TOPK_STATS))
        ranks.append(rank[(target_ids >= 0).all(1)])  # [M', K]
    rank = (hits / counts.clamp_min(1)[:, None]).tolist()  # [K][10]
    return {
        "top1": [r[0] for r in rank],
        "top5": [sum(r[:5]) for r in rank],
        "rank_accuracy": rank,
        "positions": counts.tolist(),
        "label_ranks": torch.cat(ranks).tolist() if ranks else [],
    }


def batch_positions(inputs: Tensor, step: int, batch_size: int, seed: int) -> Tensor:
    """The training positions [batch_size] of `step`: a draw from a generator seeded by the seed and
    the step alone, so a resumed run sees the batches an uninterrupted run would."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return inputs[torch.randint(len(inputs), (batch_size,), generator=gen)]


def use_bf16(setting: bool | str) -> bool:
    """The recipe's `bf16` setting -> whether to train under bfloat16 autocast: "auto" = where the CPU has
    bfloat16 instructions (there it is several times faster; on AVX2 it is emulated and many times slower)."""
    if setting == "auto":
        return cpu_has_bf16()
    if isinstance(setting, bool):
        return setting
    raise ValueError(f"bf16 must be true, false or auto (bfloat16 autocast where the CPU has the instructions), got {setting!r}.")


def build_heads(cfg: DictConfig, target: TargetModel) -> nn.Module:
    """Fresh PEFT-wrapped heads on the target's lm_head (and input embedding, recurrent heads)."""
    recurrent = bool(cfg.get("recurrent", False))
    embed = target.model.get_input_embeddings().weight if recurrent else None
    with torch.random.fork_rng(devices=[]):  # seeded initialisation without touching the caller's RNG
        torch.manual_seed(cfg.seed)
        heads = MedusaHeads(target.lm_head.weight, cfg.num_heads, cfg.num_layers, cfg.full_projection,
                            recurrent=recurrent, embed_weight=embed)
        return build_peft_heads(heads, cfg.lora_rank, cfg.lora_alpha)


def train(cfg: DictConfig, target: TargetModel, train_set: HiddenSet,
          eval_sets: dict[str, HiddenSet], ckpt_path: Path | None,
          vocab: PrunedVocab | None = None, inputs: Tensor | None = None) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Train heads through `specdraft.train.loop.train` (resumable from ckpt_path unless
    cfg.resume is false); returns the PEFT model and a log of what happened.

    vocab: the pruned vocabulary the heads project onto (None = the whole vocabulary).
    inputs: the positions [P] batches are drawn from (`oversampled`; None = train_set's inputs).
    """
    settings = TrainSettings.from_config(cfg.train)
    model = build_heads(cfg, target)
    fast = CompiledHeads(model, vocab)  # the same parameters, projected onto the pruned vocabulary only
    if ckpt_path is not None and not cfg.resume:
        Path(ckpt_path).unlink(missing_ok=True)  # start over (and checkpoint anew)
    inputs = train_set.inputs(cfg.num_heads) if inputs is None else inputs
    objective = cfg.heads_loss
    bf16 = use_bf16(cfg.bf16)
    weights = torch.tensor([objective.decay**k for k in range(cfg.num_heads)])

    def step_loss(step: int) -> tuple[Tensor, Mapping[str, float]]:
        idx = batch_positions(inputs, step, cfg.batch_size, cfg.seed)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            losses = head_losses(fast, train_set, idx, objective.loss)
        return (weights * losses).sum(), {f"h{k + 1}": round(v, 4) for k, v in enumerate(losses.tolist())}

    def evaluate_sets(step: int) -> dict[str, Any]:  # a quarter of the final evaluation's positions
        accs = {name: evaluate(model, ds, cfg.num_heads, cfg.eval_positions // 4, vocab)
                for name, ds in eval_sets.items()}
        return {name: {k: [round(x, 4) for x in acc[k]] for k in ("top1", "top5")} for name, acc in accs.items()}

    run = train_loop(model, step_loss, settings, name="medusa", checkpoint=ckpt_path,
                     evaluate=evaluate_sets if eval_sets else None)
    model.eval()
    return model, {**train_log(run, cfg.num_heads), "bf16_autocast": bf16}


def train_log(run: TrainLog, num_heads: int) -> dict[str, Any]:
    """The training part of provenance.json: steps, seconds, and every 50th row of per-head losses
    ([step, head 1 loss, ..., head K loss])."""
    history = [[row["step"]] + [row[f"h{k + 1}"] for k in range(num_heads)]
               for row in run.history if "loss" in row]
    return {"steps": run.step, "train_seconds": round(run.elapsed_s, 1),
            "stopped_by_budget": run.stopped_by_budget,
            "loss_history_every_50": history[::50] + history[-1:]}


def _fmt(xs: list[float]) -> str:
    return "/".join(f"{x:.3f}" for x in xs)


# ------------------------------------------------------------------------------- entry point
def load_data(cfg: DictConfig, target: TargetModel, split: str) -> dict[str, HiddenSet]:
    """The cached hidden sets of one split (computing what is missing)."""
    cache = Path(cfg.cache_dir)
    d = cfg.data
    out: dict[str, HiddenSet] = {}
    tokens = d.selfgen_tokens if split == "train" else d.eval_tokens
    if d.selfgen:
        seqs = selfgen_sequences(split, d.selfgen_path, tokens)
        if seqs:
            out["selfgen"] = precompute(target, seqs, cache, f"selfgen-{split}")
    stdlib = d.stdlib_tokens if split == "train" else d.eval_tokens
    if stdlib > 0:
        seqs = stdlib_sequences(target.tokenizer, split, stdlib, d.block_size)
        out["stdlib"] = precompute(target, seqs, cache, f"stdlib-{split}-{stdlib}-{d.block_size}")
    return out


def concat(sets: Sequence[HiddenSet]) -> HiddenSet:
    """One HiddenSet from several (sequence ends shifted)."""
    offset, ends = 0, []
    for s in sets:
        ends.append(s.end + offset)
        offset += len(s.choice)
    return HiddenSet(
        hidden=torch.cat([s.hidden for s in sets]),
        choice=torch.cat([s.choice for s in sets]),
        end=torch.cat(ends),
        use=torch.cat([s.use for s in sets]),
        ids=torch.cat([s.ids for s in sets]),
    )


def oversampled(sets: Mapping[str, HiddenSet], repeat: Mapping[str, int], num_heads: int) -> tuple[HiddenSet, Tensor]:
    """The sets concatenated once, and the training input positions [P] with set `name`'s listed
    repeat[name] times (default once): a uniform draw from them oversamples that set as copies
    of it would, without copying its hidden states."""
    data = concat(list(sets.values()))
    inputs, offset = [], 0
    for name, ds in sets.items():
        inputs += [ds.inputs(num_heads) + offset] * repeat.get(name, 1)
        offset += len(ds.choice)
    return data, torch.cat(inputs)


def run(cfg: DictConfig, target: TargetModel | None = None) -> dict:
    """Precompute and/or train as cfg.stage says; returns the evaluation results. The output folder
    is checked before `target` (default: cfg.target, instantiated here) loads."""
    if cfg.stage not in ("precompute", "train", "all"):
        raise ValueError(f"stage must be precompute, train or all, got {cfg.stage!r}.")
    TrainSettings.from_config(cfg.train)  # a bad train: group is an error before any work
    use_bf16(cfg.bf16)
    if cfg.stage != "precompute":
        prepare_output_dir(cfg.out_dir, bool(cfg.get("overwrite", False)))
    t_start = time.time()
    target = target if target is not None else instantiate(cfg.target)
    guard_cache(cfg.cache_dir, target, "cache_dir")
    evals = load_data(cfg, target, "eval")
    trains = load_data(cfg, target, "train")
    if not trains:
        raise ValueError("no training data: enable data.selfgen or set data.stdlib_tokens > 0.")
    if cfg.stage == "precompute":
        return {}
    repeat = {"selfgen": int(cfg.data.selfgen_repeat)}  # oversample the target's own generations
    train_set, inputs = oversampled(trains, repeat, cfg.num_heads)
    out_dir = Path(cfg.out_dir)
    vocab = None
    if cfg.pruned_vocab > 0:  # the most frequent target choices (+ EOS) of the training data, as oversampled
        choices = torch.cat([ds.choice for name, ds in trains.items() for _ in range(repeat.get(name, 1))])
        vocab = build_pruned_vocab(choices, cfg.pruned_vocab, target.vocab_size, always_include=target.eos_token_ids)
        vocab.save(out_dir / VOCAB_FILE)
    model, log = train(cfg, target, train_set, evals, Path(cfg.checkpoint), vocab, inputs)
    results = {name: evaluate(model, ds, cfg.num_heads, cfg.eval_positions, vocab)
               for name, ds in evals.items()}
    if vocab is not None:
        log["pruned_vocab_coverage"] = {name: vocab.coverage(ds.choice) for name, ds in evals.items()}
    for name, acc in results.items():
        print(f"[medusa] held-out {name}: top1 {_fmt(acc['top1'])} top5 {_fmt(acc['top5'])}", flush=True)
    provenance = {
        "command": "specdraft-train-medusa " + " ".join(cfg.get("overrides", [])),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "train_positions": {k: int(v.inputs(cfg.num_heads).numel()) for k, v in trains.items()},
        "eval": {n: {k: v for k, v in r.items() if k != "label_ranks"} for n, r in results.items()},
        "wall_seconds": round(time.time() - t_start, 1),
        **log,
    }
    save_heads(model, out_dir, provenance, dtype=getattr(torch, cfg.get("save_dtype", "float32")),
               target=target_info(target, target_label(cfg.target)))
    save_accuracy(out_dir, results)
    print(f"[medusa] saved {out_dir}", flush=True)
    return results


@hydra_cli("train_medusa")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: check the output folder, load the target, then precompute / train / save."""
    run(recipe_settings(cfg))


if __name__ == "__main__":
    main()
