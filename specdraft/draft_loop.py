"""The autoregressive drafting loop shared by drafters that run a model of their own.

A draft model and a quantized copy of the target draft the same way: feed the tokens their cache
has not seen, take the next-token logits, warp them with the shared sampling rule, draw a token
(the argmax at temperature 0), feed it back. Only "how to get the next logits" differs, so that is
the one argument.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from specdraft.protocol import Draft, DraftContext
from specdraft.sampling import draw, warp
from specdraft.vocab import PrunedVocab


def draft_autoregressively(
    next_logits: Callable[[Tensor], Tensor],
    feed: Tensor,
    num_tokens: int,
    ctx: DraftContext,
    vocab: PrunedVocab | None = None,
) -> Draft:
    """Draft num_tokens tokens one at a time and return them with their q.

    next_logits(feed [1, n]) -> logits [1, M or V] for the token after feed (it appends feed to
    the drafter's own cache). feed [1, n >= 1]: the committed tokens the cache has not seen yet.
    vocab: the pruned draft vocabulary the logits are over (M columns), or None (V columns);
    q is always returned over the target's V ids (zeros outside the subset), so verification
    stays exact.
    """
    tokens, probs = [], []
    for _ in range(num_tokens):
        q = warp(next_logits(feed), ctx.sampling)  # [1, M or V]
        tok = draw(q, ctx.sampling, ctx.generator)  # [1] index into the logits' columns
        if vocab is not None:
            q, tok = vocab.expand(q), vocab.to_target(tok)  # [1, V], [1] target id
        tokens.append(tok)
        probs.append(q)
        feed = tok[:, None]  # [1, 1]
    if not tokens:
        return Draft(token_ids=ctx.token_ids.new_zeros((ctx.token_ids.shape[0], 0)))
    return Draft(token_ids=torch.stack(tokens, dim=1), probs=torch.stack(probs, dim=1))  # [1, K], [1, K, V]
