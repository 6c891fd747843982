"""The losslessness audit (specdraft-check): its chi-square test and power against scipy (a dev
dependency only), its exact cells, and the audit itself on the tiny target: it refuses sample
counts that cannot detect a useful deviation, refuses to PASS when no draft was accepted, catches
every packaged broken verifier at the default N and passes the real one (the real verifier and
`always_accept` through the config: tests/test_cli.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from hydra import compose

from drafters.ngram import NGramDrafter
from specdraft.build import make_drafter, make_sampling, prompt_token_ids
from specdraft.check import (
    AuditSettings,
    Verdict,
    audit_sampling,
    audit_settings,
    chi2_survival,
    chisquare_pvalue,
)
from specdraft.check.broken import bonus_wrong_position, resample_from_p
from specdraft.check.cells import CellSettings, exact_cells, next_token_probs
from specdraft.check.contexts import candidate_contexts
from specdraft.check.power import (
    chi2_critical,
    detectable_tv,
    ncx2_survival,
    noncentrality_for_power,
)
from specdraft.check.sampled import check_audit_draft_tokens, plan_audit
from specdraft.decode import SpeculativeDecoder
from specdraft.protocol import Draft, DraftContext
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel
from specdraft.verify import VerifyResult, rejection_sample

scipy_stats = pytest.importorskip("scipy.stats")

PROMPT = [1, 2, 3, 1, 2]
T1 = SamplingConfig(temperature=1.0)


# --------------------------------------------------------------------------------- chi-square
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


# --------------------------------------------------------------------------------- power
@pytest.mark.parametrize(("alpha", "dof"), [(1e-4, 1), (1e-4, 40), (1e-3, 7), (0.05, 300)])
def test_critical_value_matches_scipy(alpha: float, dof: int) -> None:
    assert chi2_critical(alpha, dof) == pytest.approx(scipy_stats.chi2.isf(alpha, dof), rel=1e-8)


@pytest.mark.parametrize(("statistic", "dof", "lam"), [(15.1, 1, 0.0), (15.1, 1, 26.7), (70.0, 30, 59.0),
                                                       (520.0, 400, 160.0), (3.0, 2, 0.5)])
def test_noncentral_survival_matches_scipy(statistic: float, dof: int, lam: float) -> None:
    want = scipy_stats.chi2.sf(statistic, dof) if lam == 0 else scipy_stats.ncx2.sf(statistic, dof, lam)
    assert ncx2_survival(statistic, dof, lam) == pytest.approx(want, rel=1e-8, abs=1e-14)


def test_noncentrality_for_power_reaches_the_power() -> None:
    lam = noncentrality_for_power(1e-4, 20, 0.9)
    assert scipy_stats.ncx2.sf(scipy_stats.chi2.isf(1e-4, 20), 20, lam) == pytest.approx(0.9, abs=1e-8)


def test_detectable_distance_is_detected_with_the_power() -> None:
    """Monte Carlo: multinomial samples from the hardest alternative at the printed distance (the
    smallest noncentrality: q_i = p_i (1 +- 2 delta), + on cells of half the mass, where
    Cauchy-Schwarz is tight) are rejected about 90% of the time; half that distance far less often."""
    probs = np.append([0.25, 0.25], np.full(18, 0.5 / 18))  # [20]
    sign = np.append([1.0, 1.0], np.full(18, -1.0))
    n, alpha = 3000, 1e-3
    delta = detectable_tv(probs, n, alpha, power=0.9)
    rng = np.random.default_rng(3)

    def rejection_rate(tv: float) -> float:
        q = probs * (1 + 2 * tv * sign)
        assert 0.5 * np.abs(q - probs).sum() == pytest.approx(tv)
        draws = rng.multinomial(n, q, size=2000)
        return float(np.mean([chisquare_pvalue(c, probs) < alpha for c in draws]))

    assert 0.85 <= rejection_rate(delta) <= 0.95
    assert rejection_rate(delta / 2) < 0.5


def test_detectable_distance_falls_with_n() -> None:
    probs = np.random.default_rng(1).dirichlet(np.ones(60))
    assert detectable_tv(probs, 8000, 1e-4) < detectable_tv(probs, 2000, 1e-4) < detectable_tv(probs, 500, 1e-4)
    assert detectable_tv(probs, 0, 1e-4) == 1.0
    assert detectable_tv(np.array([1.0]), 10**6, 1e-4) == 1.0  # one cell: nothing is detectable


# --------------------------------------------------------------------------------- cells
@pytest.mark.parametrize("sampling", [T1, SamplingConfig(temperature=0.8, top_k=5, top_p=0.9)], ids=["t1", "topk_topp"])
def test_cells_are_the_exact_law_of_three_tokens(tiny_target: TargetModel, sampling: SamplingConfig) -> None:
    table = exact_cells(tiny_target, PROMPT, sampling, depth=3, num_samples=3000,
                        settings=CellSettings(min_cell_expected=10.0, max_nodes=40))
    v = tiny_target.vocab_size
    p1 = next_token_probs(tiny_target, PROMPT, [()], sampling)[0]  # [V]
    p2 = next_token_probs(tiny_target, PROMPT, [(a,) for a in range(v)], sampling)  # [V, V]
    pairs = list(itertools.product(range(v), repeat=2))
    p3 = next_token_probs(tiny_target, PROMPT, pairs, sampling).reshape(v, v, v)  # [V, V, V]
    law = p1[:, None, None] * p2[:, :, None] * p3  # [V, V, V]
    per_cell = np.zeros(table.num_cells)
    for seq in itertools.product(range(v), repeat=3):
        per_cell[table.cell(seq)] += law[seq]
    np.testing.assert_allclose(per_cell, table.probs, atol=1e-6)
    assert 10 < table.num_cells < 3000 / 10 + 40 + 2


def test_candidate_contexts() -> None:
    found = candidate_contexts([9, 8], [5, 6, 7], room=7, cuts=(1, 2, 4))
    assert [c.token_ids for c in found] == [(9, 8), (9, 8, 5), (9, 8, 5, 6), (9, 8, 5, 6, 7, 5), (9, 8, 5, 6, 7, 5, 6)]


# --------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("n", [0, -5, 2.5, True])
def test_refuses_no_samples(n: object) -> None:
    with pytest.raises(ValueError, match="num_samples must be an integer"):
        AuditSettings(num_samples=n)


@pytest.mark.parametrize("k", ["auto", 0, -1])
def test_refuses_a_k_that_is_not_fixed(k: object) -> None:
    with pytest.raises(ValueError, match="fixed num_draft_tokens >= 1"):
        check_audit_draft_tokens(k)


def test_refuses_too_few_samples_and_says_how_many(tiny_target: TargetModel) -> None:
    decoder = SpeculativeDecoder(tiny_target, NGramDrafter(1, 3), 2, T1)
    with pytest.raises(ValueError, match=r"num_samples=20 is too few: .* use num_samples=") as info:
        audit_sampling(decoder, PROMPT, AuditSettings(num_samples=20))
    need = int(str(info.value).split("use num_samples=")[1].split()[0])
    assert 20 < need <= AuditSettings().num_samples  # the default N is enough on the tiny target
    plan = plan_audit(decoder, PROMPT, AuditSettings(num_samples=need))  # and the N it names is accepted
    assert plan.detectable_tv <= 0.1


class ImpossibleDrafter:
    """Drafts the target's least likely token, which top-k sampling gives probability 0: no draft
    can ever be accepted."""

    needs_target_hidden: ClassVar[bool] = False
    feature_layers: tuple[int, ...] = ()
    draft_sources: tuple[str, ...] = ()
    hf_counterpart: ClassVar[str | None] = None
    verify_curve_tokens: int = 0
    sizes_own_drafts: ClassVar[bool] = False
    batched: ClassVar[bool] = False  # drafts for one sequence

    def bind(self, target: TargetModel) -> None:
        self.target = target

    def reset(self) -> None:
        pass

    def learn(self, token_ids: torch.Tensor, prompt_len: int) -> dict[str, Any]:
        """Nothing is kept across requests."""
        return {}

    def commit(self, ctx: DraftContext, num_accepted: Sequence[int]) -> None:
        pass

    def keep_rows(self, rows: Sequence[int]) -> None:
        pass

    def source_of(self, ctx: DraftContext) -> list[int]:
        """One source."""
        return [0] * ctx.batch_size

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, num_tokens: int) -> Draft:
        worst = self.target.model(ctx.token_ids).logits[0, -1].argmin()
        return Draft(token_ids=worst.expand(1, num_tokens).clone())  # [1, K]


def test_no_accepted_draft_is_inconclusive_not_pass(tiny_target: TargetModel) -> None:
    sampling = SamplingConfig(temperature=1.0, top_k=4)
    decoder = SpeculativeDecoder(tiny_target, ImpossibleDrafter(), 2, sampling)
    audit = audit_sampling(decoder, PROMPT, AuditSettings(num_samples=500, max_detectable_tv=0.3))
    assert audit.pvalue >= audit.alpha
    assert audit.accepted == 0 and audit.bonus_tokens == 0
    assert audit.verdict is Verdict.INCONCLUSIVE and audit.verdict.exit_code == 3
    assert audit.summary().startswith("INCONCLUSIVE: p = ") and "only 0 drafts were accepted" in audit.summary()


# --------------------------------------------------------------------------------- verdicts
@pytest.mark.parametrize("broken", [resample_from_p, bonus_wrong_position])
def test_packaged_broken_verifier_fails_at_the_default_n(tiny_target: TargetModel, broken: Callable[..., VerifyResult]) -> None:
    decoder = SpeculativeDecoder(tiny_target, NGramDrafter(1, 3), 2, T1, sampler=broken)
    audit = audit_sampling(decoder, PROMPT, AuditSettings())
    assert audit.verdict is Verdict.FAIL
    assert audit.bonus_tokens > 0  # the bonus was reached (bonus_wrong_position is wrong only there)


def test_real_verifier_passes_with_acceptance_and_bonus_tested(tiny_target: TargetModel) -> None:
    decoder = SpeculativeDecoder(tiny_target, NGramDrafter(1, 3), 2, T1, sampler=rejection_sample)
    audit = audit_sampling(decoder, PROMPT, AuditSettings())
    assert audit.verdict is Verdict.PASS, audit.summary()
    assert audit.accepted >= 50 and audit.bonus_tokens > 0
    assert audit.plan.detectable_tv <= 0.1
    assert audit.summary().startswith(f"PASS: p = {audit.pvalue:.3g}, N = {AuditSettings().num_samples}; would have detected TV >= ")


@pytest.mark.slow
def test_default_audit_is_useful_on_the_default_target(default_target: TargetModel, hydra_conf: None) -> None:
    """The shipped settings on the default target: not refused (the default N detects TV <= 0.1) and
    audited where the default drafter's drafts are accepted (the full run takes minutes: not here)."""
    cfg = compose("check")
    decoder = SpeculativeDecoder(default_target, make_drafter(cfg.drafter), cfg.num_draft_tokens,
                                 make_sampling(cfg.sampling))
    prompt = prompt_token_ids(default_target.tokenizer, cfg.prompt, chat=cfg.chat)
    plan = plan_audit(decoder, prompt, audit_settings(cfg))
    assert plan.detectable_tv <= cfg.max_detectable_tv
    assert plan.context.accepted > 0 and plan.context.accepted >= max(c.accepted for c in plan.candidates)
    assert plan.candidates[0].token_ids == tuple(prompt)
