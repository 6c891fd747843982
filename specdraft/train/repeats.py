"""Repeated random sequences: a synthetic copying task that gives a small draft an induction head.

The target copies from its context (a list shown again, an email rewritten, its own greedy loops):
it has induction heads (layers 17 and 18 of SmolLM2-135M attend from a repeated token to the
token after its earlier occurrence; RESULTS §3n). A draft made of the target's first two layers
has none (it copies 0% of a repeated random sequence), and distillation on natural text, even on
chats that repeat an answer (`copy_chats`), did not make one in 40 minutes (§3m): in natural text
bigram statistics predict most repeated tokens too, so the gradient towards looking back is weak.

On a repeated sequence of random tokens [a; a] nothing but looking back predicts the second half,
so the same 2-layer draft learns to copy it in ~200 steps (§3n). These sequences are training
data for the distillation recipe (`data.repeats=N`): their "teacher" distribution is one-hot on
the copied token (the correct continuation of an exact repeat; the target itself puts its argmax
there on 73% of such positions) and only the second copy's positions are trained.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import Tensor

from specdraft.train.distill import Example


def repeat_sequences(pool: Tensor, count: int, span: int, seed: int) -> list[Tensor]:
    """`count` sequences [a; a] (each [2 * span] int64), a = `span` tokens drawn uniformly from
    `pool` ([P] target token ids) with a torch generator seeded by `seed`."""
    if count < 0 or span < 2:
        raise ValueError(f"repeated sequences need count >= 0 and span >= 2, got count={count}, span={span}.")
    if pool.numel() < 2:
        raise ValueError("the token pool for repeated sequences needs at least 2 tokens.")
    g = torch.Generator().manual_seed(seed)
    a = pool[torch.randint(0, pool.numel(), (count, span), generator=g)]  # [N, S]
    return list(torch.cat([a, a], dim=1))  # N x [2S]


def repeat_examples(pool: Tensor, count: int, span: int, top_k: int, seed: int) -> list[Example]:
    """Training examples from `repeat_sequences`: positions span .. 2*span-2 of the second copy,
    each with a one-hot teacher on the copied next token (top-k values [0, -inf, ...], all k
    indices that token, so the examples batch with real teacher top-k of the same k)."""
    out = []
    positions = torch.arange(span, 2 * span - 1)  # [S-1] predicts ids[t + 1] = a[t + 1 - span]
    values = torch.full((span - 1, top_k), float("-inf"), dtype=torch.float16)  # [S-1, k]
    values[:, 0] = 0.0
    for ids in repeat_sequences(pool, count, span, seed):
        labels = ids[positions + 1]  # [S-1]
        out.append(Example(ids, positions, values, labels[:, None].expand(-1, top_k).clone()))
    return out


def token_pool(vocab_ids: Tensor, size: int, exclude: Collection[int]) -> Tensor:
    """The `size` first ids of a frequency-ordered pruned vocabulary, leaving out `exclude`
    (end-of-sequence and chat special tokens): the tokens repeated sequences are drawn from."""
    keep = [int(t) for t in vocab_ids.tolist() if int(t) not in set(exclude)][:size]
    return torch.tensor(keep, dtype=torch.long)  # [P]
