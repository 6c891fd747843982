"""The audit's goodness-of-fit test: Pearson chi-square with small cells pooled, and the pooling
itself (which the power computation must see exactly as the test does)."""

from __future__ import annotations

import numpy as np
import torch


def pool_mask(probs: np.ndarray, num_samples: float, min_expected: float = 5.0) -> np.ndarray:
    """[C] bool: the cells kept on their own at `num_samples` (expected count >= min_expected);
    the others are pooled into one cell."""
    return np.asarray(probs, dtype=np.float64) * num_samples >= min_expected


def pooled_probs(probs: np.ndarray, num_samples: float, min_expected: float = 5.0) -> np.ndarray:
    """The cell probabilities the test compares at `num_samples`: the big cells, then the pooled
    rest (if it has any mass); cells of probability 0 are left out."""
    probs = np.asarray(probs, dtype=np.float64)
    big = pool_mask(probs, num_samples, min_expected)
    out = np.append(probs[big], probs[~big].sum())
    return out[out > 0]


def chisquare_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Goodness of fit with cells of expected count < min_expected pooled; any count in a cell of
    probability 0 is an immediate failure (p = 0)."""
    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    if counts[probs <= 0].sum() > 0:
        return 0.0
    total = counts.sum()
    expected = probs * total
    big = pool_mask(probs, total, min_expected)
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    if len(obs) < 2:
        return 1.0
    exp = exp * obs.sum() / exp.sum()
    return chi2_survival(float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1)


def chi2_survival(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square with `dof` degrees of freedom: the regularised upper
    incomplete gamma Q(dof / 2, statistic / 2) (torch has it; no scipy needed at run time)."""
    half = torch.tensor([dof / 2.0, statistic / 2.0], dtype=torch.float64)
    return float(torch.special.gammaincc(half[0], half[1]))
