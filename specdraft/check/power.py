"""How small a deviation the audit's chi-square test can detect: the power of the test, computed
before any sample is drawn.

For cells with probabilities p (after the pooling the test uses) and N samples from a law q, the
Pearson statistic is approximately noncentral chi-square with df = cells - 1 and noncentrality
lambda = N * sum_i (q_i - p_i)^2 / p_i. By Cauchy-Schwarz, TV(q, p) = 1/2 sum |q_i - p_i| <=
1/2 sqrt(sum (q_i - p_i)^2 / p_i), so every q at total-variation distance >= delta from p has
lambda >= 4 N delta^2. With c the critical value at level alpha and lambda* the noncentrality at
which P(statistic > c) reaches the wanted power, every such q with delta >= sqrt(lambda* / (4 N))
is detected with at least that power: that delta is the detectable distance we print.
Pure functions on floats; the noncentral survival is the Poisson(lambda / 2) mixture of central
survivals (torch's regularised incomplete gamma), so no scipy is needed at run time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from specdraft.check.chisquare import chi2_survival, pooled_probs


def chi2_critical(alpha: float, dof: int) -> float:
    """c with P(chi2(dof) >= c) = alpha (bisection on the survival function)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}.")
    if dof < 1:
        raise ValueError(f"a chi-square test needs at least 1 degree of freedom, got {dof}.")
    lo, hi = 0.0, float(dof) + 10.0
    while chi2_survival(hi, dof) > alpha:
        lo, hi = hi, 2.0 * hi
    return _bisect(lambda c: chi2_survival(c, dof) - alpha, lo, hi, increasing=False)


def ncx2_survival(statistic: float, dof: int, noncentrality: float) -> float:
    """P(X > statistic) for X ~ noncentral chi-square(dof, noncentrality): sum over j of
    Poisson(j; noncentrality / 2) * Q(dof / 2 + j, statistic / 2)."""
    if noncentrality < 0:
        raise ValueError(f"the noncentrality must be >= 0, got {noncentrality!r}.")
    half = noncentrality / 2.0
    terms = math.ceil(half + 12.0 * math.sqrt(half + 1.0) + 30.0)
    j = torch.arange(terms, dtype=torch.float64)  # [J]
    log_w = -half + torch.xlogy(j, torch.tensor(half, dtype=torch.float64)) - torch.lgamma(j + 1.0)  # [J]
    q = torch.special.gammaincc(dof / 2.0 + j, torch.full_like(j, statistic / 2.0))  # [J]
    return float((log_w.exp() * q).sum().clamp(0.0, 1.0))


def noncentrality_for_power(alpha: float, dof: int, power: float) -> float:
    """The noncentrality at which the level-alpha chi-square test with `dof` rejects with
    probability `power`."""
    if not alpha < power < 1.0:
        raise ValueError(f"power must be in (alpha, 1) = ({alpha}, 1), got {power!r}.")
    c = chi2_critical(alpha, dof)
    lo, hi = 0.0, 1.0
    while ncx2_survival(c, dof, hi) < power:
        lo, hi = hi, 2.0 * hi
    return _bisect(lambda lam: ncx2_survival(c, dof, lam) - power, lo, hi, increasing=True)


def detectable_tv(probs: np.ndarray, num_samples: int, alpha: float, power: float = 0.9,
                  min_expected: float = 5.0) -> float:
    """The smallest total-variation distance (on the cells `probs`, pooled as the test pools them
    at `num_samples`) that the level-alpha test detects with probability >= `power`; 1.0 when the
    pooled table has a single cell (nothing is detectable)."""
    if num_samples <= 0:
        return 1.0
    cells = pooled_probs(probs, num_samples, min_expected)
    if len(cells) < 2:
        return 1.0
    lam = noncentrality_for_power(alpha, len(cells) - 1, power)
    return min(1.0, math.sqrt(lam / (4.0 * num_samples)))


def _bisect(fn: Callable[[float], float], lo: float, hi: float, increasing: bool, tol: float = 1e-10) -> float:
    """Root of a monotone fn on [lo, hi] (fn(lo), fn(hi) of opposite signs)."""
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if (fn(mid) < 0) == increasing:
            lo = mid
        else:
            hi = mid
        if hi - lo <= tol * max(1.0, hi):
            break
    return 0.5 * (lo + hi)
