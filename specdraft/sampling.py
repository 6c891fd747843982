"""Sampling settings and the ONE warping function used for both target and drafter.

Speculative sampling is lossless only if the drafter's q and the target's p are warped the same way
(temperature, then top-k, then top-p) before the verifier compares them. Every distribution in
specdraft goes through `warp`, so there is no second code path that could drift.

Temperature 0 means greedy: `warp` then returns the one-hot distribution of the argmax, which makes
greedy decoding a special case of sampling (and keeps the verifier's inputs well defined).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor


TINY_TEMPERATURE = 1e-30  # below this the logits are scaled in float64 (float32 would round 1/T away)


@dataclass(frozen=True)
class SamplingConfig:
    """How tokens are chosen from the target's logits.

    temperature: 0 = greedy (argmax); > 0 divides the logits.
    top_k: keep the k most likely tokens (0 = off).
    top_p: keep the smallest set of tokens whose probability reaches top_p (1.0 = off).
    seed: seeds the torch.Generator that every random draw of a generation uses.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name, kinds in (("temperature", (int, float)), ("top_k", (int,)), ("top_p", (int, float)), ("seed", (int,))):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, kinds):
                kind = "an integer" if kinds == (int,) else "a number"
                raise ValueError(f"sampling.{name} must be {kind}, got {value!r}.")
        if not self.temperature >= 0:
            raise ValueError(
                f"temperature must be >= 0 (0 means greedy), got {self.temperature}; "
                "use sampling.temperature=0 for greedy decoding or a positive value to sample."
            )
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables top-k), got {self.top_k}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(
                f"top_p must be in (0, 1] (1.0 disables nucleus sampling), got {self.top_p}."
            )

    def with_seed(self, seed: int) -> SamplingConfig:
        """The same warping with another seed (audits and calibrations draw their own streams)."""
        return replace(self, seed=seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        """A fresh generator seeded with `seed`, on `device` (CPU generators drive CPU draws)."""
        gen = torch.Generator(device=device)
        gen.manual_seed(self.seed)
        return gen


def warp(logits: Tensor, cfg: SamplingConfig) -> Tensor:
    """Turn logits [..., V] into probabilities [..., V] (float32) under `cfg`.

    Order (same as Hugging Face and vLLM): temperature, top-k, top-p, softmax. Greedy returns the
    one-hot argmax; a tiny positive temperature gives (numerically) all mass to the top logit(s). Ties at the top-k / top-p boundary keep the tokens sorted first, so the result
    is a deterministic function of the logits.
    """
    logits = logits.float()
    if cfg.greedy:
        return one_hot_argmax(logits)
    # Shift so the top logit is 0, then scale: no temperature, however small, can overflow into
    # inf - inf = NaN (a temperature that float32 rounds to 0 is applied in float64).
    shifted = logits - logits.max(dim=-1, keepdim=True).values
    if cfg.temperature >= TINY_TEMPERATURE:
        logits = shifted / cfg.temperature
    else:
        logits = (shifted.double() / cfg.temperature).float()
    if cfg.top_k > 0 and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p (the top token stays).
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= cfg.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, sorted_idx, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


def draw(probs: Tensor, cfg: SamplingConfig, generator: torch.Generator) -> Tensor:
    """One token per row of warped probs [..., V] -> [...]: the argmax when greedy, else a sample.
    Drafters use this so q and the proposed token always come from the same rule."""
    return probs.argmax(-1) if cfg.greedy else sample(probs, generator)


def one_hot_argmax(logits: Tensor) -> Tensor:
    """One-hot float32 distribution [..., V] at the argmax of `logits` [..., V]."""
    idx = logits.argmax(dim=-1, keepdim=True)
    return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, idx, 1.0)


def sample(probs: Tensor, generator: torch.Generator) -> Tensor:
    """Draw one token per row from probs [..., V] by inverse CDF with float64 uniforms -> [...]."""
    probs64 = probs.double()
    cdf = torch.cumsum(probs64, dim=-1)  # [..., V]
    u = torch.rand(cdf.shape[:-1] + (1,), generator=generator, dtype=torch.float64, device="cpu")
    u = u.to(cdf.device) * cdf[..., -1:]  # scale: tolerate rows that sum to 1 +- eps
    idx = torch.searchsorted(cdf, u, right=True).squeeze(-1)
    # Guard against u landing exactly on the total mass (float rounding): clamp to the last
    # token with positive probability.
    last_nonzero = (probs64 > 0).long().cumsum(-1).argmax(-1)
    return torch.minimum(idx, last_nonzero)
