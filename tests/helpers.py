"""Shared test utilities: reference decoders, exact target distributions, pooled chi-square.

Other test modules (and every drafter's tests) import these so that "lossless" means the same
thing everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import numpy as np
import torch

from specdraft.check import chisquare_pvalue as pooled_chisquare  # the audit's test, shared
from specdraft.check import reference_greedy as plain_greedy  # the reference decoder, shared
from specdraft.decode import SpeculativeDecoder
from specdraft.protocol import Draft, DraftContext
from specdraft.sampling import SamplingConfig, draw, warp
from specdraft.target import TargetModel

__all__ = [  # plain_greedy and pooled_chisquare are re-exported: one definition for every test
    "RecomputeDrafter", "exact_two_token_distribution", "load_script", "next_token_probs", "plain_greedy",
    "pooled_chisquare", "sample_two_tokens",
]


def load_script(path: Path) -> ModuleType:
    """A script that is not part of the package (benchmarks/*.py), imported as a module."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@torch.inference_mode()
def next_token_probs(target: TargetModel, prefix: list[int], sampling: SamplingConfig) -> np.ndarray:
    """Warped p(. | prefix) [V] from a plain full forward (no cache), float64."""
    logits = target.model(torch.tensor([prefix], device=target.device)).logits[0, -1]
    return warp(logits, sampling).double().cpu().numpy()


def exact_two_token_distribution(
    target: TargetModel, prompt: list[int], sampling: SamplingConfig
) -> np.ndarray:
    """Exact joint distribution [V * V] of the first two generated tokens (enumerated)."""
    p1 = next_token_probs(target, prompt, sampling)
    joint = np.zeros((len(p1), len(p1)))
    for t1 in np.nonzero(p1)[0]:
        joint[t1] = p1[t1] * next_token_probs(target, prompt + [int(t1)], sampling)
    return joint.ravel()


def sample_two_tokens(decoder: SpeculativeDecoder, prompt: list[int], n: int, vocab: int,
                      new_tokens: int = 2) -> np.ndarray:
    """Counts [V * V] of the first two tokens over n generations with seeds 0..n-1 (the decoder's
    sampling settings otherwise; passed per call, the decoder is not changed). new_tokens: how
    many each generation makes (a round drafts at most new_tokens - 1: more lets a first round
    draft a tree with siblings)."""
    counts = np.zeros(vocab * vocab)
    base = decoder.sampling
    for seed in range(n):
        sampling = base.with_seed(seed)
        toks = decoder.generate(prompt, new_tokens, stop_token_ids=[], sampling=sampling).token_ids[0].tolist()
        counts[toks[0] * vocab + toks[1]] += 1
    return counts


class RecomputeDrafter:
    """A deliberately simple model drafter for tests: no KV cache, recomputes each row's whole
    context each step, samples from its warped q with the shared generator (row by row in a
    batch). Obviously correct, slow."""

    needs_target_hidden: ClassVar[bool] = False
    feature_layers: tuple[int, ...] = ()
    draft_sources: tuple[str, ...] = ()
    hf_counterpart: ClassVar[str | None] = None
    verify_curve_tokens: int = 0
    sizes_own_drafts: ClassVar[bool] = False
    batched: ClassVar[bool] = True

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model.eval()

    def bind(self, target: TargetModel) -> None:
        if self.model.config.vocab_size != target.vocab_size:
            raise ValueError("vocabulary mismatch")

    def reset(self) -> None:
        pass

    def learn(self, token_ids: torch.Tensor, prompt_len: int) -> dict[str, Any]:
        """Nothing is kept across requests."""
        return {}

    def commit(self, ctx: DraftContext, num_accepted: Sequence[int]) -> None:
        """Nothing to roll back: every proposal recomputes from the committed tokens."""

    def keep_rows(self, rows: Sequence[int]) -> None:
        """No per-row state."""

    def source_of(self, ctx: DraftContext) -> list[int]:
        """One source."""
        return [0] * ctx.batch_size

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, num_tokens: int) -> Draft:
        rows_tokens, rows_probs = [], []
        for i in range(ctx.batch_size):
            ids = ctx.row(i)[None].clone()  # [1, T_i]
            tokens, probs = [], []
            for _ in range(num_tokens):
                q = warp(self.model(ids).logits[:, -1], ctx.sampling)  # [1, V]
                tok = draw(q, ctx.sampling, ctx.generator)  # [1]
                tokens.append(tok)
                probs.append(q)
                ids = torch.cat([ids, tok[:, None]], dim=1)
            rows_tokens.append(torch.stack(tokens, dim=1))
            rows_probs.append(torch.stack(probs, dim=1))
        return Draft(token_ids=torch.cat(rows_tokens), probs=torch.cat(rows_probs))  # [B, K], [B, K, V]
