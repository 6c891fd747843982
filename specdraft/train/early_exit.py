"""Exit-adapter training for early-exit self-drafting (`specdraft-train-early-exit`).

The draft of `drafters.early_exit.EarlyExitDrafter` is the target's own first E layers followed by
the target's final norm and lm_head. Untrained, that exit rarely agrees with the full model (2.4 %
top-1 after layer 6 of SmolLM2-135M), so a small residual MLP (`ExitAdapter`, zero-initialised:
it starts as the identity) is trained on layer E's hidden state to imitate the final layer's
distribution (cross-entropy to the teacher's top-k distribution).

Teacher outputs are expensive (a full forward per token) and the adapter is cheap, so the recipe
precomputes once and caches on disk: layer-E hidden states [N, H] (float16) and the teacher's
top-k logits/ids [N, k]; training then only runs adapter + norm + lm_head. Every phase is
resumable (cache shards, training checkpoints), so a killed background job loses little.
`adapter.context=true` trains a context adapter (`ExitAdapter(context=True)`): it also reads the
target's final-layer hidden state of the position before, cached with the rest.

    specdraft-train-early-exit exit_layer=6 adapter.context=true "sources=[selfgen,stdlib,pydoc]" \
        train_tokens=3200000 steps=60000 train_minutes=35 threads=2 \
        draft_vocab=specdraft/artifacts/smollm2-135m/draft/pruned_vocab.json out_dir=specdraft/artifacts/smollm2-135m/early_exit
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from specdraft.exit_adapter import VOCAB_FILE, ExitAdapter, exit_head, exit_hidden, exit_logits, save_adapter
from specdraft.target import TargetModel
from specdraft.vocab import PrunedVocab

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
            tmp = shard.with_suffix(".tmp")
            save_file(cached, str(tmp))
            tmp.rename(shard)
            log.info("teacher cache %s: %d/%d blocks", out_dir.name, start + ids.shape[0], blocks.shape[0])
        parts.append(cached)
    return {k: torch.cat([p[k] for p in parts]) for k in keys}


# ----------------------------------------------------------------------------------- training
def distill_loss(logits: Tensor, top_logits: Tensor, top_ids: Tensor) -> Tensor:
    """Cross-entropy of the student logits [N, V] to the teacher's top-k distribution
    (softmax over its top-k logits [N, k] at ids [N, k]); equals KL up to the teacher's entropy.
    Ids < 0 (outside a pruned vocabulary) are left out of the teacher distribution; rows with no
    id left are skipped."""
    valid = top_ids >= 0  # [N, k]
    rows = valid.any(-1)  # [N]
    teacher = torch.softmax(top_logits.float().masked_fill(~valid, float("-inf")), dim=-1)[rows]  # [n, k]
    logq = torch.log_softmax(logits[rows], dim=-1).gather(-1, top_ids[rows].clamp(min=0).long())  # [n, k]
    return -(teacher * logq).sum(-1).mean()


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


def train_adapter(
    target: TargetModel,
    adapter: ExitAdapter,
    train: dict[str, Tensor],
    steps: int,
    batch_tokens: int,
    lr: float,
    seed: int = 0,
    max_seconds: float | None = None,
    checkpoint: Path | None = None,
    checkpoint_every: int = 100,
    log_every: int = 50,
    vocab: PrunedVocab | None = None,
    chain_prob: float = 0.0,
) -> list[float]:
    """AdamW on `distill_loss` with cosine decay over steps or over max_seconds, whichever runs
    out first (on a shared CPU the time budget usually does); the target stays frozen. Resumes
    from (and writes) `checkpoint` (adapter + optimizer + step). With `vocab` the student projects
    onto that subset only (V / M times cheaper). chain_prob: for a context adapter, the share of
    positions whose `prev` is the adapter's own (detached) output at the position before instead of
    the target's, as for the second and later draft tokens. Returns the loss of every step."""
    for p in target.model.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(adapter.parameters(), lr=lr, weight_decay=0.0)
    step = 0
    if checkpoint is not None and checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=True)
        adapter.load_state_dict(state["adapter"])
        opt.load_state_dict(state["optimizer"])
        step = int(state["step"])
        log.info("resumed from %s at step %d", checkpoint, step)
    gen = torch.Generator().manual_seed(seed + step)
    n = train["hidden"].shape[0]
    head = None if vocab is None else vocab.head(target.lm_head.weight)  # [M, H]
    losses: list[float] = []
    t0 = time.monotonic()
    adapter.train()
    while step < steps:
        progress = step / steps
        if max_seconds:
            progress = max(progress, (time.monotonic() - t0) / max_seconds)
        for group in opt.param_groups:
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        idx = torch.randint(0, n, (batch_tokens,), generator=gen)
        h = train["hidden"][idx].float().to(target.device)  # [b, H]
        prev = train["prev"][idx].float().to(target.device) if adapter.context else None  # [b, H]
        if prev is not None and chain_prob > 0:
            before = (idx - 1).clamp(min=0)  # same block wherever prev is non-zero (not a block start)
            with torch.no_grad():
                own = exit_hidden(target, train["hidden"][before].float().to(target.device), adapter,
                                  train["prev"][before].float().to(target.device))  # [b, H]
            use = (torch.rand(idx.shape[0], generator=gen) < chain_prob).to(target.device)
            use &= (prev != 0).any(-1)
            prev = torch.where(use[:, None], own, prev)
        ids = train["top_ids"][idx].long().to(target.device)  # [b, k]
        if vocab is not None:
            ids = vocab.to_subset(ids)  # -1 outside the subset
        loss = distill_loss(exit_logits(target, h, adapter, head, prev=prev), train["top_logits"][idx].to(target.device), ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        losses.append(float(loss.detach()))
        if step % log_every == 0:
            log.info("step %d/%d loss %.4f (%.0f s)", step, steps, sum(losses[-log_every:]) / log_every,
                     time.monotonic() - t0)
        out_of_time = max_seconds is not None and time.monotonic() - t0 > max_seconds
        if checkpoint is not None and (step % checkpoint_every == 0 or step == steps or out_of_time):
            tmp = checkpoint.with_suffix(".tmp")
            torch.save({"adapter": adapter.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
            tmp.rename(checkpoint)
        if out_of_time:
            log.info("time budget reached at step %d", step)
            break
    adapter.eval()
    return losses


def load_blocks(tokenizer: object, split: str, max_tokens: int, sources: list[str], block_size: int) -> Tensor:
    """Token blocks [N, block_size] of one split of `sources`: "selfgen" (the target's own answers,
    exact ids, specdraft.train.selfgen) first, then the specdraft.data corpus sources, as one
    stream cut into blocks. A larger max_tokens gives the same blocks plus more (cache shards stay
    valid)."""
    from specdraft.data import corpus_documents, token_blocks

    corpus = [s for s in sources if s != "selfgen"]
    parts: list[Tensor] = []
    if "selfgen" in sources:
        from specdraft.train.selfgen import load_selfgen_sequences

        parts += [ids for ids, _ in load_selfgen_sequences(split)]
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


def train_sample(train: dict[str, Tensor], tokens: int, block_size: int) -> dict[str, Tensor]:
    """About `tokens` cached training tokens as whole blocks spread evenly over the split (whole
    blocks keep `agreement`'s chained score right). Scored next to the held-out sets, the gap
    tells overfitting (more data helps) from underfitting (more steps or width help)."""
    n_blocks = train["hidden"].shape[0] // block_size
    picks = torch.linspace(0, n_blocks - 1, min(n_blocks, max(1, tokens // block_size))).round().long()  # [b]
    idx = (picks[:, None] * block_size + torch.arange(block_size)).flatten()  # [b * T]
    return {k: v[idx] for k, v in train.items()}


def eval_groups(sources: list[str]) -> list[list[str]]:
    """The held-out sets scored apart: the target's own answers and the text corpus are different
    domains (top-1 differs by 2-3x), so a mixed recipe reports each."""
    corpus = [s for s in sources if s != "selfgen"]
    return [g for g in (["selfgen"] if "selfgen" in sources else [], corpus) if g]


def teacher_cache_dir(cfg) -> Path:  # noqa: ANN001 - an OmegaConf DictConfig
    """Where the recipe caches layer-E hidden states and teacher top-k for this config. Shards are
    blocks of the same token stream, so a larger train_tokens reuses them."""
    sources = "" if list(cfg.sources) == ["stdlib", "pydoc"] else "_" + "+".join(cfg.sources)
    return Path(cfg.cache_dir).expanduser() / (
        f"{cfg.cache_name}{sources}_E{cfg.exit_layer}_T{cfg.block_size}_k{cfg.top_k}"
    )


def run(cfg) -> dict:  # noqa: ANN001 - an OmegaConf DictConfig
    """The whole recipe from a config (see conf/train_early_exit.yaml); returns the eval metrics."""
    from hydra.utils import instantiate

    torch.manual_seed(cfg.seed)
    target: TargetModel = instantiate(cfg.target)
    layers = target.num_layers
    if not 1 <= cfg.exit_layer < layers:
        raise ValueError(f"exit_layer must be in [1, {layers - 1}] for this target, got {cfg.exit_layer}.")
    cache_root = teacher_cache_dir(cfg)
    context = bool(cfg.adapter.context)
    train_blocks = load_blocks(target.tokenizer, "train", cfg.train_tokens, list(cfg.sources), cfg.block_size)
    train = precompute_teacher(target, train_blocks, cfg.exit_layer, cfg.top_k, cache_root / "train", with_prev=context)
    groups = eval_groups(list(cfg.sources))
    held_by = {"+".join(g): precompute_teacher(
        target, load_blocks(target.tokenizer, "eval", cfg.eval_tokens, g, cfg.block_size), cfg.exit_layer, cfg.top_k,
        cache_root / ("eval" if len(groups) == 1 else "eval_" + "+".join(g)), with_prev=context) for g in groups}
    held = {k: torch.cat([h[k] for h in held_by.values()]) for k in next(iter(held_by.values()))}
    vocab = PrunedVocab.load(cfg.draft_vocab) if cfg.draft_vocab else None
    before = agreement(target, None, held, vocab=vocab)
    log.info("untrained exit after layer %d: %s", cfg.exit_layer, before)

    dropout = float(cfg.adapter.dropout)
    adapter = ExitAdapter(target.hidden_size, cfg.adapter.width, cfg.adapter.num_blocks, context=context, dropout=dropout)
    ckpt = None
    if cfg.checkpoint:  # outside out_dir: the artifact directory holds only the adapter; one per data size too
        tag = (f"w{cfg.adapter.width}_b{cfg.adapter.num_blocks}" + ("_ctx" if context else "")
               + (f"_ch{cfg.adapter.chain_prob}" if context and cfg.adapter.chain_prob else "")
               + (f"_do{dropout}" if dropout else "") + f"_n{int(cfg.train_tokens)}_s{cfg.steps}_v{vocab.size if vocab else 0}")
        ckpt = cache_root / f"checkpoint_{tag}.pt"
    losses = train_adapter(target, adapter, train, cfg.steps, cfg.batch_tokens, cfg.lr, cfg.seed,
                           max_seconds=60 * cfg.train_minutes if cfg.train_minutes else None,
                           checkpoint=ckpt, log_every=cfg.log_every, vocab=vocab,
                           chain_prob=float(cfg.adapter.chain_prob) if context else 0.0)
    after = agreement(target, adapter, held, vocab=vocab)
    log.info("trained exit after layer %d: %s", cfg.exit_layer, after)
    seen = agreement(target, adapter, train_sample(train, after["tokens"], cfg.block_size), vocab=vocab)
    log.info("the same on training tokens: %s", seen)
    metrics = {"untrained": before, "trained": after, "train_sample": seen,
               "trained_full_vocab": agreement(target, adapter, held) if vocab is not None else after,
               "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None}
    if len(held_by) > 1:
        metrics["by_source"] = {name: {"untrained": agreement(target, None, h, vocab=vocab),
                                       "trained": agreement(target, adapter, h, vocab=vocab)}
                                for name, h in held_by.items()}
        log.info("per held-out source: %s", metrics["by_source"])
    meta = {"exit_layer": int(cfg.exit_layer), "target": str(cfg.target.get("name_or_path", "")),
            "command": "specdraft-train-early-exit " + " ".join(sys.argv[1:]),
            "train_tokens": int(train["hidden"].shape[0]), "eval": metrics,
            "steps": int(cfg.steps), "steps_run": len(losses),  # fewer when train_minutes ran out first (this invocation)
            "batch_tokens": int(cfg.batch_tokens), "lr": float(cfg.lr)}
    save_adapter(adapter, cfg.out_dir, meta)
    if vocab is not None:
        vocab.save(Path(cfg.out_dir) / VOCAB_FILE)
    log.info("saved adapter to %s", cfg.out_dir)
    return metrics


def main() -> None:
    """Hydra entry point: `specdraft-train-early-exit exit_layer=6 train_minutes=60`."""
    import hydra

    @hydra.main(version_base="1.3", config_path="pkg://conf", config_name="train_early_exit")
    def _main(cfg) -> None:  # noqa: ANN001
        torch.set_num_threads(int(cfg.threads))
        print(json.dumps(run(cfg), indent=2))

    _main()


if __name__ == "__main__":
    main()
