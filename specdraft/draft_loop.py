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
A greedy copy (weight >= 0.5) does not depend on q, so the model is not run for it: the copied
tokens are fed to it together with the next token it has to predict (one forward instead of one
per token), which makes a run of copies nearly as cheap as prompt lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from specdraft.protocol import Draft, DraftContext
from specdraft.sampling import draw, sample, warp
from specdraft.vocab import PrunedVocab


def mix_in_copy(q: Tensor, copy_id: int, weight: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Mix a copy proposal into the sampled draft distribution q [1, V] and draw from the mixture:
    q' = (1 - weight) q + weight * onehot(copy_id). Returns (q' [1, V], token [1]). (Greedy copies
    never mix: `draft_autoregressively` drafts the copy or ignores it.)"""
    mixed = q * (1.0 - weight)  # [1, V]
    mixed[:, copy_id] += weight
    return mixed, sample(mixed, generator)


@dataclass(frozen=True)
class CopySource:
    """Where a drafter's copies come from and how much they weigh.

    next_token(drafted so far) -> the target id to mix in, or None; weight w in
    q' = (1 - w) q + w onehot; vocab_size: the target's V (the width of a greedy copy's one-hot q).
    """

    next_token: Callable[[list[int]], int | None]
    weight: float
    vocab_size: int


def draft_autoregressively(
    next_logits: Callable[[Tensor], Tensor],
    feed: Tensor,
    num_tokens: int,
    ctx: DraftContext,
    vocab: PrunedVocab | None = None,
    copy: CopySource | None = None,
) -> Draft:
    """Draft num_tokens tokens one at a time and return them with their q.

    next_logits(feed [1, n]) -> logits [1, M or V] for the token after feed (it appends feed to
    the drafter's own cache). feed [1, n >= 1]: the committed tokens the cache has not seen yet.
    vocab: the pruned draft vocabulary the logits are over (M columns), or None (V columns);
    q is always returned over the target's V ids (zeros outside the subset), so verification
    stays exact. copy: mixes copies of earlier context into q (module docstring), or None.
    """
    # Greedy drafts are one-hot, so the mixture's argmax is the copy when w >= 0.5 (ties go to the
    # copy) and the draft's own token otherwise: below 0.5 a greedy draft never uses a copy.
    greedy = ctx.sampling.greedy
    lookup = copy if copy is not None and not (greedy and copy.weight < 0.5) else None
    tokens, probs = [], []
    drafted: list[int] = []
    for _ in range(num_tokens):
        copy_id = lookup.next_token(drafted) if lookup is not None else None
        if copy_id is not None and greedy:
            assert lookup is not None
            tok = feed.new_full((1,), copy_id)  # [1] the copy, whatever q says: q is not computed
            q = torch.zeros((1, lookup.vocab_size), device=feed.device).scatter_(-1, tok[:, None], 1.0)  # [1, V]
            feed = torch.cat([feed, tok[:, None]], dim=1)  # [1, n + 1] fed with the next forward
        else:
            q = warp(next_logits(feed), ctx.sampling)  # [1, M or V]
            if copy_id is None:
                tok = draw(q, ctx.sampling, ctx.generator)  # [1] index into the logits' columns
                if vocab is not None:
                    q, tok = vocab.expand(q), vocab.to_target(tok)  # [1, V], [1] target id
            else:
                assert lookup is not None
                q = vocab.expand(q) if vocab is not None else q  # [1, V]
                q, tok = mix_in_copy(q, copy_id, lookup.weight, ctx.generator)
            feed = tok[:, None]  # [1, 1]
        if lookup is not None:
            drafted.append(int(tok))
        tokens.append(tok)
        probs.append(q)
    if not tokens:
        return Draft(token_ids=ctx.token_ids.new_zeros((ctx.token_ids.shape[0], 0)))
    return Draft(token_ids=torch.stack(tokens, dim=1), probs=torch.stack(probs, dim=1))  # [1, K], [1, K, V]
