"""Per-sequence target outputs computed once and cached in shards on disk (resumable).

Recipes that train on what the frozen target computes (Medusa's hidden states, EAGLE-3's layer
features) run the target over their sequences once: the sequences are cut into shards of about
`shard_tokens` positions, and shard i is `<cache_dir>/<name>-NNNN.pt`. A shard records a digest of
the sequences it was computed from, and an existing shard is reused only when that digest matches, so
an interrupted run resumes where it stopped, a growing dataset reuses every full shard, and a cache
directory reused with other data recomputes instead of training on another dataset's states.
Every shard is returned memory-mapped from its file (a fresh one once written), so a cache larger than
RAM is read from the page cache on demand instead of being held in memory.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from specdraft.files import replace_atomically

Sequences = Sequence[tuple[Tensor, int]]  # (token ids [T], first position used)
DIGEST_KEY = "sequences_digest"


def shard_digest(shard: Sequences) -> Tensor:
    """A 0-d int64 digest of a shard's sequences (token ids and first positions), stored with its outputs."""
    h = hashlib.sha256()
    for ids, first in shard:
        h.update(ids.to(torch.int64).cpu().numpy().tobytes())
        h.update(int(first).to_bytes(8, "little", signed=True))
    return torch.tensor(int.from_bytes(h.digest()[:8], "little", signed=True), dtype=torch.int64)


def cached_shards(sequences: Sequences, cache_dir: Path, name: str,
                  compute: Callable[[Sequences], dict[str, Tensor]], shard_tokens: int = 8192) -> list[dict[str, Tensor]]:
    """compute(shard) for every shard of `sequences` (or its cached result, when the cached shard was
    computed from these very sequences), in order, each memory-mapped from its file."""
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
        digest = shard_digest(shard)
        part = torch.load(path, mmap=True) if path.is_file() else None
        if part is None or DIGEST_KEY not in part or not torch.equal(part[DIGEST_KEY], digest):
            fresh = {**compute(shard), DIGEST_KEY: digest}
            replace_atomically(path, lambda tmp, fresh=fresh: torch.save(fresh, tmp))
            part = torch.load(path, mmap=True)
        parts.append(part)
    return parts
