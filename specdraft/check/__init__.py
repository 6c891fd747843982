"""`specdraft-check`: a statistical losslessness audit of YOUR target + drafter pair.

Sampling (temperature > 0; `specdraft.check.sampled`): with a fixed K (num_draft_tokens >= 1), N
generations of K+1 tokens from one context, so every emitted position of a round is tested, bonus
included. The context is chosen so that the drafter's drafts are accepted (`specdraft.check.contexts`:
the prompt, or the prompt followed by the target's own greedy continuation); the joint law of the
K+1 tokens is compared with the target's exact law on cells (`specdraft.check.cells`) by a
chi-square test whose power is computed before sampling (`specdraft.check.power`): the audit
refuses an N that could not detect a total-variation distance of `max_detectable_tv`, and prints
the distance it would have detected beside the p-value.

Greedy (temperature 0): every prompt of the suite must give token-for-token the AR output.

Exit status: 0 PASS; 1 FAIL (the output law differs from the target's); 2 a user error (bad
settings, or too few samples); 3 INCONCLUSIVE (no deviation found, but fewer than `min_accepted`
drafts were accepted or no round accepted all K drafts, so acceptance or the bonus token went
untested). Negative controls: `specdraft.check.broken` (each must FAIL).

    specdraft-check drafter=draft_model sampling=sample sampling.temperature=0.8
    specdraft-check sampler.path=specdraft.check.broken.always_accept      # must FAIL
    specdraft-check drafter=ngram sampling=greedy suite=quick
"""

from __future__ import annotations

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from specdraft.build import make_drafter, make_sampling, prompt_token_ids
from specdraft.check.cells import CellSettings
from specdraft.check.chisquare import chi2_survival, chisquare_pvalue
from specdraft.check.greedy import audit_greedy, reference_greedy
from specdraft.check.sampled import (
    AuditSettings,
    SampledAudit,
    audit_sampling,
    check_audit_draft_tokens,
)
from specdraft.check.verdict import Verdict
from specdraft.console import hydra_cli
from specdraft.decode import SpeculativeDecoder
from specdraft.suites import load_suite

__all__ = [
    "AuditSettings", "SampledAudit", "Verdict", "audit_greedy", "audit_sampling", "audit_settings", "chi2_survival",
    "chisquare_pvalue", "main", "reference_greedy", "run_check",
]


def audit_settings(cfg: DictConfig) -> AuditSettings:
    """The sampled audit's settings from the `check` config (validated, before any model loads)."""
    cells = OmegaConf.to_container(cfg.cells, resolve=True)
    return AuditSettings(
        num_samples=cfg.num_samples, alpha=cfg.alpha, power=cfg.power, max_detectable_tv=cfg.max_detectable_tv,
        min_accepted=cfg.min_accepted, cells=CellSettings(**cells),
        continuation_tokens=cfg.continuation_tokens, scoring_runs=cfg.scoring_runs,
    )


def run_check(cfg: DictConfig) -> Verdict:
    """Run the audit the config asks for; prints what it tested and the verdict, and returns it."""
    sampling = make_sampling(cfg.sampling)
    settings = None
    if not sampling.greedy:
        if cfg.drafter is None or "_target_" not in cfg.drafter:
            raise ValueError("the sampled audit tests a drafter's acceptance; choose a drafter (e.g. "
                             "drafter=ngram), not drafter=none.")
        check_audit_draft_tokens(cfg.num_draft_tokens)
        settings = audit_settings(cfg)
    sampler = instantiate(cfg.sampler)
    target = instantiate(cfg.target)
    drafter = make_drafter(cfg.drafter)
    decoder = SpeculativeDecoder(target, drafter, cfg.num_draft_tokens, sampling, sampler=sampler,
                                 max_draft_tokens=cfg.max_draft_tokens)
    name = type(drafter).__name__ if drafter else "autoregressive"
    if settings is None:
        prompts = [p.token_ids(target.tokenizer) for p in load_suite(cfg.suite.path or cfg.suite.name)]
        baseline = SpeculativeDecoder(target, None, 0, sampling)
        bad = audit_greedy(decoder, baseline, prompts, cfg.max_new_tokens)
        verdict = Verdict.FAIL if bad else Verdict.PASS
        print(f"[check] greedy, {name}: {len(prompts) - len(bad)}/{len(prompts)} prompts identical "
              f"to autoregressive -> {verdict.name}")
        return verdict
    prompt = prompt_token_ids(target.tokenizer, cfg.prompt, chat=cfg.chat) if target.tokenizer \
        else list(cfg.prompt_ids)
    audit = audit_sampling(decoder, prompt, settings, progress=cfg.progress)
    added = list(audit.plan.context.token_ids[len(prompt):])
    _report(audit, name, str(sampling), cfg.num_draft_tokens,
            target.tokenizer.decode(added) if target.tokenizer and added else None)
    return audit.verdict


def _report(audit: SampledAudit, name: str, sampling: str, k: int, added_text: str | None) -> None:
    plan = audit.plan
    ctx = plan.context
    print(f"[check] sampling {sampling}, {name}, K = {k}: joint law of the {k + 1} tokens of a round")
    print(f"[check] audit context ({len(ctx.token_ids)} tokens, best of {len(plan.candidates)} candidates): "
          f"{ctx.label}; {ctx.accepted}/{ctx.drafted} drafts accepted in the scoring runs")
    if added_text is not None:
        print(f"[check] text after the prompt: {added_text!r}")
    per = ", ".join(f"{a}/{r}" for a, r in zip(audit.accepted_per_position, audit.reached_per_position))
    print(f"[check] accepted/reached drafts per position: {per}; bonus tokens after {k} accepted: "
          f"{audit.bonus_tokens}")
    print(audit.summary())


@hydra_cli("check")
def main(cfg: DictConfig) -> None:
    verdict = run_check(cfg)
    if verdict is not Verdict.PASS:
        raise SystemExit(verdict.exit_code)
