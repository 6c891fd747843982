"""The audit's chi-square test (specdraft-check) against scipy's, which is only a dev dependency."""

from __future__ import annotations

import numpy as np
import pytest

from specdraft.check import chi2_survival, chisquare_pvalue

scipy_stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize(("statistic", "dof"), [(0.0, 1), (0.5, 1), (3.84, 1), (12.0, 7), (300.0, 255), (40.0, 3)])
def test_chi2_survival_matches_scipy(statistic: float, dof: int) -> None:
    assert chi2_survival(statistic, dof) == pytest.approx(scipy_stats.chi2.sf(statistic, dof), rel=1e-9, abs=1e-300)


def test_pooled_pvalue_matches_scipy_chisquare() -> None:
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(40))
    counts = rng.multinomial(2000, probs).astype(np.float64)
    expected = probs * counts.sum()
    big = expected >= 5.0
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    want = scipy_stats.chisquare(obs, exp).pvalue
    assert chisquare_pvalue(counts, probs) == pytest.approx(want, rel=1e-9)
    assert chisquare_pvalue(np.array([5.0, 1.0]), np.array([1.0, 0.0])) == 0.0  # impossible cell hit
