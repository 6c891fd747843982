"""The sampled audit (temperature > 0): does the decoder emit the target's law at every position
of a round, bonus included?

With a fixed K, N generations of K+1 tokens (generation i with seed base + i) from one context are
counted on the cells of the target's exact law of K+1 tokens (`specdraft.check.cells`); a chi-square
test compares the two. Before any sample is drawn the test's power is computed on exactly those
cells (`specdraft.check.power`): an N that could not detect a total-variation distance of
`max_detectable_tv` is refused with the N that would. After sampling, the verdict is PASS only if
drafts were accepted (at least `min_accepted`) and at least one round accepted all K drafts and
emitted the bonus token; otherwise a passing p-value is INCONCLUSIVE.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from specdraft.check.cells import CellSettings, CellTable, exact_cells
from specdraft.check.chisquare import chisquare_pvalue, pooled_probs
from specdraft.check.contexts import Context, choose_context
from specdraft.check.power import detectable_tv
from specdraft.check.verdict import Verdict
from specdraft.decode import SpeculativeDecoder

MAX_SAMPLES = 10**8


@dataclass(frozen=True)
class AuditSettings:
    """What a sampled audit must achieve; checked before any model is loaded."""

    num_samples: int = 2000
    alpha: float = 1e-4  # FAIL below this p-value
    power: float = 0.9  # the detectable distance is the one detected with this probability
    max_detectable_tv: float = 0.1  # refuse an N that cannot detect this total-variation distance
    min_accepted: int = 50  # fewer accepted drafts: INCONCLUSIVE, never PASS
    min_expected: float = 5.0  # the chi-square pools cells with fewer expected counts
    cells: CellSettings = field(default_factory=CellSettings)
    continuation_tokens: int = 16  # greedy continuation that builds the candidate contexts
    scoring_runs: int = 4  # generations per candidate context

    def __post_init__(self) -> None:
        n = self.num_samples
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SAMPLES:
            raise ValueError(
                f"num_samples must be an integer in [1, {MAX_SAMPLES:,}], got {n!r}: an audit without samples "
                "cannot detect any deviation. Leave the default of conf/check.yaml, or pass a value: one too "
                "small for max_detectable_tv is refused with the number this audit needs."
            )
        if not 0.0 < self.alpha < 0.5:
            raise ValueError(f"alpha must be in (0, 0.5), got {self.alpha!r} (the default is 1e-4).")
        if not self.alpha < self.power < 1.0:
            raise ValueError(f"power must be in (alpha, 1), got {self.power!r}.")
        if not 0.0 < self.max_detectable_tv <= 1.0:
            raise ValueError(f"max_detectable_tv must be in (0, 1], got {self.max_detectable_tv!r}.")
        for name in ("min_accepted", "continuation_tokens", "scoring_runs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}.")
        if not self.min_expected > 0:
            raise ValueError(f"min_expected must be > 0, got {self.min_expected!r}.")


def check_audit_draft_tokens(num_draft_tokens: object) -> int:
    """The sampled audit's K: a fixed integer >= 1 (each sample is one full round, K + 1 tokens)."""
    k = num_draft_tokens
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(
            f"the sampled audit needs a fixed num_draft_tokens >= 1 (it tests every position of a K-token "
            f"round, bonus included), got {k!r}; pass e.g. num_draft_tokens=2, or audit each K you use."
        )
    return k


@dataclass(frozen=True)
class AuditPlan:
    """Where and on which cells the audit runs, and what it can detect; fixed before sampling."""

    context: Context
    candidates: list[Context]
    table: CellTable
    num_pooled_cells: int  # cells of the chi-square at N, after pooling
    detectable_tv: float


@dataclass(frozen=True)
class SampledAudit:
    """The outcome of a sampled audit."""

    plan: AuditPlan
    num_samples: int
    alpha: float
    power: float
    pvalue: float
    drafted_per_position: list[int]  # summed over every round of every sample
    reached_per_position: list[int]
    accepted_per_position: list[int]
    bonus_tokens: int  # rounds that accepted all K drafts and emitted the bonus
    verdict: Verdict
    reason: str  # why INCONCLUSIVE ("" otherwise)

    @property
    def accepted(self) -> int:
        return sum(self.accepted_per_position)

    def summary(self) -> str:
        """The verdict line: p-value, N and the deviation the test would have detected."""
        line = (f"{self.verdict.name}: p = {self.pvalue:.3g}, N = {self.num_samples}; would have detected "
                f"TV >= {self.plan.detectable_tv:.2g} with {self.power:.0%} power (on {self.plan.num_pooled_cells} "
                f"cells, alpha = {self.alpha:g})")
        return f"{line}; {self.reason}" if self.reason else line


def plan_audit(decoder: SpeculativeDecoder, prompt: list[int], settings: AuditSettings) -> AuditPlan:
    """Choose the context, build the cells, and refuse if the test could not detect
    `max_detectable_tv` at this N (with the N that would)."""
    depth = check_audit_draft_tokens(decoder.num_draft_tokens) + 1
    context, candidates = choose_context(decoder, prompt, depth, settings.continuation_tokens, settings.scoring_runs)
    ids = list(context.token_ids)
    n = settings.num_samples
    table = exact_cells(decoder.target, ids, decoder.sampling, depth, n, settings.cells)
    tv = detectable_tv(table.probs, n, settings.alpha, settings.power, settings.min_expected)
    if tv > settings.max_detectable_tv:
        need = _samples_needed(decoder, ids, depth, settings)
        fix = f"use num_samples={need} or more" if need <= MAX_SAMPLES else \
            f"no num_samples up to {MAX_SAMPLES:,} reaches it: raise max_detectable_tv"
        raise ValueError(
            f"num_samples={n} is too few: on this audit's cells the chi-square test (alpha = {settings.alpha:g}) "
            + ("could not detect any deviation" if tv >= 1.0 else
               f"would detect only a deviation of total variation >= {tv:.2g} with {settings.power:.0%} power")
            + f", and max_detectable_tv={settings.max_detectable_tv:g}; {fix}."
        )
    cells = len(pooled_probs(table.probs, n, settings.min_expected))
    return AuditPlan(context, candidates, table, cells, tv)


def _samples_needed(decoder: SpeculativeDecoder, context: list[int], depth: int, settings: AuditSettings) -> int:
    """The smallest N (about: doubling, then a few bisection steps) whose cells, built for that N,
    let the test detect max_detectable_tv; MAX_SAMPLES + 1 if none up to MAX_SAMPLES does."""

    def enough(n: int) -> bool:
        table = exact_cells(decoder.target, context, decoder.sampling, depth, n, settings.cells)
        return detectable_tv(table.probs, n, settings.alpha, settings.power, settings.min_expected) \
            <= settings.max_detectable_tv

    lo, hi = settings.num_samples, 2 * settings.num_samples
    while not enough(hi):
        if hi > MAX_SAMPLES:
            return MAX_SAMPLES + 1
        lo, hi = hi, 2 * hi
    for _ in range(4):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return _round_up(hi)


def _round_up(n: int) -> int:
    """n rounded up to two significant digits."""
    step = 10 ** max(0, len(str(n)) - 2)
    return -(-n // step) * step


def audit_sampling(
    decoder: SpeculativeDecoder, prompt: list[int], settings: AuditSettings, progress: bool = False
) -> SampledAudit:
    """Plan the audit, draw N generations of K+1 tokens (seed base + i, the decoder's sampling
    otherwise; the decoder is not changed), test them and give the verdict."""
    plan = plan_audit(decoder, prompt, settings)
    k = decoder.num_draft_tokens
    base = decoder.sampling
    counts = np.zeros(plan.table.num_cells)
    drafted, reached, accepted = [0] * k, [0] * k, [0] * k
    for i in tqdm(range(settings.num_samples), desc="check", disable=not progress):
        out = decoder.generate(list(plan.context.token_ids), k + 1, stop_token_ids=[], sampling=base.with_seed(base.seed + i))
        counts[plan.table.cell(out.token_ids[0].tolist())] += 1
        for total, per in ((drafted, out.stats.drafted_per_position), (reached, out.stats.reached_per_position),
                           (accepted, out.stats.accepted_per_position)):
            for j, c in enumerate(per[:k]):
                total[j] += c
    pvalue = chisquare_pvalue(counts, plan.table.probs, settings.min_expected)
    # Only the first round may draft K tokens (later ones are capped by the tokens left), so the
    # rounds that accepted position K-1 are exactly those that emitted the bonus after K drafts.
    bonus = accepted[k - 1]
    reason = ""
    if pvalue >= settings.alpha:
        if sum(accepted) < settings.min_accepted:
            reason = (f"only {sum(accepted)} drafts were accepted (min_accepted = {settings.min_accepted}): "
                      "the acceptance path was not exercised")
        elif bonus == 0:
            reason = f"no round accepted all {k} drafts, so the bonus token was never tested"
    verdict = Verdict.FAIL if pvalue < settings.alpha else Verdict.INCONCLUSIVE if reason else Verdict.PASS
    return SampledAudit(plan, settings.num_samples, settings.alpha, settings.power, pvalue, drafted, reached,
                        accepted, bonus, verdict, reason)
