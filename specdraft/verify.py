"""The shared verifier: pure functions that decide how much of a draft the target keeps.

Given the target's warped distributions p at the K+1 positions of one forward over
[newest token] + draft, and the drafter's q at the K draft positions:

* `rejection_sample` (Leviathan et al. 2023, Chen et al. 2023) accepts draft token x_i with
  probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection it emits a *recovered* token drawn
  from norm(max(0, p_i - q_i)); if all K are accepted it emits a *bonus* token drawn from p_K.
  The emitted tokens are distributed exactly as p, whatever q is.
* Deterministic drafters (q = None) are one-hot q: x_i is accepted with probability p_i(x_i) and the
  residual is p_i with x_i removed, renormalised.
* `greedy_verify` (temperature 0) accepts while the draft equals the target's argmax and emits the
  target's argmax at the first mismatch (or after the last draft token).

Every round emits num_accepted + 1 tokens: draft[:num_accepted] followed by `next_token`.
In a batch, rows may draft different numbers of tokens: `lengths` [B] says how many of a row's K
draft tokens are real (the rest is padding the target scored but nobody reads); row i accepts at
most lengths[i] and its bonus comes from p at position lengths[i].
Uniforms are float64; the test `u * q < p` never divides by q and never accepts a token with p = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdraft.sampling import sample


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of one round for every sequence in the batch."""

    num_accepted: Tensor  # [B] int64, leading draft tokens kept (0..K)
    next_token: Tensor  # [B] int64, the recovered token (if num_accepted < K) or the bonus token


def greedy_verify(draft_ids: Tensor, target_logits: Tensor, lengths: Tensor | None = None) -> VerifyResult:
    """Accept the longest prefix of draft_ids [B, K] equal to argmax(target_logits [B, K+1, V]),
    at most lengths[i] [B] tokens in row i (None = all K)."""
    target_ids = target_logits.argmax(dim=-1)  # [B, K+1]
    num_accepted = leading_true(_real(draft_ids == target_ids[:, :-1], lengths))  # [B]
    next_token = target_ids.gather(1, num_accepted[:, None]).squeeze(1)  # [B]
    return VerifyResult(num_accepted=num_accepted, next_token=next_token)


def rejection_sample(
    draft_ids: Tensor,
    draft_probs: Tensor | None,
    target_probs: Tensor,
    generator: torch.Generator,
    lengths: Tensor | None = None,
) -> VerifyResult:
    """Lossless speculative sampling.

    draft_ids: [B, K] tokens the drafter proposed (sampled from draft_probs when given).
    draft_probs: [B, K, V] warped q, or None for a deterministic drafter (one-hot q).
    target_probs: [B, K+1, V] warped p; position i scores draft token i, position K is the bonus.
    generator: CPU torch.Generator for the float64 uniforms and the residual/bonus draw.
    lengths: [B] real draft tokens per row (None = all K); a row's padding is never accepted.
    """
    bsz, k = draft_ids.shape
    if target_probs.shape[:2] != (bsz, k + 1):
        raise ValueError(
            f"target_probs must have shape [B, K+1, V] = [{bsz}, {k + 1}, V] for a draft of "
            f"shape {tuple(draft_ids.shape)}, got {tuple(target_probs.shape)}."
        )
    p = target_probs.double()  # [B, K+1, V]
    p_draft = p[:, :k]  # [B, K, V]
    p_x = p_draft.gather(2, draft_ids[..., None]).squeeze(2)  # [B, K]
    if draft_probs is None:
        q_x = torch.ones_like(p_x)  # [B, K]
    else:
        q_x = draft_probs.double().gather(2, draft_ids[..., None]).squeeze(2)  # [B, K]

    u = torch.rand((bsz, k), generator=generator, dtype=torch.float64).to(p.device)  # [B, K]
    accepted = u * q_x < p_x  # [B, K]  <=>  u < min(1, p/q), never true when p = 0
    num_accepted = leading_true(_real(accepted, lengths))  # [B]
    rows = torch.arange(bsz, device=p.device)
    real = torch.full((bsz,), k, dtype=torch.long, device=p.device) if lengths is None else lengths.to(p.device)

    # Distribution of the next token: residual at the first rejection, p_K (bonus) otherwise.
    pos = num_accepted.clamp(max=max(k - 1, 0))  # [B]
    if k > 0:
        p_pos = p_draft[rows, pos]  # [B, V]
        if draft_probs is None:
            x = draft_ids.gather(1, pos[:, None])  # [B, 1]
            residual = p_pos.scatter(1, x, 0.0)  # [B, V]  p with x removed
        else:
            q_pos = draft_probs.double()[rows, pos]  # [B, V]
            residual = (p_pos - q_pos).clamp_min(0.0)  # [B, V]
        # If p == q exactly the residual is empty, but then rejection had probability 0; fall back
        # to p so the draw is always well defined.
        empty = residual.sum(dim=1, keepdim=True) <= 0  # [B, 1]
        residual = torch.where(empty, p_pos, residual)
        bonus = p[rows, num_accepted]  # [B, V]: p after the row's last real draft token
        next_dist = torch.where((num_accepted < real)[:, None], residual, bonus)  # [B, V]
    else:
        next_dist = p[:, 0]
    next_dist = next_dist / next_dist.sum(dim=1, keepdim=True)
    next_token = sample(next_dist, generator)  # [B]
    return VerifyResult(num_accepted=num_accepted, next_token=next_token)


def _real(mask: Tensor, lengths: Tensor | None) -> Tensor:
    """mask [B, K] with every column >= lengths[i] of row i False (None = unchanged)."""
    if lengths is None:
        return mask
    cols = torch.arange(mask.shape[1], device=mask.device)  # [K]
    return mask & (cols[None] < lengths.to(mask.device)[:, None])


def leading_true(mask: Tensor) -> Tensor:
    """Number of leading True values per row of mask [B, K] -> [B] int64: the accepted prefix of each row."""
    if mask.shape[1] == 0:
        return torch.zeros(mask.shape[0], dtype=torch.long, device=mask.device)
    return mask.long().cumprod(dim=1).sum(dim=1)
