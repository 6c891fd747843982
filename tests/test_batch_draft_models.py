"""Batched drafting with a model of its own (a draft model, a quantized copy of the target):
`generate_batch` on prompts of different lengths gives every row exactly its own `generate` output
(greedy), on both layer stacks, with a fixed K and with "auto"; the draft cache's rows follow the
committed rows as rows finish at different rounds; sampled batches are reproducible from a seed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from drafters.draft_model import DraftModelDrafter
from drafters.quantized import QuantizedDrafter
from specdraft.decode import SpeculativeDecoder
from specdraft.models import tiny_random_llama, tiny_random_target
from specdraft.protocol import DraftContext
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel
from specdraft.vocab import PrunedVocab

PROMPTS = [[1, 2, 3, 1, 2], [4], [5, 6, 7, 8, 9, 10, 11, 3], [2, 9, 2]]
MAX_NEW = 14  # a multiple of neither K = 3 nor the K + 1 = 4 tokens a fully accepted round emits
AUTO = {"max_draft_tokens": 4, "verify_curve": [1.0] * 5, "draft_cost": 0.1}


def tiny_draft() -> torch.nn.Module:
    return tiny_random_llama(vocab_size=16, seed=7, init_std=0.3, num_layers=1)


def subset() -> PrunedVocab:
    return PrunedVocab(torch.tensor([0, 1, 2, 3, 5, 7, 8, 9, 11, 12, 14, 15]), 16)


# name -> (drafter for a target, whether it needs the fast stack)
DRAFTERS: dict[str, tuple[Callable[[TargetModel], object], bool]] = {
    "draft-equal-to-target": (lambda t: DraftModelDrafter(t.model, pruned_vocab=None, copy_ngram=None, fast=t.fast),
                              False),
    "draft-copying-pruned": (lambda t: DraftModelDrafter(tiny_draft(), pruned_vocab=subset(), fast=t.fast), False),
    "quantized-int4": (lambda t: QuantizedDrafter(bits=4), True),
    "quantized-int4-own-cache": (lambda t: QuantizedDrafter(bits=4, share_kv=False), True),
    "quantized-torch-int8": (lambda t: QuantizedDrafter(bits=8, backend="torch"), False),  # Hugging Face stack
}


def target_on(fast: bool) -> TargetModel:
    return tiny_random_target(vocab_size=16, seed=1, fast=fast)


def plain(target: TargetModel, prompt: list[int], stop: list[int]) -> list[int]:
    return SpeculativeDecoder(target).generate(prompt, MAX_NEW, stop_token_ids=stop).token_ids[0].tolist()


def mid_block_stop(target: TargetModel) -> list[int]:
    """A stop token that row 0 emits first in the middle of a round's block (its index is not the
    last of a block of K + 1 = 4) and that some other row never reaches: rows finish at different
    rounds, one of them mid-block."""
    free = plain(target, PROMPTS[0], [])
    for j in range(4, MAX_NEW):
        if free[j] not in free[:j] and j % 4 != 3:
            return [free[j]]
    raise AssertionError(f"no mid-block stop token in {free}")


@pytest.mark.parametrize("fast", [True, False], ids=["fast-stack", "hf-stack"])
@pytest.mark.parametrize("name", list(DRAFTERS))
@pytest.mark.parametrize("k", [3, "auto"])
def test_greedy_batch_equals_each_prompt_alone(fast: bool, name: str, k: int | str) -> None:
    make, needs_fast = DRAFTERS[name]
    if needs_fast and not fast:
        pytest.skip("the fast backend's copy needs a target on the fast stack")
    target = target_on(fast)
    stop = mid_block_stop(target)
    dec = SpeculativeDecoder(target, make(target), k, **(AUTO if k == "auto" else {}))
    batch = dec.generate_batch(PROMPTS, MAX_NEW, stop_token_ids=stop)
    lengths = []
    for prompt, row in zip(PROMPTS, batch, strict=True):
        alone = dec.generate(prompt, MAX_NEW, stop_token_ids=stop).token_ids[0].tolist()
        assert row.token_ids[0].tolist() == alone == plain(target, prompt, stop)
        lengths.append(len(alone))
    assert lengths[0] < MAX_NEW and MAX_NEW in lengths  # row 0 stops early, another runs to the budget
    assert max(batch.stats.drafted_per_round) > 0
    if name != "draft-copying-pruned":  # (a random draft; the others imitate the target closely)
        assert sum(row.stats.accepted for row in batch) > 0
    if name == "draft-equal-to-target" and k == 3:  # a draft equal to the target: every draft is kept
        assert all(row.stats.acceptance_rate == 1.0 for row in batch)


@pytest.mark.parametrize("name", ["draft-copying-pruned", "quantized-int4"])
@pytest.mark.parametrize("prompts", [[[3], [5], [7]], [[1, 2, 3], [4, 5, 6]]], ids=["one-token", "equal-length"])
def test_prompts_of_equal_length(name: str, prompts: list[list[int]]) -> None:
    """Aligned rows (no padding at first); one-token prompts prefill nothing."""
    target = target_on(True)
    dec = SpeculativeDecoder(target, DRAFTERS[name][0](target), 3)
    batch = dec.generate_batch(prompts, MAX_NEW, stop_token_ids=[])
    for prompt, row in zip(prompts, batch, strict=True):
        assert row.token_ids[0].tolist() == plain(target, prompt, [])


@pytest.mark.parametrize("name", ["draft-random", "quantized-int4-own-cache", "quantized-int4"])
def test_draft_cache_rows_follow_the_committed_rows(name: str) -> None:
    """After every commit each live row's draft cache holds the longest prefix of its committed
    tokens it had: all but the newest after a rejection, all but the last two after a fully
    accepted draft (the last draft token was never fed); the runner's rows agree and rows that
    finished have left. A copy on the target's cache leaves each target row at its committed
    tokens before the newest."""
    target = target_on(True)
    if name == "draft-random":
        drafter = DraftModelDrafter(tiny_draft(), pruned_vocab=None, copy_ngram=None)
    else:
        drafter = DRAFTERS[name][0](target)
    dec = SpeculativeDecoder(target, drafter, 3)
    proposed: list[int] = []
    seen: list[int] = []
    propose, commit = drafter.propose, drafter.commit

    def spy_propose(ctx: DraftContext, num_tokens: int):  # type: ignore[no-untyped-def]
        draft = propose(ctx, num_tokens)
        proposed.append(draft.num_tokens)
        return draft

    def spy_commit(ctx: DraftContext, num_accepted: list[int]) -> None:
        commit(ctx, num_accepted)
        seen.append(ctx.batch_size)
        lengths = list(ctx.row_lengths())
        assert target.row_lengths() == [n - 1 for n in lengths]
        cache = drafter._cache
        if cache is None:  # share_kv: nothing of its own
            return
        cached = cache.row_lengths()
        assert cached == cache.runner.row_lengths() and len(cached) == ctx.batch_size
        k = proposed[-1]
        for i, (n, a) in enumerate(zip(lengths, num_accepted)):
            assert cached[i] == n - 1 - (a == k)
            assert torch.equal(cache.ids(i), ctx.row(i)[: cached[i]].to(cache.ids(i).device))

    drafter.propose, drafter.commit = spy_propose, spy_commit  # type: ignore[method-assign]
    stop = mid_block_stop(target)
    batch = dec.generate_batch(PROMPTS, MAX_NEW, stop_token_ids=stop)
    assert len(set(seen)) > 1 and seen == sorted(seen, reverse=True)  # rows left at different rounds
    for prompt, row in zip(PROMPTS, batch, strict=True):
        assert row.token_ids[0].tolist() == plain(target, prompt, stop)


@pytest.mark.parametrize("name", ["draft-copying-pruned", "quantized-int4", "quantized-torch-int8"])
def test_sampled_batch_is_seeded(name: str) -> None:
    target = target_on(True)
    drafter = DRAFTERS[name][0](target)

    def run(seed: int) -> list[list[int]]:
        dec = SpeculativeDecoder(target, drafter, 3, SamplingConfig(temperature=1.0, seed=seed))
        batch = dec.generate_batch(PROMPTS, MAX_NEW, stop_token_ids=[])
        assert sum(row.stats.drafted for row in batch) > 0
        return [row.token_ids[0].tolist() for row in batch]

    first = run(5)
    assert all(len(row) == MAX_NEW for row in first)
    assert run(5) == first
    assert run(6) != first


def test_exact_copy_accepts_every_row_sampled() -> None:
    """bits=32: q is p, so every row keeps every draft at temperature 1 too."""
    target = target_on(True)
    dec = SpeculativeDecoder(target, QuantizedDrafter(bits=32, backend="fast"), 3,
                             SamplingConfig(temperature=1.0, seed=2))
    batch = dec.generate_batch(PROMPTS, MAX_NEW, stop_token_ids=[])
    assert all(row.stats.drafted > 0 and row.stats.acceptance_rate == 1.0 for row in batch)
