"""`specdraft-check`: a statistical losslessness audit of YOUR target + drafter pair.

Sampling (temperature > 0): N generations of two tokens from one prompt, each with its own seed;
the joint law of the first two tokens is compared with the target's own law, computed exactly from
the target (p(t1) * p(t2 | t1)). Cells are the most likely first tokens (covering `mass` of p, at most
`max_first`) times their most likely second tokens, plus one exact "everything else" cell per first
token and one for the remaining first tokens, so the test stays exact for a 50k vocabulary.
Chi-square p-value; FAIL below `alpha`.

Greedy (temperature 0): every prompt of the suite must give token-for-token the AR output.

    specdraft-check drafter=draft_model sampling=sample sampling.temperature=0.8 num_samples=1000
    specdraft-check drafter=ngram sampling=greedy suite=quick
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from tqdm import tqdm
from transformers import DynamicCache

from specdraft.build import make_drafter, make_sampling, prompt_token_ids
from specdraft.console import hydra_cli
from specdraft.decode import SpeculativeDecoder
from specdraft.sampling import SamplingConfig, warp
from specdraft.suites import load_suite
from specdraft.target import TargetModel


@torch.inference_mode()
def reference_greedy(
    target: TargetModel, prompt: Sequence[int], max_new_tokens: int, stop_token_ids: Sequence[int] = ()
) -> list[int]:
    """Plain greedy decoding with the Hugging Face model's own forward and DynamicCache, one token
    per step, no specdraft code on the path: what every speculative greedy output must equal (the
    tests and benchmarks/gpu_check.py compare against it). Stops after a token in stop_token_ids
    (included)."""
    model = target.model
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([list(prompt)], device=target.device)  # [1, T]
    out: list[int] = []
    while len(out) < max_new_tokens:
        tok = int(model(ids, cache=cache, use_cache=True).logits[0, -1].argmax())
        out.append(tok)
        if tok in stop_token_ids:
            break
        ids = torch.tensor([[tok]], device=target.device)  # [1, 1]
    return out


@dataclass(frozen=True)
class CellTable:
    """Exact probabilities of the audit's cells and a map from token pairs to cells."""

    probs: np.ndarray  # [C] float64, sums to 1
    first: dict[int, int]  # t1 -> index of its "other second token" cell
    pairs: dict[tuple[int, int], int]  # (t1, t2) -> cell
    rest: int  # cell of every t1 outside `first`

    def cell(self, t1: int, t2: int) -> int:
        if t1 not in self.first:
            return self.rest
        return self.pairs.get((t1, t2), self.first[t1])


def _top_support(p: np.ndarray, mass: float, limit: int) -> list[int]:
    order = np.argsort(-p, kind="stable")
    keep = int(np.searchsorted(np.cumsum(p[order]), mass) + 1)
    return [int(t) for t in order[: min(keep, limit)] if p[t] > 0]


@torch.inference_mode()
def exact_cells(
    target: TargetModel, prompt: list[int], sampling: SamplingConfig, mass: float = 0.999,
    max_first: int = 48, max_second: int = 24,
) -> CellTable:
    """The target's exact joint law of the first two tokens, on the audit's cells."""
    model = target.model
    ids = torch.tensor([prompt], device=target.device)
    p1 = warp(model(ids).logits[0, -1], sampling).double().cpu().numpy()  # [V]
    firsts = _top_support(p1, mass, max_first)
    batch = torch.cat([ids.expand(len(firsts), -1),
                       torch.tensor(firsts, device=target.device)[:, None]], dim=1)  # [F, T+1]
    p2 = warp(model(batch).logits[:, -1], sampling).double().cpu().numpy()  # [F, V]
    probs, first, pairs = [], {}, {}
    for row, t1 in enumerate(firsts):
        seconds = _top_support(p2[row], mass, max_second)
        for t2 in seconds:
            pairs[(t1, t2)] = len(probs)
            probs.append(p1[t1] * p2[row, t2])
        first[t1] = len(probs)
        probs.append(p1[t1] * max(0.0, 1.0 - p2[row, seconds].sum()))
    rest = len(probs)
    probs.append(max(0.0, 1.0 - p1[firsts].sum()))
    arr = np.array(probs)
    return CellTable(arr / arr.sum(), first, pairs, rest)


def chisquare_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Goodness of fit with cells of expected count < min_expected pooled; any count in a cell of
    probability 0 is an immediate failure (p = 0)."""
    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    if counts[probs <= 0].sum() > 0:
        return 0.0
    expected = probs * counts.sum()
    big = expected >= min_expected
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


def audit_sampling(
    decoder: SpeculativeDecoder, prompt: list[int], num_samples: int, progress: bool = False
) -> float:
    """p-value of the decoder's first-two-token law against the target's exact law: generation i
    uses the decoder's sampling settings with seed + i (passed per call; the decoder is unchanged)."""
    base = decoder.sampling
    table = exact_cells(decoder.target, prompt, base)
    counts = np.zeros(len(table.probs))
    for seed in tqdm(range(num_samples), desc="check", disable=not progress):
        sampling = SamplingConfig(base.temperature, base.top_k, base.top_p, base.seed + seed)
        toks = decoder.generate(prompt, 2, stop_token_ids=[], sampling=sampling).token_ids[0].tolist()
        counts[table.cell(toks[0], toks[1])] += 1
    return chisquare_pvalue(counts, table.probs)


def audit_greedy(
    decoder: SpeculativeDecoder, baseline: SpeculativeDecoder, prompts: list[list[int]],
    max_new_tokens: int,
) -> list[int]:
    """Indices of prompts whose speculative greedy output differs from the AR output."""
    return [
        i for i, ids in enumerate(prompts)
        if decoder.generate(ids, max_new_tokens).token_ids.tolist()
        != baseline.generate(ids, max_new_tokens).token_ids.tolist()
    ]


def run_check(cfg: DictConfig) -> bool:
    """Run the audit the config asks for; prints a verdict and returns True on PASS."""
    target = instantiate(cfg.target)
    drafter = make_drafter(cfg.drafter)
    sampling = make_sampling(cfg.sampling)
    sampler = instantiate(cfg.sampler)
    decoder = SpeculativeDecoder(target, drafter, cfg.num_draft_tokens, sampling, sampler=sampler,
                                 max_draft_tokens=cfg.max_draft_tokens)
    name = type(drafter).__name__ if drafter else "autoregressive"
    if sampling.greedy:
        prompts = [p.token_ids(target.tokenizer) for p in load_suite(cfg.suite.path or cfg.suite.name)]
        baseline = SpeculativeDecoder(target, None, 0, sampling)
        bad = audit_greedy(decoder, baseline, prompts, cfg.max_new_tokens)
        ok = not bad
        print(f"[check] greedy, {name}: {len(prompts) - len(bad)}/{len(prompts)} prompts identical "
              f"to autoregressive -> {'PASS' if ok else 'FAIL'}")
        return ok
    prompt = prompt_token_ids(target.tokenizer, cfg.prompt, chat=cfg.chat) if target.tokenizer \
        else list(cfg.prompt_ids)
    pvalue = audit_sampling(decoder, prompt, cfg.num_samples, progress=cfg.progress)
    ok = pvalue >= cfg.alpha
    print(f"[check] sampling {sampling}, {name}: first-two-token chi-square p = {pvalue:.3g} "
          f"(N={cfg.num_samples}, alpha={cfg.alpha}) -> {'PASS' if ok else 'FAIL'}")
    return ok


@hydra_cli("check")
def main(cfg: DictConfig) -> None:
    if not run_check(cfg):
        raise SystemExit(1)
