"""Repeated random sequences: a synthetic copying task meant to give a small draft an induction head.

The target copies from its context (a list shown again, an email rewritten, its own greedy loops):
it has induction heads (layers 17 and 18 of SmolLM2-135M attend from a repeated token to the
token after its earlier occurrence; RESULTS §3n). A draft made of the target's first two layers
has none (it copies 0% of a repeated random sequence), and distillation on natural text, even on
chats that repeat an answer (`copy_chats`), did not make one in 40 minutes (§3m); our reading: in natural
text bigram statistics predict most repeated tokens too, so the gradient towards looking back is weak.

On a repeated sequence of random tokens [a; a] nothing but looking back predicts the second half,
so they are the plainest signal towards an induction head. They are training data for the
distillation recipe (`data.repeats=N`): their "teacher" distribution is one-hot on the copied
token (the correct continuation of an exact repeat; the target itself puts its argmax there on
84% of such positions) and only the second copy's positions are trained.

Measured (RESULTS §3n): with one fixed span the 2-layer draft learned a positional shortcut (copy
the token `span` positions back), not induction; with spans that vary (as here), 500 steps of
copying alone did not form an induction head. What it takes on this CPU is open.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import Tensor

from specdraft.train.distill import Example


def repeat_sequences(pool: Tensor, count: int, min_span: int, max_span: int, seed: int) -> list[Tensor]:
    """`count` sequences [a; a], each [2 * span] int64 with span drawn uniformly from
    [min_span, max_span] and a = span tokens drawn uniformly from `pool` ([P] target token ids),
    with a torch generator seeded by `seed`. The span varies so that "copy the token span positions
    back" does not solve the task: with one fixed span a draft learned exactly that shortcut (it
    copied 90% at the trained span and 0% at another; RESULTS §3n)."""
    if count < 0 or not 2 <= min_span <= max_span:
        raise ValueError(f"repeated sequences need count >= 0 and 2 <= min_span <= max_span, "
                         f"got count={count}, min_span={min_span}, max_span={max_span}.")
    if pool.numel() < 2:
        raise ValueError("the token pool for repeated sequences needs at least 2 tokens.")
    g = torch.Generator().manual_seed(seed)
    spans = torch.randint(min_span, max_span + 1, (count,), generator=g)  # [N]
    out = []
    for span in spans.tolist():
        a = pool[torch.randint(0, pool.numel(), (span,), generator=g)]  # [S]
        out.append(torch.cat([a, a]))  # [2S]
    return out


def repeat_examples(pool: Tensor, count: int, min_span: int, max_span: int, top_k: int, seed: int) -> list[Example]:
    """Training examples from `repeat_sequences`: positions span .. 2*span-2 of the second copy,
    each with a one-hot teacher on the copied next token (top-k values [0, -inf, ...], all k
    indices that token, so the examples batch with real teacher top-k of the same k)."""
    out = []
    for ids in repeat_sequences(pool, count, min_span, max_span, seed):
        span = len(ids) // 2
        positions = torch.arange(span, 2 * span - 1)  # [S-1] predicts ids[t + 1] = a[t + 1 - span]
        values = torch.full((span - 1, top_k), float("-inf"), dtype=torch.float16)  # [S-1, k]
        values[:, 0] = 0.0
        labels = ids[positions + 1]  # [S-1]
        out.append(Example(ids, positions, values, labels[:, None].expand(-1, top_k).clone()))
    return out


def token_pool(vocab_ids: Tensor, size: int, exclude: Collection[int]) -> Tensor:
    """The `size` first ids of a frequency-ordered pruned vocabulary, leaving out `exclude`
    (end-of-sequence and chat special tokens): the tokens repeated sequences are drawn from."""
    keep = [int(t) for t in vocab_ids.tolist() if int(t) not in set(exclude)][:size]
    return torch.tensor(keep, dtype=torch.long)  # [P]
