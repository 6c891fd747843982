"""The seed's formulas: the worked example and the gamma = 1 special case."""

import pytest

from specdraft import theory


def test_worked_example() -> None:
    assert theory.expected_tokens(0.8, 4) == pytest.approx(3.36, abs=5e-3)
    assert theory.speedup(0.8, 4, 0.1) == pytest.approx(2.40, abs=5e-3)
    assert theory.compute_factor(0.8, 4, 0.1) == pytest.approx(1.61, abs=5e-3)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 1.0])
@pytest.mark.parametrize("c", [0.0, 0.05, 0.5])
def test_gamma_one_reduces_to_closed_form(alpha: float, c: float) -> None:
    assert theory.speedup(alpha, 1, c) == pytest.approx((1 + alpha) / (1 + c))


def test_expected_tokens_limits() -> None:
    assert theory.expected_tokens(1.0, 5) == 6
    assert theory.expected_tokens(0.0, 5) == 1
    with pytest.raises(ValueError, match="alpha"):
        theory.expected_tokens(1.5, 2)


def test_optimal_gamma() -> None:
    # Good drafter, cheap: draft several; useless drafter: do not draft at all.
    assert theory.optimal_gamma(0.8, 0.05, max_gamma=16) >= 4
    assert theory.optimal_gamma(0.0, 0.1, max_gamma=16) == 0
    g = theory.optimal_gamma(0.6, 0.2, max_gamma=10)
    best = max(theory.speedup(0.6, k, 0.2) for k in range(11))
    assert theory.speedup(0.6, g, 0.2) == pytest.approx(best)


def test_profile_matches_iid_formula() -> None:
    for gamma in range(6):
        assert theory.expected_tokens_from_profile([0.7] * gamma, gamma) == pytest.approx(
            theory.expected_tokens(0.7, gamma)
        )


def test_predicted_speedup_flat_curve_matches_seed() -> None:
    # With T_p flat in k and T_q = c * T_p, the cost model is the seed's formula.
    t_p = 0.04
    curve = [t_p] * 9
    got = theory.predicted_speedup([0.8] * 8, 0.1 * t_p, curve, 4)
    assert got == pytest.approx(theory.speedup(0.8, 4, 0.1))
    # A verify cost that grows with k lowers the prediction.
    rising = [t_p * (1 + 0.1 * k) for k in range(9)]
    assert theory.predicted_speedup([0.8] * 8, 0.1 * t_p, rising, 4) < got


def test_predicted_speedup_of_a_mix_weights_rounds_and_pays_the_prefill() -> None:
    acc, t_q, t_v = [0.9, 0.6, 0.3], 0.002, [0.04, 0.044, 0.046, 0.05]
    assert theory.predicted_speedup(acc, t_q, t_v, {2: 1}) == theory.predicted_speedup(acc, t_q, t_v, 2)
    tokens = 3 * theory.expected_tokens_from_profile(acc, 3) + 2 * 1.0  # 3 rounds at k=3, 2 AR rounds
    seconds = 3 * (3 * t_q + t_v[3]) + 2 * t_v[0]
    want = (0.5 + tokens * t_v[0]) / (0.5 + seconds)
    assert theory.predicted_speedup(acc, t_q, t_v, {3: 3, 0: 2}, prefill_s=0.5) == pytest.approx(want)
    with pytest.raises(ValueError, match="verify cost of every draft length"):
        theory.predicted_speedup(acc, t_q, t_v, {5: 1})
