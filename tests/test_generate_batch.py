"""`SpeculativeDecoder.generate_batch`: every row of a batch is exactly its prompt's batch-1 greedy
output (ragged prompts, ragged drafts, rows stopping mid-block at different rounds, budgets ending
mid-block), sampled rows are lossless at batch 4 (with a negative control), and the batch-aware
cost model stops drafting where verification is compute bound. Each drafter's own batch tests live
with its other tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import pytest
import torch

from specdraft.check.broken import always_accept
from specdraft.decode import SpeculativeDecoder
from specdraft.draft_length import CostModelDraftLength, make_draft_length_policy
from specdraft.models import tiny_random_llama, tiny_random_target
from specdraft.protocol import Draft, DraftContext
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel
from tests.helpers import RecomputeDrafter, exact_two_token_distribution, plain_greedy, pooled_chisquare

GREEDY = SamplingConfig(temperature=0.0)
PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 7], [3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]]


class ReferenceDrafter:
    """Drafts each row's true greedy continuation, cut to a row-dependent length and corrupted at
    some positions: rows draft different numbers of tokens and accept different numbers."""

    needs_target_hidden: ClassVar[bool] = False
    feature_layers: tuple[int, ...] = ()
    draft_sources: tuple[str, ...] = ()
    hf_counterpart: ClassVar[str | None] = None
    verify_curve_tokens: int = 0
    sizes_own_drafts: ClassVar[bool] = False
    batched: ClassVar[bool] = True

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], vocab: int) -> None:
        self.continuations = continuations  # prompt -> its greedy continuation
        self.vocab = vocab
        self.rounds = 0

    def bind(self, target: TargetModel) -> None: ...
    def reset(self) -> None:
        self.rounds = 0

    def commit(self, ctx: DraftContext, num_accepted: Sequence[int]) -> None: ...
    def keep_rows(self, rows: Sequence[int]) -> None: ...
    def learn(self, token_ids: torch.Tensor, prompt_len: int) -> dict: return {}

    def source_of(self, ctx: DraftContext) -> list[int]:
        """One source."""
        return [0] * ctx.batch_size

    def propose(self, ctx: DraftContext, num_tokens: int) -> Draft:
        self.rounds += 1
        rows = []
        for i in range(ctx.batch_size):
            row = ctx.row(i).tolist()
            prompt, cont = next((p, c) for p, c in self.continuations.items() if tuple(row[: len(p)]) == p)
            done = len(row) - len(prompt)
            toks = cont[done : done + max(0, num_tokens - (len(row) + self.rounds) % 3)]
            rows.append([(t + 1) % self.vocab if (len(row) + j + self.rounds) % 5 == 0 else t
                         for j, t in enumerate(toks)])
        k = max(len(r) for r in rows)
        ids = torch.tensor([r + [0] * (k - len(r)) for r in rows], dtype=torch.long).reshape(len(rows), k)
        return Draft(token_ids=ids, lengths=torch.tensor([len(r) for r in rows]))


def late_stop_token(continuations: list[list[int]], row: int, earliest: int, budget: int) -> int:
    """A stop token that `row` first emits at an index in [earliest, budget) and the other rows as
    late as possible: a stop token the tiny model emits everywhere early would end the batch in
    one round."""
    def first(seq: list[int], tok: int) -> int:
        return seq.index(tok) if tok in seq else len(seq)

    own = [t for t in set(continuations[row]) if earliest <= first(continuations[row], t) < budget]
    return max(own, key=lambda t: min(first(c, t) for c in continuations))


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_every_row_equals_its_batch1_greedy_output(fast: bool, k: int) -> None:
    target = tiny_random_target(vocab_size=16, seed=1, fast=fast)
    conts = {tuple(p): plain_greedy(target, p, 40) for p in PROMPTS}
    stop = late_stop_token([conts[tuple(p)] for p in PROMPTS], row=2, earliest=9, budget=23)  # rows stop at different rounds
    dec = SpeculativeDecoder(target, ReferenceDrafter(conts, 16), k)
    out = dec.generate_batch(PROMPTS, 23, stop_token_ids=[stop])  # 23: budgets end mid-block
    assert len(out) == len(PROMPTS) and out.stats.batch_size == len(PROMPTS)
    assert len({len(r.token_ids[0]) for r in out}) > 1 and len(out.stats.live_rows_per_round) >= 4
    for p, row in zip(PROMPTS, out):
        want = plain_greedy(target, p, 23, [stop])
        assert row.token_ids[0].tolist() == want
        assert row.token_ids[0].tolist() == dec.generate(p, 23, stop_token_ids=[stop]).token_ids[0].tolist()
    assert sum(r.stats.accepted for r in out) > 0 and max(out.stats.live_rows_per_round) == len(PROMPTS)
    assert min(out.stats.live_rows_per_round) < len(PROMPTS)  # finished rows left the batch
    assert out.stats.new_tokens == sum(r.stats.new_tokens for r in out) == sum(len(r.token_ids[0]) for r in out)


class RecordingPolicy:
    """A fixed K that records what the decoder tells it after every row's round."""

    def __init__(self, k: int) -> None:
        self.k, self.seen = k, []

    def choose(self, k_max: int, batch_size: int = 1, sources: Sequence[int] | None = None) -> int:
        return min(self.k, k_max)

    def observe(self, num_drafted: int, num_accepted: int, num_offered: int | None = None, source: int = 0) -> None:
        self.seen.append((num_drafted, num_accepted, num_offered))


def test_a_batch_row_drafting_fewer_than_k_is_observed_with_the_k_it_was_offered() -> None:
    """In a batch the cost model must see a row's shortfall (else a drafter that often finds nothing,
    like n-gram, looks better at b > 1 than it is): each row reports what it drafted and the round's
    K; at batch 1 a shorter draft is a shorter forward and is observed as drafted, with no offer."""
    target = tiny_random_target(vocab_size=16, seed=1)
    conts = {tuple(p): plain_greedy(target, p, 40) for p in PROMPTS}
    for prompts in (PROMPTS, PROMPTS[:1]):
        dec = SpeculativeDecoder(target, ReferenceDrafter(conts, 16), 4)
        policy = RecordingPolicy(4)
        dec._policy = lambda sampling, batch_size=1: policy  # the test's spy in place of the cost model
        out = dec.generate_batch(prompts, 20, stop_token_ids=[])
        assert all(a <= d for d, a, _ in policy.seen)
        assert sum(r.stats.drafted for r in out) == sum(d for d, _, _ in policy.seen)
        offers = [o for _, _, o in policy.seen]
        if len(prompts) > 1:
            batch_rows = [(d, o) for d, _, o in policy.seen if o is not None]  # None: one row was left
            assert max(o for _, o in batch_rows) == 4 and all(d <= o for d, o in batch_rows)
            assert any(d < o for d, o in batch_rows)  # shortfalls happened and were reported
        else:
            assert offers == [None] * len(offers)


def test_a_shortfall_counts_as_a_rejection_where_the_draft_ended() -> None:
    """A batch row that drafted 1 of the 4 it was offered and had it accepted teaches the cost model
    what a row that drafted 4 and had 1 accepted does (its round emitted as much)."""
    curve = [1.0] * 9
    short = make_draft_length_policy("auto", 8, curve, 0.0)
    full = make_draft_length_policy("auto", 8, curve, 0.0)
    assert isinstance(short, CostModelDraftLength) and isinstance(full, CostModelDraftLength)
    for _ in range(10):
        short.observe(1, 1, 4)
        full.observe(4, 1)
    assert short.acceptance() == pytest.approx(full.acceptance())
    assert short.fill() == pytest.approx(1 - 0.75 * (1 - 0.95**10))


def test_model_drafter_batch_matches_batch1_and_auto_runs() -> None:
    target = tiny_random_target(vocab_size=16, seed=1)
    drafter = RecomputeDrafter(tiny_random_llama(vocab_size=16, seed=7, init_std=0.3))
    dec = SpeculativeDecoder(target, drafter, "auto", verify_curve=[1.0] * 9, draft_cost=0.05)
    out = dec.generate_batch(PROMPTS, 17, stop_token_ids=[])
    for p, row in zip(PROMPTS, out):
        assert row.token_ids[0].tolist() == plain_greedy(target, p, 17)
    ar = SpeculativeDecoder(target).generate_batch(PROMPTS, 17, stop_token_ids=[])  # plain batched decoding
    assert [r.token_ids[0].tolist() for r in ar] == [r.token_ids[0].tolist() for r in out]
    assert all(k == 0 for k in ar.stats.drafted_per_round) and ar.stats.rounds == 17


BATCH_N = 600  # batches of 4: 600 samples of each row's first two tokens


def batch_pvalue(target: TargetModel, dec: SpeculativeDecoder, prompts: list[list[int]]) -> float:
    """Chi-square of the first two tokens of every row of BATCH_N seeded batches against each
    row's exactly enumerated law (the rows' cells side by side, each row weighted 1/B)."""
    vocab = target.vocab_size
    counts = np.zeros((len(prompts), vocab * vocab))
    for seed in range(BATCH_N):
        out = dec.generate_batch(prompts, 2, stop_token_ids=[], sampling=dec.sampling.with_seed(seed))
        for i, row in enumerate(out):
            a, b = row.token_ids[0].tolist()
            counts[i, a * vocab + b] += 1
    expected = np.stack([exact_two_token_distribution(target, p, dec.sampling) for p in prompts]) / len(prompts)
    return pooled_chisquare(counts.ravel(), expected.ravel())


def test_sampled_batch_of_four_is_lossless_and_a_broken_verifier_is_caught() -> None:
    target = tiny_random_target(vocab_size=16, seed=1)
    prompts = [[1, 2, 3, 1, 2], [4, 5], [6, 1, 6, 1, 6, 1], [2, 9, 3]]  # ragged
    sampling = SamplingConfig(temperature=1.0)
    draft_model = tiny_random_llama(vocab_size=16, seed=7, init_std=0.3)
    good = SpeculativeDecoder(target, RecomputeDrafter(draft_model), 2, sampling)
    assert batch_pvalue(target, good, prompts) > 1e-4
    bad = SpeculativeDecoder(target, RecomputeDrafter(draft_model), 2, sampling, sampler=always_accept)
    assert batch_pvalue(target, bad, prompts) < 1e-6


def test_cost_model_stops_drafting_where_verification_is_compute_bound() -> None:
    flat = [1.0 + 0.02 * k for k in range(9)]  # batch 1: memory bound, k extra positions nearly free
    steep = [1.0 + k for k in range(9)]  # batch 16: compute bound, every extra position costs a step
    policy = make_draft_length_policy("auto", 8, flat, 0.02, batch_curves={16: steep})
    assert isinstance(policy, CostModelDraftLength)
    for _ in range(40):  # a good drafter: its first two tokens always accepted, then half the time
        policy.observe(4, 2)
        policy.observe(4, 3)
    assert policy.choose(8, batch_size=1) >= 3
    assert policy.choose(8, batch_size=16) == 0
    assert policy.choose(8, batch_size=9) == 0  # a batch reads the next measured batch size's curve
    assert policy.choose(8, batch_size=64) == 0  # beyond the largest: the largest
    # a drafter that is cheap at batch 1 but costs a whole target step per token at batch 8 (its
    # product does not amortise), on a verify curve that stays flat there: no drafting at 8 either
    costly = make_draft_length_policy("auto", 8, flat, 0.02, batch_curves={8: flat}, batch_draft_costs={8: 1.0})
    for _ in range(40):
        costly.observe(4, 2)
        costly.observe(4, 3)
    assert costly.choose(8, batch_size=1) >= 3 and costly.choose(8, batch_size=8) == 0


def test_cost_model_reads_a_packing_targets_cost_at_the_drafted_fill() -> None:
    """A quarter of a batch's rows draft (and are accepted), the rest find nothing: on a padded
    target every row pays for K positions and drafting does not pay; a target that packs the ragged
    batch pays for the drafted quarter only, so the same observations choose K > 0 there."""
    flat = [1.0 + 0.02 * k for k in range(9)]
    steep = [1.0 + 0.4 * k for k in range(9)]  # batch 16: each position of every row costs 0.4 of a step
    policies = {packs: make_draft_length_policy("auto", 8, flat, 0.0, batch_curves={16: steep}, packs_ragged=packs)
                for packs in (False, True)}
    for policy in policies.values():
        assert isinstance(policy, CostModelDraftLength)
        for _ in range(40):
            for row in range(16):
                drafts = row % 4 == 0
                policy.observe(4 if drafts else 0, 4 if drafts else 0, 4)
    padded, packed = policies[False], policies[True]
    assert isinstance(padded, CostModelDraftLength) and isinstance(packed, CostModelDraftLength)
    assert 0.15 < packed.fill() < 0.35
    assert padded.acceptance()[0] == pytest.approx(packed.acceptance()[0])  # shortfalls count as rejections
    assert padded.choose(8, batch_size=16) == 0
    assert packed.choose(8, batch_size=16) > 0
    assert packed.verify_cost(4, 16) < padded.verify_cost(4, 16)
    assert packed.verify_cost(4, 1) == padded.verify_cost(4, 1)  # alone, a shorter draft is already cheaper


def test_bad_batches_are_named() -> None:
    target = tiny_random_target(vocab_size=16, seed=1)
    dec = SpeculativeDecoder(target)
    with pytest.raises(ValueError, match="non-empty list"):
        dec.generate_batch([], 4)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        dec.generate_batch([[1, 2], []], 4)
    with pytest.raises(ValueError, match=r"prompt 0's token ids"):
        dec.generate_batch([[1, 99], [2]], 4)

    class OneAtATime(RecomputeDrafter):
        batched: ClassVar[bool] = False

    single = SpeculativeDecoder(target, OneAtATime(tiny_random_llama(vocab_size=16)), 2)
    with pytest.raises(ValueError, match="one sequence at a time"):
        single.generate_batch([[1, 2], [3]], 4)
    assert single.generate_batch([[1, 2]], 4)[0].token_ids.shape == (1, 4)  # a batch of one is fine
