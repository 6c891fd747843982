"""specdraft-train-medusa: train Medusa heads with PEFT on cached target hidden states.

The target stays frozen. Its last-layer (post-norm) hidden states h_t and greedy choices
a_t = argmax lm_head(h_t) are computed ONCE per sequence and cached in shards on disk (resumable);
training then never runs the decoder again. Head k (0-based) reads h_t and learns the target's
choice two-plus-k positions ahead, a_{t+k+1} (h_t itself produced x_{t+1}):

    loss = sum_k decay^k * CE(head_k(h_t), a_{t+k+1})            (loss=ce, default)
    loss = sum_k decay^k * KL(softmax(lm_head(h_{t+k+1})) || head_k(h_t))   (loss=kl)

recurrent=true trains Hydra-style heads (drafters/medusa.py): head k also reads the tokens before
it, teacher-forced with the sequence's own tokens y_k = x_{t+k+1} (on the target's greedy
generations these are its choices a_{t+k}, exactly what an accepted draft prefix holds).

Data: the target's own greedy generations (`specdraft.train.selfgen`, completion positions only) and
blocks of the offline stdlib corpus; each has a held-out split on which per-head top-1 / top-5
agreement with the target is reported. PEFT: `modules_to_save` for the blocks, LoRA for the shared
projections (drafters/medusa.py). Seeded; checkpoints every few steps and resumes; a tqdm bar shows
every head's loss. Output: a PEFT adapter directory + medusa_config.json + provenance.json (how it
was made) + accuracy.json (per-head top-k accuracies, which choose the candidate tree).

    specdraft-train-medusa                      # the shipped heads (see conf/train_medusa.yaml)
    specdraft-train-medusa stage=precompute     # only fill the hidden-state cache
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import Tensor
from tqdm import tqdm

from drafters.medusa import VOCAB_FILE, CompiledHeads, MedusaHeads, build_peft_heads, save_heads
from specdraft.target import TargetModel
from specdraft.vocab import build_pruned_vocab

TOPK_STATS = 10  # accuracy of each head's rank-0..9 candidates (chooses the tree)


# ------------------------------------------------------------------------------- hidden cache
@dataclass(frozen=True)
class HiddenSet:
    """Cached target states of many sequences, concatenated.

    hidden: [N, H] post-norm last-layer hidden state of every position (float16 on disk).
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
    """Run the target once over every (ids [T], first input position) and cache h_t, a_t.

    Shards of ~shard_tokens are written as <cache_dir>/<name>-NNNN.pt; existing shards are reused,
    so an interrupted run resumes where it stopped (a shard is reused only if it holds the same
    number of tokens, so a growing JSONL reuses every full shard).
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    shards: list[list[tuple[Tensor, int]]] = [[]]
    count = 0
    for seq in sequences:
        if count >= shard_tokens:
            shards.append([])
            count = 0
        shards[-1].append(seq)
        count += len(seq[0])
    parts = []
    for i, shard in enumerate(tqdm(shards, desc=f"hidden states {name}", file=sys.stdout)):
        path = cache_dir / f"{name}-{i:04d}.pt"
        part = torch.load(path) if path.is_file() else None
        if part is None or len(part["choice"]) != sum(len(ids) for ids, _ in shard):
            part = _states(target, shard)
            torch.save(part, path)
        parts.append(part)
    return HiddenSet(
        hidden=torch.cat([p["hidden"] for p in parts]).float(),
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
    """Blocks of the stdlib corpus (DESIGN §7) as (ids, 0)."""
    from specdraft.data import corpus_documents, token_blocks

    docs = corpus_documents(split, sources=("stdlib",))
    random.Random(0).shuffle(docs)
    blocks = token_blocks(tokenizer, docs, block_size, max_tokens=tokens)  # [N, L]
    return [(b, 0) for b in blocks]


def selfgen_sequences(split: str, path: str | None, max_tokens: int) -> list[tuple[Tensor, int]]:
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


# ------------------------------------------------------------------------------- training
def head_losses(heads: CompiledHeads, data: HiddenSet, idx: Tensor, loss: str) -> Tensor:
    """Per-head mean loss [K] on positions idx [M] (over heads.rows when the vocab is pruned)."""
    num_heads = len(heads.blocks)
    labels = _subset(data.labels(idx, num_heads), heads.rows)  # [M, K]
    tokens = data.path_tokens(idx, num_heads) if heads.recurrent else None  # [M, K]
    logits = heads(data.hidden[idx], tokens)  # [M, K, V']
    out = []
    for k in range(num_heads):
        lk = logits[:, k].float()  # [M, V']
        if loss == "ce":
            out.append(F.cross_entropy(lk, labels[:, k], ignore_index=-1))
            continue
        valid = data.labels(idx, num_heads)[:, k] >= 0
        with torch.no_grad():  # teacher: the target's own distribution at t+k+1 (on the rows)
            w = heads.weights[0].detach()
            w = w if heads.rows is None else w[heads.rows]
            teacher = F.log_softmax(F.linear(data.hidden[idx[valid] + k + 1], w).float(), dim=-1)
        student = F.log_softmax(lk[valid], dim=-1)
        out.append(F.kl_div(student, teacher, log_target=True, reduction="batchmean"))
    return torch.stack(out)


def _subset(labels: Tensor, rows: Tensor | None) -> Tensor:
    """Target ids [..] -> index into rows (-1 outside or where the label is -1)."""
    if rows is None:
        return labels
    index_of = torch.full((int(rows.max()) + 2,), -1, dtype=torch.long)
    index_of[rows] = torch.arange(len(rows))
    return torch.where((labels >= 0) & (labels < len(index_of) - 1),
                       index_of[labels.clamp(0, len(index_of) - 2)], torch.full_like(labels, -1))


@torch.inference_mode()
def evaluate(model: torch.nn.Module, data: HiddenSet, num_heads: int, max_positions: int,
             rows: Tensor | None = None, batch: int = 256) -> dict[str, list[float]]:
    """Per-head agreement with the target: top-1, top-5 and the accuracy of each rank 0..9.

    rows: the pruned vocabulary the heads project onto (a target token outside it is a miss).
    """
    heads = CompiledHeads(model, rows)
    heads.truncate(num_heads)
    idx = data.inputs(num_heads)[:max_positions]
    hits = torch.zeros(num_heads, TOPK_STATS)
    counts = torch.zeros(num_heads)
    ranks = []  # per position with every head's label: rank of the label in each head's list
    for s in range(0, len(idx), batch):
        b = idx[s : s + batch]
        target_ids = data.labels(b, num_heads)  # [M, K]
        labels = _subset(target_ids, rows)
        tokens = data.path_tokens(b, num_heads) if heads.recurrent else None  # [M, K]
        top = heads(data.hidden[b], tokens).topk(TOPK_STATS, dim=-1).indices  # [M, K, 10]
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


def _trainable_state(model: torch.nn.Module) -> dict[str, Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def train(cfg: DictConfig, target: TargetModel, train_set: HiddenSet,
          eval_sets: dict[str, HiddenSet], ckpt_path: Path,
          rows: Tensor | None = None) -> tuple[torch.nn.Module, dict]:
    """Train heads (resumable from ckpt_path); returns the PEFT model and a log of what happened.

    rows: pruned vocabulary [M] the heads project onto (None = the whole vocabulary).
    """
    torch.manual_seed(cfg.seed)
    recurrent = bool(cfg.get("recurrent", False))
    embed = target.model.get_input_embeddings().weight if recurrent else None
    heads = MedusaHeads(target.lm_head.weight, cfg.num_heads, cfg.num_layers, cfg.full_projection,
                        recurrent=recurrent, embed_weight=embed)
    model = build_peft_heads(heads, cfg.lora_rank, cfg.lora_alpha)
    fast = CompiledHeads(model, rows)  # the same parameters, projected onto `rows` only
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    step, elapsed, history = 0, 0.0, []
    if cfg.resume and ckpt_path.is_file():
        ck = torch.load(ckpt_path)
        model.load_state_dict(ck["params"], strict=False)
        opt.load_state_dict(ck["opt"])
        step, elapsed, history = ck["step"], ck["elapsed"], ck["history"]
        print(f"[medusa] resumed at step {step} ({elapsed:.0f} s trained)", flush=True)
    inputs = train_set.inputs(cfg.num_heads)
    gen = torch.Generator().manual_seed(cfg.seed)
    for _ in range(step):  # replay the sampler so a resumed run sees the same batches
        torch.randint(len(inputs), (cfg.train.batch_size,), generator=gen)
    weights = torch.tensor([cfg.train.decay**k for k in range(cfg.num_heads)])
    total = cfg.train.max_steps
    bar = tqdm(total=total, initial=step, desc="medusa", file=sys.stdout, mininterval=5)
    model.train()
    t0 = time.perf_counter() - elapsed
    while step < total and time.perf_counter() - t0 < cfg.train.max_seconds:
        idx = inputs[torch.randint(len(inputs), (cfg.train.batch_size,), generator=gen)]
        # linear warmup, then cosine decay to 10% over the run (steps or seconds, whichever ends first)
        progress = max(step / total, (time.perf_counter() - t0) / cfg.train.max_seconds)
        decay = 0.1 + 0.45 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
        lr = cfg.train.lr * min(1.0, (step + 1) / cfg.train.warmup_steps) * decay
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(cfg.train.bf16)):
            losses = head_losses(fast, train_set, idx, cfg.train.loss)
        loss = (weights * losses).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        bar.update(1)
        bar.set_postfix({f"h{k + 1}": f"{v:.2f}" for k, v in enumerate(losses.tolist())})
        history.append([step] + [round(v, 4) for v in losses.tolist()])
        if step % cfg.train.checkpoint_every == 0:
            ck = {"params": _trainable_state(model), "opt": opt.state_dict(), "step": step,
                  "elapsed": time.perf_counter() - t0, "history": history}
            torch.save(ck, ckpt_path)
        if cfg.train.eval_every and step % cfg.train.eval_every == 0:
            model.eval()
            for name, ds in eval_sets.items():
                acc = evaluate(model, ds, cfg.num_heads, cfg.train.eval_positions // 4, rows)
                print(f"\n[medusa] step {step} {name} top1 {_fmt(acc['top1'])} top5 {_fmt(acc['top5'])}",
                      flush=True)
            model.train()
    bar.close()
    model.eval()
    log = {"steps": step, "train_seconds": round(time.perf_counter() - t0, 1),
           "loss_history_every_50": history[::50] + history[-1:]}
    return model, log


def accuracy_file(results: dict[str, dict]) -> dict:
    """accuracy.json: per held-out set, each head's rank-0..9 accuracy and the per-position label
    ranks (their joint distribution chooses the candidate tree, specdraft.tree.choose_tree)."""
    return {"rank_accuracy": {n: r["rank_accuracy"] for n, r in results.items()},
            "label_ranks": {n: r["label_ranks"] for n, r in results.items()}}


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


def run(cfg: DictConfig, target: TargetModel) -> dict:
    """Precompute and/or train as cfg.stage says; returns the evaluation results."""
    if cfg.stage not in ("precompute", "train", "all"):
        raise ValueError(f"stage must be precompute, train or all, got {cfg.stage!r}.")
    t_start = time.time()
    evals = load_data(cfg, target, "eval")
    trains = load_data(cfg, target, "train")
    if not trains:
        raise ValueError("no training data: enable data.selfgen or set data.stdlib_tokens > 0.")
    if cfg.stage == "precompute":
        return {}
    repeat = {"selfgen": int(cfg.data.selfgen_repeat)}  # oversample the target's own generations
    train_set = concat([ds for name, ds in trains.items() for _ in range(repeat.get(name, 1))])
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = None
    if cfg.pruned_vocab > 0:  # the most frequent target choices (+ EOS) of the training data
        vocab = build_pruned_vocab(train_set.choice, cfg.pruned_vocab, target.vocab_size,
                                   always_include=target.eos_token_ids)
        vocab.save(out_dir / VOCAB_FILE)
    rows = None if vocab is None else vocab.ids
    ckpt = Path(cfg.checkpoint)
    model, log = train(cfg, target, train_set, evals, ckpt, rows)
    results = {name: evaluate(model, ds, cfg.num_heads, cfg.train.eval_positions, rows)
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
    save_heads(model, out_dir, provenance, dtype=getattr(torch, cfg.get("save_dtype", "float32")))
    (out_dir / "accuracy.json").write_text(json.dumps(accuracy_file(results)) + "\n")
    print(f"[medusa] saved {out_dir}", flush=True)
    return results


@hydra.main(version_base="1.3", config_path="pkg://conf", config_name="train_medusa")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: load the target, then precompute / train / save."""
    from hydra.core.hydra_config import HydraConfig

    from specdraft.models import load_target

    torch.set_num_threads(cfg.threads)
    OmegaConf.set_struct(cfg, False)
    cfg.overrides = list(HydraConfig.get().overrides.task)
    target = load_target(cfg.target, device="cpu")
    run(cfg, target)


if __name__ == "__main__":
    main()
