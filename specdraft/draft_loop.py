"""The autoregressive drafting loop: the one loop of every drafter that drafts a token at a time
with a model (a draft model, a quantized copy of the target, the target's own early exit).

They all draft the same way: feed the tokens the model has not seen, take the next-token logits,
warp them with the shared sampling rule, draw a token (the argmax at temperature 0), feed it back.
Only "how to get the next logits" differs, so that is the one argument (`next_logits`). A drafter
that runs a model of its own keeps that model's KV cache in step with the committed tokens through
`DraftCache`.

Optionally a copy source (`copy`: e.g. prompt lookup over the context) proposes the token that
followed an earlier occurrence of the current suffix; it is mixed into q as
q' = (1 - w) q + w * onehot(copy) (`mix_in_copy`), and the token is drawn from q', so the draft
stays a proper distribution and verification stays exact. Small drafts miss exactly these tokens:
they cannot copy from their context the way the target's induction heads do.
A greedy copy (weight >= 0.5) does not depend on q, so the model is not run for it: the copied
tokens are fed to it together with the next token it has to predict (one forward instead of one
per token), which makes a run of copies nearly as cheap as prompt lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from specdraft.protocol import Draft, DraftContext
from specdraft.sampling import draw, sample, warp
from specdraft.vocab import PrunedVocab

if TYPE_CHECKING:
    from specdraft.target import TargetModel


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


class DraftCache:
    """A drafting model's own KV cache, kept in step with the committed tokens.

    runner: the drafting model as a `TargetModel` (the fast stack when its layers allow it, the
    Hugging Face stack otherwise, e.g. for quantized layers). Between rounds the cache keeps the
    longest prefix of its tokens that matches the committed ones, so the recovered / bonus token
    (and a fully accepted last draft token) are fed next round without recomputing the prefix, and
    a rejected draft never leaves stale K/V behind.
    """

    def __init__(self, runner: TargetModel) -> None:
        self.runner = runner
        self._ids: Tensor | None = None  # [1, L] tokens whose K/V the runner caches

    @property
    def length(self) -> int:
        """Positions cached."""
        return 0 if self._ids is None else int(self._ids.shape[1])

    def reset(self) -> None:
        """New prompt: an empty cache."""
        self.runner.reset()
        self._ids = None

    def sync(self, committed: Tensor) -> None:
        """Crop the cache to the longest common prefix of its tokens and committed [1, T]."""
        if self._ids is None:
            return
        n = min(self._ids.shape[1], committed.shape[1])
        same = (self._ids[0, :n] == committed[0, :n].to(self._ids.device)).long()  # [n]
        self._crop(int(same.cumprod(0).sum()))

    def feed(self, committed: Tensor) -> Tensor:
        """Sync with committed [1, T] and return the tokens the cache has not seen [1, n >= 1]
        (when everything is cached, the newest token is dropped from the cache and fed again:
        its logits are the ones the next draft token needs)."""
        self.sync(committed)
        if self.length >= committed.shape[1]:
            self._crop(committed.shape[1] - 1)
        return committed[:, self.length :]

    def forward(self, feed: Tensor) -> Tensor:
        """Run feed [1, n] after the cached positions; post-norm hidden [1, H] of the last one."""
        hidden = self.runner.forward(feed, num_logits=0).hidden[:, -1]  # [1, H]
        self._ids = feed if self._ids is None else torch.cat([self._ids, feed.to(self._ids.device)], dim=1)
        return hidden

    def _crop(self, keep: int) -> None:
        """Keep the first `keep` cached positions."""
        if self._ids is None or keep >= self._ids.shape[1]:
            return
        if keep <= 0:
            self.reset()
            return
        self.runner.crop(keep)
        self._ids = self._ids[:, :keep]
