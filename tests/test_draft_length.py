"""The cost-model choice of K against the closed form, convergence to K = 0, probing, and that K
depends on what was accepted only (never on a clock)."""

from __future__ import annotations

import pytest

from specdraft import theory
from specdraft.draft_length import (
    CostModelDraftLength,
    FixedDraftLength,
    PerSourceDraftLength,
    make_draft_length_policy,
)


def primed_policy(alpha: float, t_q: float, curve: list[float]) -> CostModelDraftLength:
    """A policy whose acceptance is pinned to alpha (huge prior) and whose costs are the curve
    (seconds) and t_q (seconds per drafted token), given in units of curve[0]."""
    shape = [t / curve[0] for t in curve]
    return CostModelDraftLength(shape, draft_cost=t_q / curve[0], max_k=len(curve) - 1, decay=0.0,
                                prior_accept=alpha, prior_weight=1e12)


@pytest.mark.parametrize(
    ("alpha", "t_q", "slope"),
    [(0.8, 0.002, 0.1), (0.6, 0.01, 0.15), (0.9, 0.0, 0.05), (0.3, 0.004, 0.2), (0.05, 0.01, 0.1)],
)
def test_choice_matches_closed_form(alpha: float, t_q: float, slope: float) -> None:
    curve = [0.04 * (1 + slope * k) for k in range(9)]
    policy = primed_policy(alpha, t_q, curve)
    want = max(
        range(9), key=lambda g: (theory.predicted_speedup([alpha] * 8, t_q, curve, g), -g)
    )
    assert policy.choose(8) == want


def test_chooses_zero_when_drafting_does_not_pay() -> None:
    curve = [0.04 * (1 + 0.3 * k) for k in range(9)]
    assert primed_policy(0.1, 0.02, curve).choose(8) == 0


def test_respects_k_max() -> None:
    curve = [0.04] * 9
    assert primed_policy(0.95, 0.0, curve).choose(3) == 3


def linear(slope: float, max_k: int = 8) -> list[float]:
    """A verify-cost curve T_v(k)/T_v(0) = 1 + slope k."""
    return [1.0 + slope * k for k in range(max_k + 1)]


def choices(policy: CostModelDraftLength, accepted: list[int]) -> list[int]:
    """K chosen in each round when round r keeps min(K, accepted[r]) draft tokens."""
    out = []
    for a in accepted:
        k = policy.choose(100)
        out.append(k)
        policy.observe(k, min(k, a))
    return out


def test_never_right_drafter_converges_to_zero() -> None:
    policy = CostModelDraftLength(linear(0.1), draft_cost=0.05, max_k=8)
    chosen = []
    for _ in range(300):
        k = policy.choose(100)
        chosen.append(k)
        policy.observe(k, 0)
    late = chosen[-160:]
    assert sum(k > 0 for k in late) <= len(late) // policy.probe_every + 1  # only the probes
    assert max(late) <= 1


def probe_rounds(policy: CostModelDraftLength, rounds: int, accept_probes: bool) -> list[int]:
    """Round indices at which a never-right (or probe-only-right) drafter was probed."""
    probes = []
    for r in range(rounds):
        k = policy.choose(100)
        if k > 0:
            probes.append(r)
        policy.observe(k, k if accept_probes and r > 50 else 0)
    return probes


def test_rejected_probes_back_off_exponentially_up_to_the_cap() -> None:
    policy = CostModelDraftLength(linear(0.05), draft_cost=0.05, max_k=8, probe_every=4, max_probe_every=32)
    probes = probe_rounds(policy, 400, accept_probes=False)
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    late = [g for g in gaps if g > 1][-6:]  # after the first rounds' drafting has stopped
    assert late == [32] * 6  # capped at max_probe_every
    doubling = [g for g in gaps if 1 < g < 32]
    assert doubling[-3:] == [4, 8, 16]  # each rejected probe doubles the gap (before: the early drafting)


def test_an_accepted_probe_resets_the_back_off() -> None:
    policy = CostModelDraftLength(linear(0.05), draft_cost=0.05, max_k=8, probe_every=4, max_probe_every=64)
    probe_rounds(policy, 50, accept_probes=False)
    assert policy._probe_interval > 4  # backed off while the probes failed
    probe_rounds(policy, 200, accept_probes=True)  # probes are accepted from round 51 on
    assert policy._probe_interval == 4


def test_probe_interval_is_validated() -> None:
    with pytest.raises(ValueError, match="probe_every"):
        CostModelDraftLength(linear(0.1), probe_every=0)
    with pytest.raises(ValueError, match="max_probe_every"):
        CostModelDraftLength(linear(0.1), probe_every=64, max_probe_every=16)


def test_verify_curve_is_validated() -> None:
    with pytest.raises(ValueError, match="max_k \\+ 1 = 9"):
        CostModelDraftLength(linear(0.1, max_k=4), max_k=8)
    with pytest.raises(ValueError, match="positive"):
        CostModelDraftLength([1.0, 0.0, 1.2], max_k=2)


def test_too_slow_drafter_is_never_probed() -> None:
    # Drafting one token costs 3 AR steps: even always-accepted drafts cannot pay.
    policy = CostModelDraftLength(linear(0.1), draft_cost=3.0, max_k=8)
    assert max(choices(policy, [100] * 200)) == 0


def test_always_right_drafter_drafts_the_maximum() -> None:
    policy = CostModelDraftLength(linear(0.05, max_k=6), draft_cost=0.0125, max_k=6)
    choices(policy, [100] * 100)
    assert policy.choose(100) == 6


def test_make_policy_validates() -> None:
    auto = make_draft_length_policy("auto", max_k=4, verify_curve=linear(0.1, max_k=4), draft_cost=0.1)
    assert isinstance(auto, CostModelDraftLength) and auto.max_k == 4 and auto.draft_cost == 0.1
    assert make_draft_length_policy(3) == FixedDraftLength(3)
    with pytest.raises(ValueError, match="verify-cost curve"):
        make_draft_length_policy("auto")
    with pytest.raises(ValueError, match="cost per token"):
        make_draft_length_policy("auto", 4, linear(0.1, max_k=4))
    with pytest.raises(ValueError, match="draft_cost"):
        CostModelDraftLength(linear(0.1), draft_cost=-1.0)
    for bad in (-1, "many", 2.5, True):
        with pytest.raises(ValueError, match="num_draft_tokens"):
            make_draft_length_policy(bad)


def test_verify_cost_never_dips_so_drafting_is_never_free() -> None:
    """A curve that reads T_v(3) < T_v(0) must not make a never-accepted
    drafter with a real drafting cost look worth running."""
    policy = CostModelDraftLength([1.0, 1.2, 0.9, 0.85], draft_cost=0.07, max_k=3)
    assert [policy.verify_cost(k) for k in range(4)] == [1.0, 1.2, 1.2, 1.2]
    for _ in range(40):
        policy.observe(3, 0)  # never accepted
    assert policy.choose(3) == 0


def test_curve_makes_the_first_choice_avoid_an_expensive_k() -> None:
    """The curve's shape decides: K = 1 does not pay when the curve says it costs 1.6x an AR step,
    longer drafts amortise that cost (a shape no constant slope could describe)."""
    curve = [1.0, 1.6, 1.65, 1.7, 1.9]
    policy = CostModelDraftLength(curve, max_k=4, prior_accept=0.6)
    rates = [policy.expected_rate(k) for k in range(5)]
    assert rates[1] <= rates[0]  # 1.6 expected tokens for 1.6x the cost of one AR step: no gain
    assert max(range(5), key=lambda k: rates[k]) == 3


def test_k_depends_on_the_accepted_counts_only() -> None:
    """Same acceptance history, same K sequence: the policy has no clock input at all, so a seeded
    sampled generation cannot change with the machine's load."""
    history = [3, 0, 0, 5, 8, 1, 0, 0, 0, 2] * 20
    a = choices(CostModelDraftLength(linear(0.05), draft_cost=0.05), history)
    b = choices(CostModelDraftLength(linear(0.05), draft_cost=0.05), history)
    assert a == b and len(set(a)) > 1  # identical, and the choices did adapt
    cheap = choices(CostModelDraftLength(linear(0.05), draft_cost=0.0), history)
    dear = choices(CostModelDraftLength(linear(0.05), draft_cost=0.3), history)
    assert sum(dear) < sum(cheap)  # a costlier drafter drafts less


def test_a_position_not_reached_yet_is_expected_to_do_as_well_as_the_one_before() -> None:
    """Rounds of one accepted draft token teach a_0 only; a_1.. follow it instead of staying at the
    prior, so a drafter that is always right is tried at longer drafts (the quantized copy's case)."""
    policy = CostModelDraftLength([1.0] * 5, draft_cost=0.3, max_k=4, prior_accept=0.5)
    for _ in range(20):
        policy.observe(1, 1)
    a = policy.acceptance()
    assert a[0] > 0.85 and all(abs(x - a[0]) < 1e-12 for x in a[1:])
    assert policy.choose(4) == 4
    for _ in range(20):  # position 1 is reached and always rejected: its estimate falls on its own
        policy.observe(2, 1)
    a = policy.acceptance()
    assert a[1] < 0.2 and a[0] > 0.85


def test_each_draft_source_learns_its_own_acceptance_at_its_own_cost() -> None:
    """Copies always kept and free to draft, model guesses never kept and dear: per source, a copy
    round drafts the maximum and a model round drafts nothing, where one pooled policy fed the same
    rounds drafts the maximum for the model too (eight dear guesses that are never kept). A batch
    round takes the largest K its rows' sources choose."""
    curve = linear(0.05)
    per_source = PerSourceDraftLength([CostModelDraftLength(curve, draft_cost=0.0, max_k=8),
                                       CostModelDraftLength(curve, draft_cost=0.2, max_k=8)])
    pooled = CostModelDraftLength(curve, draft_cost=0.1, max_k=8)
    for r in range(200):
        source = r % 2  # copy and model rounds alternate
        k = per_source.choose(100, sources=[source])
        per_source.observe(k, k if source == 0 else 0, source=source)
        k = pooled.choose(100)
        pooled.observe(k, k if source == 0 else 0)
    assert per_source.choose(100, sources=[0]) == 8
    assert per_source.choose(100, sources=[1]) == 0
    assert per_source.choose(100, batch_size=2, sources=[1, 0]) == 8
    assert pooled.choose(100) == 8
    model = per_source.policies[1]
    before = model.acceptance()
    per_source.observe(8, 8, source=0)  # a copy round teaches the copy policy only
    assert model.acceptance() == before
    with pytest.raises(ValueError, match="one policy per draft source"):
        PerSourceDraftLength([])
