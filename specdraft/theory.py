"""The seed's formulas as pure functions, plus their form for real hardware.

alpha: probability a draft token is accepted (i.i.d. assumption); gamma: draft tokens per round;
c = T_q / T_p: cost of one drafter step relative to one target forward; c_hat: the drafter's
arithmetic operations relative to the target's.

    E[N]            = (1 - alpha^(gamma+1)) / (1 - alpha)          tokens per round
    speedup         = E[N] / (gamma * c + 1)                      wall-time improvement
    compute factor  = (1 - alpha) (gamma * c_hat + gamma + 1) / (1 - alpha^(gamma+1))

Real hardware does not always score gamma+1 positions for the price of one, and acceptance differs
per position, so `predicted_speedup` takes a per-position acceptance profile and measured costs
(the verify-cost curve of `specdraft.costs.verify_curve`) instead of alpha and c. The cost model
(`specdraft.draft_length`) and the bench use these functions; nothing else computes E[N] or a speedup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


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
    t_v: Sequence[float],
    num_draft_tokens: int | Mapping[int, float],
    prefill_s: float = 0.0,
    ar_step_s: float | None = None,
) -> float:
    """Predicted speedup over AR of rounds that draft `num_draft_tokens` tokens each, or of a mix
    {k: number of rounds drafting k} (what an "auto" run actually did).

    t_q: seconds per drafted token; t_v[k]: seconds of a target forward that scores k draft tokens
    (k+1 positions), so t_v[0] is one autoregressive step; prefill_s: seconds that both pay first;
    ar_step_s: seconds per token of the AR baseline compared with (default t_v[0]; another value
    when the baseline runs on another forward stack). The rounds emit sum_k n_k E[N](k) tokens in
    sum_k n_k (k T_q + T_v(k)) seconds, where AR needs ar_step_s per token; for one k, no prefill:
        speedup = E[N](k) * T_v(0) / (k * T_q + T_v(k))
    """
    mix = {num_draft_tokens: 1.0} if isinstance(num_draft_tokens, int) else dict(num_draft_tokens)
    if not mix or any(k >= len(t_v) for k in mix):
        raise ValueError(
            f"t_v must hold the verify cost of every draft length used ({sorted(mix)}), "
            f"got {len(t_v)} entries."
        )
    tokens = sum(n * expected_tokens_from_profile(per_position_acceptance, k) for k, n in mix.items())
    seconds = sum(n * (k * t_q + t_v[k]) for k, n in mix.items())
    ar_step = t_v[0] if ar_step_s is None else ar_step_s
    return (prefill_s + tokens * ar_step) / (prefill_s + seconds)


def _check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha is a probability and must be in [0, 1], got {alpha}.")
