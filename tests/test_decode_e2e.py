"""End-to-end statistical losslessness: the joint law of the first two generated tokens from the
full SpeculativeDecoder (drafter, loop, KV cache, verifier) equals the target's exactly enumerated
law. Vocab 16 -> 256 cells; N fixed-seed generations; chi-square with pooled small cells."""

from __future__ import annotations

import pytest

from drafters.ngram import NGramDrafter
from specdraft.check.broken import always_accept
from specdraft.decode import SpeculativeDecoder
from specdraft.models import tiny_random_llama
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel
from tests.helpers import (
    RecomputeDrafter,
    exact_two_token_distribution,
    pooled_chisquare,
    sample_two_tokens,
)

N = 2000
PROMPT = [1, 2, 3, 1, 2]


def two_token_pvalue(target: TargetModel, decoder: SpeculativeDecoder) -> float:
    expected = exact_two_token_distribution(target, PROMPT, decoder.sampling)
    counts = sample_two_tokens(decoder, PROMPT, N, target.vocab_size)
    return pooled_chisquare(counts, expected)


@pytest.mark.parametrize(
    "sampling",
    [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.8, top_p=0.9, top_k=8)],
    ids=["t1", "topk_topp"],
)
def test_model_drafter_is_lossless(tiny_target: TargetModel, sampling: SamplingConfig) -> None:
    drafter = RecomputeDrafter(tiny_random_llama(vocab_size=16, seed=7, init_std=0.3))
    dec = SpeculativeDecoder(tiny_target, drafter, 2, sampling)
    assert two_token_pvalue(tiny_target, dec) > 1e-4


def test_deterministic_drafter_is_lossless(tiny_target: TargetModel) -> None:
    dec = SpeculativeDecoder(tiny_target, NGramDrafter(1, 2), 2, SamplingConfig(temperature=1.0))
    assert two_token_pvalue(tiny_target, dec) > 1e-4


def test_broken_verifier_is_caught(tiny_target: TargetModel) -> None:
    drafter = RecomputeDrafter(tiny_random_llama(vocab_size=16, seed=7, init_std=0.3))
    dec = SpeculativeDecoder(
        tiny_target, drafter, 2, SamplingConfig(temperature=1.0), sampler=always_accept
    )
    assert two_token_pvalue(tiny_target, dec) < 1e-6
