"""Per-sequence target outputs computed once and cached in shards on disk (resumable).

Recipes that train on what the frozen target computes (Medusa's hidden states, EAGLE-3's layer
features) run the target over their sequences once: the sequences are cut into shards of about
`shard_tokens` positions, and shard i is `<cache_dir>/<name>-NNNN.pt`. An existing shard is reused
when it holds the same number of positions, so an interrupted run resumes where it stopped and a
growing dataset reuses every full shard.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from specdraft.files import replace_atomically

Sequences = Sequence[tuple[Tensor, int]]  # (token ids [T], first position used)


def cached_shards(sequences: Sequences, cache_dir: Path, name: str,
                  compute: Callable[[Sequences], dict[str, Tensor]], shard_tokens: int = 8192) -> list[dict[str, Tensor]]:
    """compute(shard) for every shard of `sequences` (or its cached result), in order. A shard's
    dict must hold "positions" (a 0-d tensor: the shard's number of positions) or "choice" (one
    entry per position), by which a cached shard is recognised."""
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
    for i, shard in enumerate(tqdm(shards, desc=f"target states {name}", file=sys.stdout)):
        path = cache_dir / f"{name}-{i:04d}.pt"
        part = torch.load(path) if path.is_file() else None
        if part is None or _positions(part) != sum(len(ids) for ids, _ in shard):
            part = compute(shard)
            replace_atomically(path, lambda tmp, part=part: torch.save(part, tmp))
        parts.append(part)
    return parts


def _positions(part: dict[str, Tensor]) -> int:
    return int(part["positions"]) if "positions" in part else len(part["choice"])
