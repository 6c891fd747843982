"""Prefix caching across requests: restored K/V equal a fresh prefill's, greedy output is unchanged
for every drafter kind that may use it, the budget holds, and bad settings are clear errors."""

from __future__ import annotations

import pytest
import torch

from drafters.ngram import NGramDrafter
from drafters.suffix import SuffixDrafter
from specdraft.decode import SpeculativeDecoder
from specdraft.models import tiny_random_target
from specdraft.prefix_cache import PrefixCache, common_prefix
from tests.helpers import plain_greedy

FIRST = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4]  # 24 tokens


def conversation(decoder: SpeculativeDecoder, turns: int = 3, new: int = 12) -> list[list[int]]:
    """A multi-turn exchange: each prompt is the previous prompt + its answer + a new message;
    returns every answer."""
    prompt, answers = list(FIRST), []
    for turn in range(turns):
        answer = decoder.generate(torch.tensor(prompt), new, stop_token_ids=[]).token_ids[0].tolist()
        answers.append(answer)
        prompt = prompt + answer + [(7 * turn + t) % 16 for t in range(5)]
    return answers


def test_common_prefix() -> None:
    assert common_prefix(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 4, 5])) == 2
    assert common_prefix(torch.tensor([1, 2]), torch.tensor([1, 2, 3])) == 2
    assert common_prefix(torch.tensor([7]), torch.tensor([1])) == 0
    assert common_prefix(torch.tensor([], dtype=torch.long), torch.tensor([1])) == 0


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "hf"])
def test_restored_prefix_equals_a_fresh_prefill(fast: bool) -> None:
    """Restore 20 positions of an earlier sequence and prefill the rest: the cache and the last
    hidden state equal one forward over the whole prompt."""
    target = tiny_random_target(vocab_size=16, seed=3, fast=fast)
    earlier = torch.tensor(FIRST + [1, 1, 2])
    cache = PrefixCache(max_tokens=100)
    target.reset()
    target.forward(earlier[None])
    cache.add(cache.snapshot(target, earlier))
    prompt = torch.tensor(FIRST[:20] + [0, 7, 7, 0, 2])
    reused = cache.restore(target, prompt, limit=len(prompt) - 1)
    assert reused == 20 and target.cache_length == 20
    out = target.forward(prompt[None, reused:])
    restored = [(k.clone(), v.clone()) for k, v in target.cache_tensors()]
    target.reset()
    fresh = target.forward(prompt[None])
    assert torch.allclose(out.hidden[:, -1], fresh.hidden[:, -1], atol=1e-5)
    for (k, v), (k_ref, v_ref) in zip(restored, target.cache_tensors(), strict=True):
        assert torch.allclose(k, k_ref, atol=1e-5) and torch.allclose(v, v_ref, atol=1e-5)
    assert cache.hits == 1 and cache.reused_tokens == 20


@pytest.mark.parametrize("drafter", [None, "ngram", "suffix"])
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "hf"])
def test_greedy_output_is_unchanged(drafter: str | None, fast: bool) -> None:
    """A conversation decoded with the prefix cache = without it = plain greedy, and every turn
    after the first restores the whole earlier conversation."""
    target = tiny_random_target(vocab_size=16, seed=1, fast=fast)

    def make(tokens: int) -> SpeculativeDecoder:
        d = {None: None, "ngram": NGramDrafter(), "suffix": SuffixDrafter(anchor=2, corpus=None)}[drafter]
        return SpeculativeDecoder(target, d, num_draft_tokens=3, verify_curve=[1.0] * 9, prefix_cache_tokens=tokens)

    cached, plain = make(1000), make(0)
    with_cache = conversation(cached)
    assert with_cache == conversation(plain)
    assert with_cache[0] == plain_greedy(target, FIRST, 12)
    assert cached.prefix_cache is not None and cached.prefix_cache.hits == 2
    assert len(cached.prefix_cache.sequences) == 1  # each turn's sequence extends the one before: replaced


def test_budget_keeps_the_newest_and_learn_keeps_only_what_agrees() -> None:
    target = tiny_random_target(vocab_size=16, seed=2)
    decoder = SpeculativeDecoder(target, None, prefix_cache_tokens=60)
    cache = decoder.prefix_cache
    assert cache is not None
    for first in range(4):  # four unrelated 24-token prompts + 8 new tokens each: 32 positions kept each
        prompt = torch.tensor([(first + t * (first + 1)) % 16 for t in range(24)])
        decoder.generate(prompt, 8, stop_token_ids=[])
        assert cache.num_tokens <= 60
    assert len(cache.sequences) == 1 and cache.memory_bytes() > 0
    assert cache.sequences[0].tokens[:24].tolist() == [(3 + t * 4) % 16 for t in range(24)]  # the newest
    # learn() with other tokens than the last generation's keeps only the part they share
    prompt = torch.tensor(FIRST)
    out = decoder.generate(prompt, 8, stop_token_ids=[], learn=False).token_ids[0]
    decoder.learn(prompt, (out + 1) % 16)
    assert cache.sequences[-1].tokens.tolist() == FIRST


def test_the_longest_shared_prefix_is_restored_and_moves_last() -> None:
    target = tiny_random_target(vocab_size=16, seed=2)
    cache = PrefixCache(max_tokens=1000)
    older, newer = torch.tensor(FIRST + [0] * 6), torch.tensor(FIRST[:18] + [1] * 20)
    for seq in (older, newer):
        target.reset()
        target.forward(seq[None])
        cache.add(cache.snapshot(target, seq))
    assert cache.restore(target, torch.tensor(FIRST + [7, 7]), limit=25) == 24  # the older one shares more
    assert [s.num_tokens for s in cache.sequences] == [38, 30]  # used last: evicted last
    assert cache.restore(target, torch.tensor([0] * 30), limit=29) == 0 and target.cache_length == 0


def test_calibration_runs_neither_read_nor_feed_the_cache() -> None:
    target = tiny_random_target(vocab_size=16, seed=2)
    decoder = SpeculativeDecoder(target, NGramDrafter(), num_draft_tokens="auto", verify_curve=[1.0] * 9,
                                 prefix_cache_tokens=1000)
    decoder.generate(torch.tensor(FIRST), 4, stop_token_ids=[])  # measures the drafter's cost first
    assert decoder.prefix_cache is not None
    assert [s.tokens[:24].tolist() for s in decoder.prefix_cache.sequences] == [FIRST]


def test_bad_settings_are_clear_errors() -> None:
    target = tiny_random_target(vocab_size=16, seed=2)
    with pytest.raises(ValueError, match="prefix_cache_tokens must be an integer >= 0"):
        SpeculativeDecoder(target, None, prefix_cache_tokens=-1)
    with pytest.raises(ValueError, match="max_tokens must be an integer >= 1"):
        PrefixCache(0)

    reader = NGramDrafter()
    reader.feature_layers = (0, 1)  # declares that it reads layer features, as eagle does
    with pytest.raises(ValueError, match="reads the target's layer features.*prefix_cache_tokens=0"):
        SpeculativeDecoder(target, reader, prefix_cache_tokens=100)
