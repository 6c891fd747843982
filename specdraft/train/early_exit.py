"""Exit-adapter training for early-exit self-drafting (`specdraft-train-early-exit`).

The draft of `drafters.early_exit.EarlyExitDrafter` is the target's own first E layers followed by
the target's final norm and lm_head. Untrained, that exit rarely agrees with the full model, so a
small residual MLP (`ExitAdapter`, zero-initialised: it starts as the identity) is trained on layer
E's hidden state to imitate the final layer's distribution (`specdraft.train.losses.distill_loss`,
cross-entropy to the teacher's top-k distribution), by the one training skeleton
(`specdraft.train.loop.train`: the config's `train:` group).

Teacher outputs are expensive (a full forward per token) and the adapter is cheap, so the recipe
precomputes once and caches on disk: layer-E hidden states [N, H] (float16) and the teacher's
top-k logits/ids [N, k]; training then only runs adapter + norm + lm_head. Every phase is
resumable (cache shards, training checkpoints; a step's batch depends on the step alone, so a
resumed run sees the batches an uninterrupted one would), so a killed background job loses little.
`adapter.context=true` trains a context adapter (`ExitAdapter(context=True)`): it also reads the
target's final-layer hidden state of the position before, cached with the rest.

The adapter goes to `out_dir`: by default a folder under Hydra's run directory; a non-empty one (as
the shipped adapter's folder below) only with `overwrite=true`, checked before the target loads
(`specdraft.outputs`). It records its target (`specdraft.formats.target_info`); so does the
teacher cache, named after the target unless `cache_name` is set.

    cp specdraft/artifacts/smollm2-135m/early_exit/pruned_vocab.json outputs/exit_vocab.json
    specdraft-train-early-exit exit_layer=6 adapter.context=true "sources=[selfgen,stdlib,pydoc]" \
        train_tokens=3200000 eval_tokens=4096 train.max_steps=60000 train.max_minutes=35 threads=2 \
        pruned_vocab=outputs/exit_vocab.json out_dir=specdraft/artifacts/smollm2-135m/early_exit overwrite=true

(its vocabulary is the 2026-11-30 draft's, kept beside the adapter).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from omegaconf import DictConfig
from safetensors.torch import load_file, save_file
from torch import Tensor

from specdraft.build import target_label
from specdraft.console import hydra_cli
from specdraft.files import replace_atomically
from specdraft.formats.exit_adapter import (
    ExitAdapter,
    exit_head,
    exit_hidden,
    exit_logits,
    save_adapter,
)
from specdraft.formats.target_info import RECORD_KEY, guard_cache, target_info
from specdraft.target import TargetModel
from specdraft.train.loop import Evaluate, TrainLog, TrainSettings, train
from specdraft.train.losses import distill_loss
from specdraft.outputs import prepare_output_dir
from specdraft.vocab import VOCAB_FILE, PrunedVocab, resolve_pruned_vocab

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------ teacher cache
def _shard_path(out_dir: Path, start: int, shard_blocks: int) -> Path:
    """The cache file of blocks start .. start + shard_blocks - 1 (written by precompute_teacher)."""
    return out_dir / f"shard_{start:06d}_{shard_blocks}.safetensors"


@torch.inference_mode()
def precompute_teacher(
    target: TargetModel, blocks: Tensor, exit_layer: int, top_k: int, out_dir: Path, shard_blocks: int = 4,
    with_prev: bool = False,
) -> dict[str, Tensor]:
    """Layer-`exit_layer` hidden states and the final layer's top-k logits for every token of
    blocks [N, T]; cached as resumable shards in out_dir. Returns hidden [M, H] float16,
    top_logits [M, k] float16, top_ids [M, k] int64 (M = N * T), and with with_prev also prev
    [M, H] float16: the final-layer post-norm hidden state of the position before (zeros at a
    block's first position), the context adapter's second input."""
    out_dir.mkdir(parents=True, exist_ok=True)
    keys = ("hidden", "top_logits", "top_ids") + (("prev",) if with_prev else ())
    parts: list[dict[str, Tensor]] = []
    for start in range(0, blocks.shape[0], shard_blocks):
        shard = _shard_path(out_dir, start, shard_blocks)
        ids = blocks[start : start + shard_blocks]  # [b, T]
        cached = load_file(str(shard)) if shard.is_file() else {}
        # recompute when new, cached before prev was asked for, or a partial last shard of a shorter run
        if not all(k in cached for k in keys) or cached["hidden"].shape[0] != ids.numel():
            out = target.model(ids.to(target.device), output_hidden_states=True)
            final = out.hidden_states[-1]  # [b, T, H] post-norm output of the last layer
            prev = torch.cat([torch.zeros_like(final[:, :1]), final[:, :-1]], dim=1)  # [b, T, H]
            values, idx = out.logits.float().flatten(0, 1).topk(top_k, dim=-1)  # [b*T, k]
            cached = {"hidden": out.hidden_states[exit_layer].flatten(0, 1).half().cpu().contiguous(),  # [b*T, H]
                      "top_logits": values.half().cpu().contiguous(),
                      "top_ids": idx.to(torch.int32).cpu().contiguous(),
                      "prev": prev.flatten(0, 1).half().cpu().contiguous()}
            replace_atomically(shard, lambda tmp: save_file(cached, str(tmp)))
            log.info("teacher cache %s: %d/%d blocks", out_dir.name, start + ids.shape[0], blocks.shape[0])
        parts.append(cached)
    return {k: torch.cat([p[k] for p in parts]) for k in keys}


# ----------------------------------------------------------------------------------- training
@torch.no_grad()
def agreement(
    target: TargetModel, adapter: ExitAdapter | None, data: dict[str, Tensor], batch: int = 512,
    vocab: PrunedVocab | None = None,
) -> dict[str, float]:
    """Top-1 agreement (exit argmax == final argmax) and top-5 (final argmax in the exit's top 5),
    the exit projecting onto the full vocabulary or onto `vocab` only. A context adapter reads the
    target's own previous-position feature (`prev`: the first draft token of a round); it also
    gets top1_chained, where the feature is the exit's own output at the position before (as for
    the next draft tokens), given the earlier tokens."""
    context = adapter is not None and adapter.context
    head = None if vocab is None else vocab.head(target.lm_head.weight)  # [M, H]
    n = data["hidden"].shape[0]

    def predict(prev: Tensor | None) -> tuple[Tensor, Tensor]:  # top-5 ids [n, 5], exit hidden [n, H]
        preds, hiddens = [], []
        for s in range(0, n, batch):
            h = data["hidden"][s : s + batch].float().to(target.device)  # [b, H]
            p = None if prev is None else prev[s : s + batch].float().to(target.device)  # [b, H]
            out = exit_hidden(target, h, adapter, p)  # [b, H]
            top = exit_head(target, out, head).topk(5, dim=-1).indices  # [b, 5]
            preds.append(top if vocab is None else vocab.to_target(top))
            hiddens.append(out)
        return torch.cat(preds), torch.cat(hiddens)

    want = data["top_ids"][:, 0].long().to(target.device)  # [n]
    pred, out = predict(data["prev"] if context else None)
    result = {"top1": float((pred[:, 0] == want).float().mean()) if n else 0.0,
              "top5": float((pred == want[:, None]).any(-1).float().mean()) if n else 0.0, "tokens": n}
    if context and n:
        # the exit's own feature replaces the target's where the target's is non-zero (not a block start)
        own = torch.cat([out.new_zeros(1, out.shape[1]), out[:-1]])  # [n, H]
        own = torch.where((data["prev"].to(own.device) != 0).any(-1, keepdim=True), own, torch.zeros_like(own))
        chained, _ = predict(own)
        result["top1_chained"] = float((chained[:, 0] == want).float().mean())
    return result


def step_generator(seed: int, step: int) -> torch.Generator:
    """The random generator of one training step: the batch is a function of (seed, step) alone,
    so a resumed run draws what an uninterrupted one would."""
    return torch.Generator().manual_seed(seed * 2**32 + step)


def train_adapter(
    target: TargetModel,
    adapter: ExitAdapter,
    train_data: dict[str, Tensor],
    settings: TrainSettings,
    batch_tokens: int,
    *,
    seed: int = 0,
    vocab: PrunedVocab | None = None,
    checkpoint: Path | None = None,
    evaluate: Evaluate | None = None,
    log: bool = True,
) -> TrainLog:
    """Train `adapter` on `distill_loss` with the one training skeleton (`specdraft.train.loop.train`:
    AdamW, warm-up + cosine over steps or the time budget, resumable `checkpoint`, `evaluate` hook);
    the target stays frozen. Each step draws `batch_tokens` cached positions of train_data.

    vocab: the student projects onto that subset only (V / M times cheaper).
    """
    for p in target.model.parameters():
        p.requires_grad_(False)
    n = train_data["hidden"].shape[0]
    head = None if vocab is None else vocab.head(target.lm_head.weight)  # [M, H]
    device = target.device

    def step_loss(step: int) -> tuple[Tensor, dict[str, float]]:
        gen = step_generator(seed, step)
        idx = torch.randint(0, n, (batch_tokens,), generator=gen)  # [b]
        h = train_data["hidden"][idx].float().to(device)  # [b, H]
        prev = train_data["prev"][idx].float().to(device) if adapter.context else None  # [b, H]
        ids = train_data["top_ids"][idx].long().to(device)  # [b, k]
        if vocab is not None:
            ids = vocab.to_subset(ids)  # -1 outside the subset
        logits = exit_logits(target, h, adapter, head, prev=prev)  # [b, V or M]
        return distill_loss(logits, train_data["top_logits"][idx].to(device), ids), {}

    return train(adapter, step_loss, settings, name="early-exit adapter", checkpoint=checkpoint,
                 evaluate=evaluate, log=log)


def losses(run: TrainLog) -> list[float]:
    """The training loss of every step of a run (across resumes)."""
    return [row["loss"] for row in run.history if "loss" in row]


def load_blocks(tokenizer: object, split: str, max_tokens: int, sources: list[str], block_size: int,
                selfgen_path: str | Sequence[str] | None = None) -> Tensor:
    """Token blocks [N, block_size] of one split of `sources`: "selfgen" (the target's own answers,
    exact ids, specdraft.train.selfgen) first, then the specdraft.data corpus sources, as one
    stream cut into blocks. A larger max_tokens gives the same blocks plus more (cache shards stay
    valid). selfgen_path: a selfgen.jsonl or `specdraft-selfgen` out_dir, or a list of them (None =
    the shipped one)."""
    from specdraft.data import corpus_documents, token_blocks

    corpus = [s for s in sources if s != "selfgen"]
    parts: list[Tensor] = []
    if "selfgen" in sources:
        from specdraft.train.selfgen import load_selfgen_sequences

        parts += [ids for ids, _ in load_selfgen_sequences(split, selfgen_path)]
    if corpus:
        docs = corpus_documents(split, sources=corpus)
        parts.append(token_blocks(tokenizer, docs, block_size, max_tokens=max_tokens).flatten())
    ids = torch.cat(parts)[:max_tokens]  # [T]
    n = ids.numel() // block_size
    if n == 0:
        raise ValueError(f"the {split} data has {ids.numel()} tokens, fewer than one block of {block_size}.")
    return ids[: n * block_size].view(n, block_size)


def cached_top_k(out_dir: Path, n_blocks: int, block_size: int, shard_blocks: int = 4) -> tuple[Tensor, Tensor]:
    """The teacher's top-k logits [n_blocks * T, k] float16 and ids [n_blocks * T, k] int64 of the
    first n_blocks blocks of a `precompute_teacher` cache, read without its hidden states (other
    recipes reuse the teacher pass: specdraft.train.distill)."""
    from safetensors import safe_open

    values, ids = [], []
    for start in range(0, n_blocks, shard_blocks):
        shard = _shard_path(out_dir, start, shard_blocks)
        rows = min(shard_blocks, n_blocks - start) * block_size  # the positions wanted from this shard
        short = ValueError(f"the teacher cache {str(out_dir)!r} has no complete shard for blocks from {start} (it "
                           f"needs {n_blocks} blocks); run specdraft-train-early-exit with a larger train_tokens first.")
        if not shard.is_file():
            raise short
        with safe_open(str(shard), framework="pt") as f:
            if f.get_slice("top_ids").get_shape()[0] < rows:  # a partial last shard of a shorter run
                raise short
            values.append(f.get_tensor("top_logits")[:rows])
            ids.append(f.get_tensor("top_ids")[:rows].long())
    return torch.cat(values), torch.cat(ids)


def train_sample(train_data: dict[str, Tensor], tokens: int, block_size: int) -> dict[str, Tensor]:
    """About `tokens` cached training tokens as whole blocks spread evenly over the split (whole
    blocks keep `agreement`'s chained score right). Scored next to the held-out sets, the gap
    tells overfitting (more data helps) from underfitting (more steps or width help)."""
    n_blocks = train_data["hidden"].shape[0] // block_size
    picks = torch.linspace(0, n_blocks - 1, min(n_blocks, max(1, tokens // block_size))).round().long()  # [b]
    idx = (picks[:, None] * block_size + torch.arange(block_size)).flatten()  # [b * T]
    return {k: v[idx] for k, v in train_data.items()}


def eval_groups(sources: list[str]) -> list[list[str]]:
    """The held-out sets scored apart: the target's own answers and the text corpus are different
    domains (top-1 differs by 2-3x), so a mixed recipe reports each."""
    corpus = [s for s in sources if s != "selfgen"]
    return [g for g in (["selfgen"] if "selfgen" in sources else [], corpus) if g]


def cache_name(cfg) -> str:  # noqa: ANN001 - an OmegaConf DictConfig
    """The teacher cache's name: cfg.cache_name, else the target's (its name_or_path, e.g.
    smollm2-135m, or its loader's name), made safe for a folder name."""
    name = cfg.get("cache_name") or target_label(cfg.target)
    return re.sub(r"[^A-Za-z0-9._+-]+", "--", str(name)).strip("-")


def teacher_cache_dir(cfg) -> Path:  # noqa: ANN001 - an OmegaConf DictConfig
    """Where the recipe caches layer-E hidden states and teacher top-k for this config. Shards are
    blocks of the same token stream, so a larger train_tokens reuses them."""
    sources = "" if list(cfg.sources) == ["stdlib", "pydoc"] else "_" + "+".join(cfg.sources)
    if cfg.get("selfgen_path") and "selfgen" in cfg.sources:  # other answers: another cache
        from specdraft.train.selfgen import selfgen_sources

        where = "|".join(str(Path(p).expanduser().resolve()) for p in selfgen_sources(cfg.selfgen_path))
        sources += "_" + hashlib.sha1(where.encode()).hexdigest()[:8]
    return Path(cfg.cache_dir).expanduser() / (
        f"{cache_name(cfg)}{sources}_E{cfg.exit_layer}_T{cfg.block_size}_k{cfg.top_k}"
    )


def teacher_sets(cfg, target: TargetModel) -> tuple[dict[str, Tensor], dict[str, dict[str, Tensor]]]:  # noqa: ANN001
    """The cached teacher data of the training split and of every held-out group (by name)."""
    cache_root, context = teacher_cache_dir(cfg), bool(cfg.adapter.context)
    path = cfg.get("selfgen_path")
    blocks = load_blocks(target.tokenizer, "train", cfg.train_tokens, list(cfg.sources), cfg.block_size, path)
    train_data = precompute_teacher(target, blocks, cfg.exit_layer, cfg.top_k, cache_root / "train", with_prev=context)
    groups = eval_groups(list(cfg.sources))
    held_by = {"+".join(g): precompute_teacher(
        target, load_blocks(target.tokenizer, "eval", cfg.eval_tokens, g, cfg.block_size, path), cfg.exit_layer, cfg.top_k,
        cache_root / ("eval" if len(groups) == 1 else "eval_" + "+".join(g)), with_prev=context) for g in groups}
    return train_data, held_by


def checkpoint_path(cfg, settings: TrainSettings, vocab: PrunedVocab | None) -> Path | None:  # noqa: ANN001
    """The training checkpoint of this config (None when cfg.checkpoint is off): next to the teacher
    cache, outside out_dir (the artifact directory holds only the adapter), one per run shape."""
    if not cfg.checkpoint:
        return None
    a = cfg.adapter
    tag = (f"w{a.width}_b{a.num_blocks}" + ("_ctx" if a.context else "")
           + f"_n{int(cfg.train_tokens)}_s{settings.max_steps}_v{vocab.size if vocab else 0}")
    return teacher_cache_dir(cfg) / f"train_state_{tag}.pt"


def new_adapter(cfg, hidden_size: int) -> ExitAdapter:  # noqa: ANN001
    """The untrained adapter the config describes; its random init is a function of cfg.seed
    (drawn without touching the process's global random state)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return ExitAdapter(hidden_size, cfg.adapter.width, cfg.adapter.num_blocks, context=bool(cfg.adapter.context))


def run(cfg) -> dict:  # noqa: ANN001 - an OmegaConf DictConfig
    """The whole recipe from a config (see conf/train_early_exit.yaml); returns the eval metrics."""
    from hydra.utils import instantiate

    settings = TrainSettings.from_config(cfg.train)
    prepare_output_dir(cfg.out_dir, bool(cfg.get("overwrite", False)))  # before the target loads
    target: TargetModel = instantiate(cfg.target)
    if not 1 <= cfg.exit_layer < target.num_layers:
        raise ValueError(f"exit_layer must be in [1, {target.num_layers - 1}] for this target, got {cfg.exit_layer}.")
    guard_cache(teacher_cache_dir(cfg), target)
    train_data, held_by = teacher_sets(cfg, target)
    held = {k: torch.cat([h[k] for h in held_by.values()]) for k in next(iter(held_by.values()))}
    vocab = resolve_pruned_vocab(cfg.pruned_vocab, None, target.vocab_size)
    before = agreement(target, None, held, vocab=vocab)
    log.info("untrained exit after layer %d: %s", cfg.exit_layer, before)

    adapter = new_adapter(cfg, target.hidden_size)
    trained = train_adapter(target, adapter, train_data, settings, int(cfg.batch_tokens), seed=int(cfg.seed),
                            vocab=vocab, checkpoint=checkpoint_path(cfg, settings, vocab),
                            evaluate=lambda step: agreement(target, adapter, held, vocab=vocab))
    after = trained.evals[-1]["eval"]  # the skeleton evaluates after the last step
    log.info("trained exit after layer %d: %s", cfg.exit_layer, after)
    seen = agreement(target, adapter, train_sample(train_data, after["tokens"], cfg.block_size), vocab=vocab)
    log.info("the same on training tokens: %s", seen)
    curve = losses(trained)
    metrics = {"untrained": before, "trained": after, "train_sample": seen,
               "trained_full_vocab": agreement(target, adapter, held) if vocab is not None else after,
               "first_loss": curve[0] if curve else None, "last_loss": curve[-1] if curve else None}
    if len(held_by) > 1:
        metrics["by_source"] = {name: {"untrained": agreement(target, None, h, vocab=vocab),
                                       "trained": agreement(target, adapter, h, vocab=vocab)}
                                for name, h in held_by.items()}
        log.info("per held-out source: %s", metrics["by_source"])
    meta = {"exit_layer": int(cfg.exit_layer), "target": target_label(cfg.target),
            RECORD_KEY: target_info(target, target_label(cfg.target)),
            "command": "specdraft-train-early-exit " + " ".join(sys.argv[1:]),
            "train_tokens": int(train_data["hidden"].shape[0]), "eval": metrics,
            "steps_run": trained.step, "stopped_by_budget": trained.stopped_by_budget,  # train.max_minutes ran out
            "batch_tokens": int(cfg.batch_tokens), "train": dataclasses.asdict(settings)}
    save_adapter(adapter, cfg.out_dir, meta)
    if vocab is not None:
        vocab.save(Path(cfg.out_dir) / VOCAB_FILE)
    log.info("saved adapter to %s", cfg.out_dir)
    return metrics


@hydra_cli("train_early_exit")
def main(cfg: DictConfig) -> None:
    """`specdraft-train-early-exit exit_layer=6 train.max_minutes=60`."""
    torch.set_num_threads(int(cfg.threads))
    print(json.dumps(run(cfg), indent=2))

if __name__ == "__main__":
    main()
