"""The autoregressive drafting loop shared by drafters that run a model of their own.

A draft model and a quantized copy of the target draft the same way: feed the tokens their cache
has not seen, take the next-token logits, warp them with the shared sampling rule, draw a token
(the argmax at temperature 0), feed it back. Only "how to get the next logits" differs, so that is
the one argument.

Optionally a copy source (`copy`: e.g. prompt lookup over the context) proposes the token that
followed an earlier occurrence of the current suffix; it is mixed into q as
q' = (1 - w) q + w * onehot(copy) (`mix_in_copy`), and the token is drawn from q', so the draft
stays a proper distribution and verification stays exact. Small drafts miss exactly these tokens:
they cannot copy from their context the way the target's induction heads do (RESULTS 3n, 3o).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from specdraft.protocol import Draft, DraftContext
from specdraft.sampling import draw, sample, warp
from specdraft.vocab import PrunedVocab


def mix_in_copy(
    q: Tensor, copy_id: int, weight: float, greedy: bool, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Mix a copy proposal into the draft distribution q [1, V] and draw from the mixture.

    q' = (1 - weight) q + weight * onehot(copy_id). Greedy drafts are one-hot, so the mixture's
    argmax is the copy token when weight >= 0.5 (ties go to the copy) and the draft's otherwise;
    the greedy q' returned is the one-hot of that choice. Returns (q' [1, V], token [1]).
    """
    if greedy:
        tok = torch.full_like(q[:, 0], copy_id, dtype=torch.long) if weight >= 0.5 else q.argmax(-1)  # [1]
        return torch.zeros_like(q).scatter_(-1, tok[:, None], 1.0), tok
    mixed = q * (1.0 - weight)  # [1, V]
    mixed[:, copy_id] += weight
    return mixed, sample(mixed, generator)


def draft_autoregressively(
    next_logits: Callable[[Tensor], Tensor],
    feed: Tensor,
    num_tokens: int,
    ctx: DraftContext,
    vocab: PrunedVocab | None = None,
    copy: Callable[[list[int]], int | None] | None = None,
    copy_weight: float = 0.5,
) -> Draft:
    """Draft num_tokens tokens one at a time and return them with their q.

    next_logits(feed [1, n]) -> logits [1, M or V] for the token after feed (it appends feed to
    the drafter's own cache). feed [1, n >= 1]: the committed tokens the cache has not seen yet.
    vocab: the pruned draft vocabulary the logits are over (M columns), or None (V columns);
    q is always returned over the target's V ids (zeros outside the subset), so verification
    stays exact. copy(drafted so far) -> a target id to mix in with weight copy_weight, or None.
    """
    tokens, probs = [], []
    drafted: list[int] = []
    for _ in range(num_tokens):
        q = warp(next_logits(feed), ctx.sampling)  # [1, M or V]
        copy_id = copy(drafted) if copy is not None else None
        if copy_id is None:
            tok = draw(q, ctx.sampling, ctx.generator)  # [1] index into the logits' columns
            if vocab is not None:
                q, tok = vocab.expand(q), vocab.to_target(tok)  # [1, V], [1] target id
        else:
            q = vocab.expand(q) if vocab is not None else q  # [1, V]
            q, tok = mix_in_copy(q, copy_id, copy_weight, ctx.sampling.greedy, ctx.generator)
        if copy is not None:
            drafted.append(int(tok))
        tokens.append(tok)
        probs.append(q)
        feed = tok[:, None]  # [1, 1]
    if not tokens:
        return Draft(token_ids=ctx.token_ids.new_zeros((ctx.token_ids.shape[0], 0)))
    return Draft(token_ids=torch.stack(tokens, dim=1), probs=torch.stack(probs, dim=1))  # [1, K], [1, K, V]
