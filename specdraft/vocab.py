"""A pruned draft vocabulary: draft over the M most frequent target tokens instead of all V.

A small drafter's cost is dominated by its lm_head (V x H; for SmolLM2 49152 x 576 is ~5.5 ms a
token on CPU). Projecting onto a subset of M target token ids cuts that by V / M. The drafter's q
stays a distribution over the TARGET's ids: it is zero outside the subset (`expand`), so the
verifier (greedy or rejection sampling) is exact whatever subset is chosen; a smaller subset only
lowers acceptance when the target's token is outside it.

Shared by every drafter that owns an lm_head (draft model, quantized draft, Medusa heads):

    vocab = build_pruned_vocab(token_blocks, size=8192, vocab_size=49152)
    head = vocab.head(target.lm_head.weight)        # [M, H] copy, build once
    sub_logits = hidden @ head.T                    # [..., M]   (or vocab.logits(hidden, head))
    q = vocab.expand(warp(sub_logits, sampling))    # [..., V], zeros outside the subset
    token_ids = vocab.ids[sub_token]                # subset index -> target id
    vocab.save(path); PrunedVocab.load(path)
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

VOCAB_FILE = "pruned_vocab.json"  # the one file name, next to every artifact trained on a subset
AUTO = "auto"


class PrunedVocab:
    """An ordered subset of a target vocabulary.

    ids: [M] int64 target token ids, unique, in [0, vocab_size); subset index i <-> target id ids[i].
    vocab_size: V, the size of the target vocabulary the subset is taken from.
    """

    def __init__(self, ids: Tensor | Iterable[int], vocab_size: int) -> None:
        ids = torch.as_tensor(list(ids) if not isinstance(ids, Tensor) else ids, dtype=torch.long)
        if ids.dim() != 1 or ids.numel() == 0:
            raise ValueError(f"pruned vocabulary ids must be a non-empty 1-D list, got shape {tuple(ids.shape)}.")
        if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
            raise ValueError(
                f"pruned vocabulary ids must lie in [0, {vocab_size}); got ids in "
                f"[{int(ids.min())}, {int(ids.max())}] - was the subset built for another vocabulary?"
            )
        if torch.unique(ids).numel() != ids.numel():
            raise ValueError("pruned vocabulary ids must be unique; remove the duplicates.")
        self.ids = ids  # [M]
        self.vocab_size = int(vocab_size)
        # target id -> subset index, -1 outside the subset
        self.index_of = torch.full((vocab_size,), -1, dtype=torch.long)  # [V]
        self.index_of[ids] = torch.arange(ids.numel())

    @property
    def size(self) -> int:
        """M, the number of target tokens the drafter can propose."""
        return int(self.ids.numel())

    def to(self, device: torch.device | str) -> PrunedVocab:
        """A copy whose id tensors live on `device`."""
        out = PrunedVocab.__new__(PrunedVocab)
        out.ids, out.index_of, out.vocab_size = self.ids.to(device), self.index_of.to(device), self.vocab_size
        return out

    # ------------------------------------------------------------------------------- projection
    def head(self, lm_head_weight: Tensor) -> Tensor:
        """The rows of a full lm_head weight [V, H] for the subset -> [M, H] (a contiguous copy)."""
        if lm_head_weight.shape[0] != self.vocab_size:
            raise ValueError(
                f"lm_head has {lm_head_weight.shape[0]} rows but this pruned vocabulary was built "
                f"for a vocabulary of {self.vocab_size}; rebuild it for this model."
            )
        return lm_head_weight.detach()[self.ids.to(lm_head_weight.device)].contiguous()

    def logits(self, hidden: Tensor, head_weight: Tensor) -> Tensor:
        """Subset logits [..., M] from hidden [..., H] and a head weight [M, H] (from `head`)
        or a full lm_head weight [V, H] (sliced on every call: fine once, slow in a loop)."""
        if head_weight.shape[0] != self.size:
            head_weight = self.head(head_weight)
        return hidden @ head_weight.T

    # ------------------------------------------------------------------------------- mapping
    def expand(self, sub_probs: Tensor) -> Tensor:
        """Probabilities over the subset [..., M] -> over the target vocabulary [..., V]
        (zeros outside the subset)."""
        out = sub_probs.new_zeros(sub_probs.shape[:-1] + (self.vocab_size,))  # [..., V]
        idx = self.ids.to(sub_probs.device).expand_as(sub_probs)
        return out.scatter_(-1, idx, sub_probs)

    def expand_logits(self, sub_logits: Tensor) -> Tensor:
        """Logits over the subset [..., M] -> [..., V] with -inf outside the subset."""
        out = sub_logits.new_full(sub_logits.shape[:-1] + (self.vocab_size,), float("-inf"))
        idx = self.ids.to(sub_logits.device).expand_as(sub_logits)
        return out.scatter_(-1, idx, sub_logits)

    def to_target(self, sub_index: Tensor) -> Tensor:
        """Subset indices (any shape) -> target token ids (same shape)."""
        return self.ids.to(sub_index.device)[sub_index]

    def to_subset(self, token_ids: Tensor) -> Tensor:
        """Target token ids (any shape) -> subset indices, -1 where the token is outside."""
        return self.index_of.to(token_ids.device)[token_ids]

    def coverage(self, token_ids: Tensor) -> float:
        """Fraction of the given target tokens that the subset contains."""
        return float((self.to_subset(token_ids.reshape(-1)) >= 0).float().mean())

    # ------------------------------------------------------------------------------- io
    def save(self, path: str | Path) -> None:
        """Write {"vocab_size": V, "ids": [...]} as JSON."""
        Path(path).write_text(json.dumps({"vocab_size": self.vocab_size, "ids": self.ids.tolist()}))

    @classmethod
    def load(cls, path: str | Path) -> PrunedVocab:
        """Read a file written by `save`."""
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"pruned vocabulary file {str(p)!r} does not exist; check the path.")
        data = json.loads(p.read_text())
        return cls(data["ids"], data["vocab_size"])


def build_pruned_vocab(
    token_ids: Tensor | Iterable[Tensor],
    size: int,
    vocab_size: int,
    always_include: Iterable[int] = (),
    weights: Iterable[float] | None = None,
) -> PrunedVocab:
    """The `size` most frequent tokens of a corpus (plus `always_include`, e.g. EOS and chat
    special tokens), ordered by frequency.

    token_ids: a tensor of target token ids (any shape, e.g. `specdraft.data.token_blocks(...)`) or
        an iterable of such tensors (e.g. one per generated sequence).
    size: M; must be <= vocab_size. Ties in frequency keep the smaller token id first.
    weights: optional weight per chunk (e.g. count the target's own answers more than raw text).
    """
    if not 0 < size <= vocab_size:
        raise ValueError(f"pruned vocabulary size must be in [1, {vocab_size}], got {size}.")
    chunks = [token_ids] if isinstance(token_ids, Tensor) else list(token_ids)
    counts = torch.zeros(vocab_size, dtype=torch.float64)  # [V]
    chunk_weights = [1.0] * len(chunks) if weights is None else [float(w) for w in weights]
    if len(chunk_weights) != len(chunks):
        raise ValueError(f"got {len(chunk_weights)} weights for {len(chunks)} token chunks; give one per chunk.")
    for chunk, w in zip(chunks, chunk_weights):
        flat = chunk.reshape(-1).long().cpu()
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= vocab_size):
            raise ValueError(f"corpus token ids must lie in [0, {vocab_size}); is it the target's tokenizer?")
        counts += w * torch.bincount(flat, minlength=vocab_size).double()
    forced = sorted(set(int(t) for t in always_include))
    if len(forced) > size:
        raise ValueError(f"always_include has {len(forced)} tokens, more than size={size}.")
    counts[forced] = float("inf")
    # stable sort: equal counts keep ascending token id
    order = torch.sort(-counts, stable=True).indices[:size]  # [M]
    return PrunedVocab(order, vocab_size)


def resolve_pruned_vocab(
    spec: str | Path | PrunedVocab | None, artifact_dir: Path | None, vocab_size: int
) -> PrunedVocab | None:
    """The `pruned_vocab` option every drafter takes, resolved once the target is known.

    spec: "auto" = the subset saved next to the drafter's artifact (`artifact_dir / VOCAB_FILE`) if
    there is one, else the full vocabulary; None = always the full vocabulary; a path to a JSON
    written by `PrunedVocab.save`; or a `PrunedVocab`. vocab_size: the target's V (checked).
    """
    if spec is None:
        return None
    if isinstance(spec, PrunedVocab):
        vocab = spec
    elif str(spec) == AUTO:
        saved = None if artifact_dir is None else Path(artifact_dir) / VOCAB_FILE
        if saved is None or not saved.is_file():
            return None
        vocab = PrunedVocab.load(saved)
    else:
        vocab = PrunedVocab.load(spec)
    if vocab.vocab_size != vocab_size:
        raise ValueError(
            f"the pruned vocabulary was built for {vocab.vocab_size} tokens but the target has {vocab_size}; "
            "rebuild it for this target (specdraft.vocab.build_pruned_vocab) or set pruned_vocab=null."
        )
    return vocab
