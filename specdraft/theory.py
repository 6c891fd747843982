"""The seed's formulas as pure functions, plus a cost model for real hardware.

alpha: probability a draft token is accepted (i.i.d. assumption); gamma: draft tokens per round;
c = T_q / T_p: cost of one drafter step relative to one target forward; c_hat: the drafter's
arithmetic operations relative to the target's.

    E[N]            = (1 - alpha^(gamma+1)) / (1 - alpha)          tokens per round
    speedup         = E[N] / (gamma * c + 1)                      wall-time improvement
    compute factor  = (1 - alpha) (gamma * c_hat + gamma + 1) / (1 - alpha^(gamma+1))

Real hardware does not score gamma+1 positions for the price of one (DESIGN §8), and acceptance
differs per position, so `predicted_speedup` takes a per-position acceptance profile and a measured
verify-cost curve instead of alpha and c.
"""

from __future__ import annotations

from collections.abc import Sequence


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[N] = (1 - alpha^(gamma+1)) / (1 - alpha): tokens emitted per round (gamma + 1 at alpha=1)."""
    _check_alpha(alpha)
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def speedup(alpha: float, gamma: int, c: float) -> float:
    """Expected wall-time speedup E[N] / (gamma * c + 1) over autoregressive decoding."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


def compute_factor(alpha: float, gamma: int, c_hat: float) -> float:
    """Expected increase in arithmetic operations: (1-a)(gamma*c_hat + gamma + 1)/(1 - a^(gamma+1))."""
    return (gamma * c_hat + gamma + 1.0) / expected_tokens(alpha, gamma)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 16) -> int:
    """The gamma in [0, max_gamma] that maximises `speedup` (0 = drafting does not pay)."""
    return max(range(max_gamma + 1), key=lambda g: (speedup(alpha, g, c), -g))


def expected_tokens_from_profile(per_position_acceptance: Sequence[float], gamma: int) -> float:
    """E[N] with position-dependent acceptance a_i = P(accept i | reached i):
    sum_{j=0..gamma} prod_{i<j} a_i (the j=0 term is the recovered/bonus token)."""
    total, reach = 1.0, 1.0
    for j in range(gamma):
        a = per_position_acceptance[j] if j < len(per_position_acceptance) else 0.0
        reach *= a
        total += reach
    return total


def predicted_speedup(
    per_position_acceptance: Sequence[float],
    t_q: float,
    t_p_curve: Sequence[float],
    gamma: int,
) -> float:
    """Predicted speedup over AR of rounds that draft `gamma` tokens.

    t_q: seconds per drafted token; t_p_curve[k]: seconds of a target forward that scores k draft
    tokens (k+1 positions), so t_p_curve[0] is one autoregressive step.
        speedup = E[N] * T_p(0) / (gamma * T_q + T_p(gamma))
    """
    round_s = gamma * t_q + t_p_curve[gamma]
    return expected_tokens_from_profile(per_position_acceptance, gamma) * t_p_curve[0] / round_s


def _check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha is a probability and must be in [0, 1], got {alpha}.")
