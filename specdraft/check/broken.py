"""Deliberately broken verifiers: the negative controls of the losslessness audit.

Each has the signature of `specdraft.verify.rejection_sample` (draft [B, K], q [B, K, V] or None,
p [B, K+1, V], generator) and gets one step of speculative sampling wrong, so that anyone can check
that the audit catches a broken verifier, from an installed package:

    specdraft-check sampler.path=specdraft.check.broken.always_accept      # must print FAIL

* `always_accept`: keeps every draft token, then draws the bonus from p_K. Wrong unless q = p.
* `resample_from_p`: after a rejection draws the next token from p instead of the residual
  norm(max(0, p - q)), so the rejected token's mass is counted twice.
* `bonus_wrong_position`: after a fully accepted draft draws the bonus from p_{K-1} (the last draft
  position's law) instead of p_K. Only the bonus is wrong, so only an audit that reaches the bonus
  can catch it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdraft.sampling import sample
from specdraft.verify import VerifyResult, rejection_sample


def always_accept(draft: Tensor, q: Tensor | None, p: Tensor, gen: torch.Generator) -> VerifyResult:
    """Accept all K draft tokens; bonus from p_K."""
    n = torch.full((draft.shape[0],), draft.shape[1], dtype=torch.long, device=draft.device)  # [B]
    return VerifyResult(num_accepted=n, next_token=sample(p[:, -1], gen))


def resample_from_p(draft: Tensor, q: Tensor | None, p: Tensor, gen: torch.Generator) -> VerifyResult:
    """The real acceptance test, but the token after a rejection comes from p, not the residual."""
    res = rejection_sample(draft, q, p, gen)
    rows = torch.arange(len(draft), device=p.device)
    from_p = sample(p[rows, res.num_accepted], gen)  # [B]
    return VerifyResult(res.num_accepted, torch.where(res.num_accepted < draft.shape[1], from_p, res.next_token))


def bonus_wrong_position(draft: Tensor, q: Tensor | None, p: Tensor, gen: torch.Generator) -> VerifyResult:
    """The real verifier, but the bonus after K accepted tokens comes from p_{K-1}, not p_K."""
    res = rejection_sample(draft, q, p, gen)
    if draft.shape[1] == 0:  # no draft: the token is an ordinary AR draw
        return res
    wrong = sample(p[:, -2], gen)  # [B]
    return VerifyResult(res.num_accepted, torch.where(res.num_accepted == draft.shape[1], wrong, res.next_token))
