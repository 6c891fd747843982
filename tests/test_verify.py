"""The verifier at the function level: exactness of greedy_verify, statistical losslessness of
rejection_sample on hand-built distributions, and negative controls (the packaged broken verifiers
of specdraft.check.broken) that MUST fail the same test.

For each case we draw N = 200k rounds in one vectorised call. Every emitted position j (bonus
included) must be distributed as p_j: position j's token depends only on draft token j and uniform
j, so conditioning on "position j was reached" does not change its law. Chi-square at alpha = 1e-6.
Acceptance at position j (given it was reached) must match sum_v min(p_j(v), q_j(v)).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import Tensor

from specdraft.check.broken import always_accept, bonus_wrong_position, resample_from_p
from specdraft.sampling import SamplingConfig, sample, warp
from specdraft.verify import VerifyResult, greedy_verify, rejection_sample
from tests.helpers import pooled_chisquare

N = 200_000
ALPHA = 1e-6
V = 12
K = 3

Sampler = Callable[[Tensor, Tensor | None, Tensor, torch.Generator], VerifyResult]


# --------------------------------------------------------------------------------- harness
def run_rounds(
    sampler: Sampler,
    p: Tensor,  # [K+1, V]
    q_draw: Tensor | None,  # [K, V] the drafter's q (None: deterministic tokens `fixed`)
    q_given: Tensor | None = None,  # what the verifier is told q is (default: q_draw)
    fixed: Tensor | None = None,  # [K] deterministic draft tokens
    seed: int = 0,
) -> tuple[Tensor, Tensor, Tensor]:
    """Returns draft [N, K], num_accepted [N], next_token [N]."""
    gen = torch.Generator().manual_seed(seed)
    if q_draw is None:
        draft = fixed.expand(N, K).clone()
        probs = None
    else:
        draft = torch.stack([sample(q_draw[j].expand(N, V), gen) for j in range(K)], dim=1)
        given = q_draw if q_given is None else q_given
        probs = given.expand(N, K, V)
    res = sampler(draft, probs, p.expand(N, K + 1, V), gen)
    return draft, res.num_accepted, res.next_token


def position_pvalues(p: Tensor, draft: Tensor, n_acc: Tensor, nxt: Tensor) -> list[float]:
    """Chi-square p-value of the emitted token at every position j = 0..K vs p_j."""
    pvals = []
    for j in range(K + 1):
        reached = n_acc >= j
        tok = torch.where(n_acc[reached] > j, draft[reached, min(j, K - 1)], nxt[reached])
        counts = np.bincount(tok.numpy(), minlength=V)
        pvals.append(pooled_chisquare(counts, p[j].double().numpy()))
    return pvals


def acceptance_ok(p: Tensor, q: Tensor, n_acc: Tensor) -> bool:
    """Per-position acceptance within 6 sigma of sum(min(p, q))."""
    for j in range(K):
        reached = int((n_acc >= j).sum())
        if reached < 1000:
            continue
        rate = float((n_acc[n_acc >= j] > j).double().mean())
        expect = float(torch.minimum(p[j], q[j]).sum())
        sigma = max((expect * (1 - expect) / reached) ** 0.5, 1e-4)
        if abs(rate - expect) > 6 * sigma:
            return False
    return True


def is_lossless(sampler: Sampler, p: Tensor, q: Tensor | None, **kw: Tensor) -> bool:
    draft, n_acc, nxt = run_rounds(sampler, p, q, **kw)
    pvals = position_pvalues(p, draft, n_acc, nxt)
    q_eff = q if q is not None else torch.nn.functional.one_hot(kw["fixed"], V).double()
    return min(pvals) > ALPHA and acceptance_ok(p, q_eff, n_acc)


# --------------------------------------------------------------------------------- cases
def dirichlet(rows: int, conc: float, seed: int) -> Tensor:
    g = np.random.default_rng(seed)
    return torch.tensor(g.dirichlet([conc] * V, size=rows), dtype=torch.float64)


def case(name: str) -> tuple[Tensor, Tensor | None, dict]:
    if name == "peaked":
        return dirichlet(K + 1, 0.3, 1), dirichlet(K, 0.3, 2), {}
    if name == "disjoint_supports":
        p = torch.zeros(K + 1, V, dtype=torch.float64)
        p[:, : V // 2] = dirichlet(K + 1, 1.0, 3)[:, : V // 2]
        q = torch.zeros(K, V, dtype=torch.float64)
        q[:, V // 2 :] = dirichlet(K, 1.0, 4)[:, V // 2 :]
        return p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True), {}
    if name == "q_zero_where_p_positive":
        p = dirichlet(K + 1, 1.0, 5)
        q = dirichlet(K, 1.0, 6)
        q[:, ::2] = 0
        return p, q / q.sum(-1, keepdim=True), {}
    if name == "one_hot_q":
        p = dirichlet(K + 1, 0.5, 7)
        return p, None, {"fixed": p[:K].argmax(-1)}
    if name == "one_hot_q_unlikely_token":
        p = dirichlet(K + 1, 0.5, 8)
        return p, None, {"fixed": p[:K].argmin(-1)}
    if name == "q_equals_p":
        p = dirichlet(K + 1, 0.5, 9)
        return p, p[:K].clone(), {}
    if name == "near_one_hot_p":
        p = torch.full((K + 1, V), 1e-5, dtype=torch.float64)
        p[:, 3] = 1.0
        return p / p.sum(-1, keepdim=True), dirichlet(K, 1.0, 10), {}
    if name == "top_k_top_p_both":
        cfg = SamplingConfig(temperature=0.8, top_k=6, top_p=0.85)
        g = torch.Generator().manual_seed(11)
        p = warp(torch.randn(K + 1, V, generator=g) * 2, cfg).double()
        q = warp(torch.randn(K, V, generator=g) * 2, cfg).double()
        return p, q, {}
    raise KeyError(name)


CASES = [
    "peaked",
    "disjoint_supports",
    "q_zero_where_p_positive",
    "one_hot_q",
    "one_hot_q_unlikely_token",
    "q_equals_p",
    "near_one_hot_p",
    "top_k_top_p_both",
]


@pytest.mark.parametrize("name", CASES)
def test_rejection_sample_is_lossless(name: str) -> None:
    p, q, kw = case(name)
    assert is_lossless(rejection_sample, p, q, **kw)


def test_q_equals_p_accepts_everything() -> None:
    p, q, _ = case("q_equals_p")
    _, n_acc, _ = run_rounds(rejection_sample, p, q)
    assert bool((n_acc == K).all())


def test_never_accepts_zero_probability_token() -> None:
    p, q, _ = case("disjoint_supports")
    draft, n_acc, nxt = run_rounds(rejection_sample, p, q)
    assert bool((n_acc == 0).all())
    assert bool((p[0][nxt] > 0).all())


# --------------------------------------------------------------------------------- controls
@pytest.mark.parametrize("broken", [always_accept, resample_from_p, bonus_wrong_position])
def test_negative_controls_fail(broken: Sampler) -> None:
    p, q, _ = case("peaked")
    # The same sampler passes with the real verifier (so the test itself is not just strict).
    assert is_lossless(rejection_sample, p, q)
    if broken is bonus_wrong_position:
        # The bonus needs all K accepted: use a drafter that is often right.
        q = 0.5 * q + 0.5 * p[:K]
    assert not is_lossless(broken, p, q)


def test_negative_control_q_before_warping_fails() -> None:
    cfg = SamplingConfig(temperature=0.7, top_k=4)
    g = torch.Generator().manual_seed(12)
    raw_p, raw_q = torch.randn(K + 1, V, generator=g) * 2, torch.randn(K, V, generator=g) * 2
    p, q_warped = warp(raw_p, cfg).double(), warp(raw_q, cfg).double()
    q_unwarped = raw_q.softmax(-1).double()
    assert is_lossless(rejection_sample, p, q_warped)
    draft, n_acc, nxt = run_rounds(rejection_sample, p, q_warped, q_given=q_unwarped)
    assert min(position_pvalues(p, draft, n_acc, nxt)) < ALPHA


# --------------------------------------------------------------------------------- greedy
def test_greedy_verify_accepts_matching_prefix() -> None:
    logits = torch.full((2, 4, 8), -1.0)
    targets = torch.tensor([[3, 5, 1, 7], [2, 2, 2, 2]])  # argmax per position
    logits.scatter_(2, targets[..., None], 5.0)
    draft = torch.tensor([[3, 5, 0], [2, 2, 2]])
    res = greedy_verify(draft, logits)
    assert res.num_accepted.tolist() == [2, 3]
    assert res.next_token.tolist() == [1, 2]  # recovered = argmax at pos 2; bonus = argmax at 3


def test_empty_draft() -> None:
    p = dirichlet(1, 1.0, 0)[None].float()  # [1, 1, V]
    res = rejection_sample(torch.empty(1, 0, dtype=torch.long), None, p, torch.Generator())
    assert res.num_accepted.tolist() == [0]
    res = greedy_verify(torch.empty(1, 0, dtype=torch.long), p.log())
    assert res.next_token.tolist() == [int(p.argmax())]


def test_shape_mismatch_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="K\\+1"):
        rejection_sample(torch.zeros(1, 2, dtype=torch.long), None, torch.ones(1, 2, V) / V, torch.Generator())
