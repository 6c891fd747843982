"""The distillation loss every recipe trains with: cross-entropy of a student to the teacher's
top-k distribution (equal to the KL divergence up to the teacher's entropy, which has no gradient).

The teacher is kept as its top-k logits per position (cached once, see specdraft.train.early_exit's
teacher cache); a student over a pruned vocabulary sees -1 for the teacher ids outside its subset.
Two ways to treat those, both with the same optimum per position (q on the subset proportional to p):
- renormalize=True: the teacher distribution is the softmax over the ids inside the subset only
  (every position weighs the same; positions with no id inside are skipped);
- renormalize=False: the softmax over all k ids, the ones outside simply dropped (a position weighs
  the teacher mass its subset covers; the mean is over every position).
"""

from __future__ import annotations

import torch
from torch import Tensor


def distill_loss(logits: Tensor, top_logits: Tensor, top_ids: Tensor, renormalize: bool = True) -> Tensor:
    """Mean over positions of -sum_k p_k log q(id_k).

    logits: [N, V or M] student logits (M: over a pruned vocabulary's subset indices).
    top_logits: [N, k] teacher logits of its top-k tokens; top_ids: [N, k] their ids in the
    student's columns, -1 where a token is outside the student's (pruned) vocabulary.
    renormalize: how teacher tokens outside the vocabulary count (module docstring).
    """
    valid = top_ids >= 0  # [N, k]
    logq = torch.log_softmax(logits.float(), dim=-1).gather(-1, top_ids.clamp(min=0).long())  # [N, k]
    if not renormalize:
        teacher = torch.softmax(top_logits.float(), dim=-1) * valid  # [N, k]
        return -(teacher * logq).sum(-1).mean()
    rows = valid.any(-1)  # [N] positions with at least one teacher token inside
    teacher = torch.softmax(top_logits.float().masked_fill(~valid, float("-inf")), dim=-1)[rows]  # [n, k]
    return -(teacher * logq[rows]).sum(-1).mean()
