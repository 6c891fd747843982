"""Self-distillation data: the target's own greedy answers to chat-like prompts built offline.

A draft imitates the target best on text the target itself would write: its own generations are far
more predictable than human text (stdlib source), and they look like what the drafter meets at
inference (chat answers). The prompts (`specdraft.train.selfgen_prompts`) are built from offline
text only: "Explain ...", "Summarise ...", "Write a function that ...", templated chat requests.

Output, reusable by every recipe (draft model, Medusa heads, early-exit adapter):
  <out_dir>/selfgen.jsonl   one line per prompt: {"id", "split", "kind", "prompt", "prompt_ids",
                            "completion", "completion_ids"} (chat-templated prompt ids)
  <cache_dir>/topk-*.pt     optional: the target's top-k logits at every generated position,
                            captured during generation for free (a teacher cache for distillation)

Generation is batched (Hugging Face `generate`, left padding; batch 16-32 is far faster per token
than batch 1 on CPU) and resumable: prompts already in the JSONL are skipped. By default a run writes
a fresh folder under Hydra's run directory; continuing an existing JSONL (e.g. adding templated kinds
to the shipped one) names its folder and says so (`overwrite=true`, `specdraft.train.outputs`).

    specdraft-selfgen num_prompts=1200 batch_size=24 max_new_tokens=160   (conf/selfgen.yaml)
    python -m specdraft.train.selfgen "kinds=[math,code_edit]" out_dir=outputs/selfgen overwrite=true
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import Tensor
from transformers import LogitsProcessor, LogitsProcessorList

from specdraft.console import hydra_cli
from specdraft.models import load_target, load_tokenizer
from specdraft.shipped import ARTIFACTS_DIR
from specdraft.target import TargetModel
from specdraft.train.outputs import prepare_output_dir
from specdraft.train.selfgen_prompts import (
    Prompt,
    build_prompts,
    extra_prompts_for,
    followup_prompts,
)

SELFGEN_DIR = ARTIFACTS_DIR / "smollm2-135m" / "selfgen"  # the shipped answers of smollm2-135m
SELFGEN_FILE = "selfgen.jsonl"
SPLITS = ("train", "eval")


# ------------------------------------------------------------------------------------ generation
class TopKRecorder(LogitsProcessor):
    """Records the top-k raw logits of every generation step (scores are returned unchanged)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.values: list[Tensor] = []  # per step [B, k] float16
        self.indices: list[Tensor] = []  # per step [B, k] int32

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        top = torch.topk(scores.float(), self.k, dim=-1)
        self.values.append(top.values.half())
        self.indices.append(top.indices.int())
        return scores


def generate_batch(
    model: torch.nn.Module,
    tokenizer: object,
    prompts: list[Prompt],
    max_new_tokens: int,
    top_k: int,
    eos_token_ids: list[int],
) -> list[dict]:
    """Greedy answers for one batch, with the teacher's top-k logits per generated position."""
    enc = [
        tokenizer.apply_chat_template(p.chat(), add_generation_prompt=True, tokenize=True)  # type: ignore[attr-defined]
        for p in prompts
    ]
    enc = [e["input_ids"] if isinstance(e, dict) or hasattr(e, "keys") else e for e in enc]
    pad = int(tokenizer.pad_token_id)  # type: ignore[attr-defined]
    width = max(len(e) for e in enc)
    ids = torch.full((len(enc), width), pad, dtype=torch.long)  # [B, T] left padded
    mask = torch.zeros_like(ids)
    for i, e in enumerate(enc):
        ids[i, width - len(e) :] = torch.tensor(e)
        mask[i, width - len(e) :] = 1
    recorder = TopKRecorder(top_k)
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            logits_processor=LogitsProcessorList([recorder]),
        )
    gen = out[:, width:]  # [B, N]
    values = torch.stack(recorder.values, dim=1)  # [B, N, k]
    indices = torch.stack(recorder.indices, dim=1)  # [B, N, k]
    eos = set(eos_token_ids) | {pad}
    rows = []
    for i, p in enumerate(prompts):
        toks = gen[i].tolist()
        n = len(toks)
        for j, t in enumerate(toks):
            if t in eos or t == pad:
                n = j + 1
                break
        rows.append(
            {
                "id": p.id,
                "split": p.split,
                "kind": p.kind,
                "prompt": p.text,
                "prompt_ids": list(enc[i]),
                "completion": tokenizer.decode(toks[:n], skip_special_tokens=True),  # type: ignore[attr-defined]
                "completion_ids": toks[:n],
                "topk_values": values[i, :n],
                "topk_indices": indices[i, :n],
            }
        )
    return rows


def run_selfgen(
    target: str | TargetModel = "smollm2-135m",
    *,
    out_dir: str | Path,
    cache_dir: str | Path | None = None,
    num_prompts: int = 1200,
    batch_size: int = 24,
    max_new_tokens: int = 160,
    top_k: int = 32,
    seed: int = 0,
    max_minutes: float | None = None,
    kinds: Sequence[str] = (),
    overwrite: bool = False,
) -> Path:
    """Generate (or resume) the self-distillation JSONL; top-k teacher shards go to cache_dir.

    `kinds` empty: the first `num_prompts` of `build_prompts`. Otherwise every templated prompt of
    those kinds (`selfgen_prompts`; "followup" = a next turn after each generated "advice" or "revise"
    answer, so generate "advice" first), shortest first, so that a batch wastes little padding.
    max_minutes: stop after the batch that passes this wall-clock budget (None = none; resumable).
    overwrite: write into a non-empty out_dir / cache_dir (a selfgen.jsonl there is continued);
    without it such a folder is refused before the target loads (`prepare_output_dir`)."""
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size and max_new_tokens must be >= 1, got {batch_size} and {max_new_tokens}.")
    out = prepare_output_dir(out_dir, overwrite, "out_dir")
    if cache_dir is not None:
        prepare_output_dir(cache_dir, overwrite, "cache_dir")
    path = out / SELFGEN_FILE
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    done = {r["id"] for r in records}
    if kinds:
        pool = extra_prompts_for(kinds, seed)
        if "followup" in kinds:
            pool += followup_prompts(records, seed)
        todo = sorted((p for p in pool if p.id not in done), key=lambda p: len(p.text) + sum(len(c) for _, c in p.history))
    else:
        todo = [p for p in build_prompts(num_prompts, seed) if p.id not in done]
    target = load_target(target, device="cpu") if isinstance(target, str) else target
    print(f"[selfgen] {len(todo)} prompts to generate ({len(done)} already done)", flush=True)
    t0 = time.time()
    tokens = 0
    for b in range(0, len(todo), batch_size):
        batch = sorted(todo[b : b + batch_size], key=lambda p: len(p.text))
        rows = generate_batch(
            target.model, target.tokenizer, batch, max_new_tokens, top_k, target.eos_token_ids
        )
        if cache_dir is not None:
            Path(cache_dir).mkdir(parents=True, exist_ok=True)
            shard = {r["id"]: (r["topk_values"], r["topk_indices"]) for r in rows}
            torch.save(shard, Path(cache_dir) / f"topk-{len(done) + b:06d}.pt")
        with path.open("a") as f:
            for r in rows:
                f.write(json.dumps({k: v for k, v in r.items() if not k.startswith("topk")}) + "\n")
        tokens += sum(len(r["completion_ids"]) for r in rows)
        rate = tokens / (time.time() - t0)
        print(f"[selfgen] {len(done) + b + len(batch)}/{len(done) + len(todo)} prompts, {tokens} tokens, {rate:.0f} tok/s", flush=True)
        if max_minutes is not None and time.time() - t0 > 60 * max_minutes:
            break
    return path


# ------------------------------------------------------------------------------------ loading
def load_selfgen_records(split: str = "train", path: str | Path | None = None) -> list[dict]:
    """The JSONL records of one split ("train" or "eval")."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
    p = Path(path) if path is not None else SELFGEN_DIR / SELFGEN_FILE
    if not p.is_file():
        raise ValueError(
            f"self-distillation data {str(p)!r} does not exist; create it with "
            "`specdraft-selfgen` (or pass the path of an existing selfgen.jsonl)."
        )
    recs = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return [r for r in recs if r["split"] == split]


def load_selfgen_texts(split: str = "train", path: str | Path | None = None) -> list[str]:
    """Prompt + answer texts of one split (chat-formatted as the target saw them), for recipes
    that tokenize text themselves."""
    tok = load_tokenizer("smollm2-135m")
    return [tok.decode(r["prompt_ids"] + r["completion_ids"]) for r in load_selfgen_records(split, path)]


def load_selfgen_sequences(split: str = "train", path: str | Path | None = None) -> list[tuple[Tensor, int]]:
    """(token ids [T] int64, prompt length) per record: the exact ids the target generated."""
    return [
        (torch.tensor(r["prompt_ids"] + r["completion_ids"], dtype=torch.long), len(r["prompt_ids"]))
        for r in load_selfgen_records(split, path)
    ]


@hydra_cli("selfgen")
def main(cfg: DictConfig) -> None:
    """`specdraft-selfgen` / `python -m specdraft.train.selfgen` (Hydra, conf/selfgen.yaml):
    generate the self-distillation data (resumable)."""
    torch.set_num_threads(int(cfg.threads))
    overwrite = bool(cfg.overwrite)
    prepare_output_dir(cfg.out_dir, overwrite, "out_dir")  # before the target loads (run_selfgen checks again)
    if cfg.cache_dir is not None:
        prepare_output_dir(cfg.cache_dir, overwrite, "cache_dir")
    path = run_selfgen(
        instantiate(cfg.target), out_dir=cfg.out_dir, cache_dir=cfg.cache_dir, num_prompts=int(cfg.num_prompts),
        batch_size=int(cfg.batch_size), max_new_tokens=int(cfg.max_new_tokens), top_k=int(cfg.top_k),
        seed=int(cfg.seed), max_minutes=cfg.max_minutes, kinds=tuple(cfg.kinds or ()), overwrite=overwrite,
    )
    print(f"[selfgen] wrote {path}", flush=True)


if __name__ == "__main__":
    main()
