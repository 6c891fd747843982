"""The n-gram (prompt lookup) matcher on hand-written token arrays; batched decoding equals
decoding one prompt at a time (the batch helpers here are shared with the other drafters' tests)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
import torch

from drafters.ngram import NGramDrafter, NGramIndex, ngram_propose
from specdraft.decode import BatchResult, GenerationResult, SpeculativeDecoder
from specdraft.models import tiny_random_target
from specdraft.protocol import DraftContext
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel


def test_no_match_proposes_nothing() -> None:
    assert ngram_propose([1, 2, 3, 4], 5, 1, 3) == []


def test_longest_ngram_wins() -> None:
    # suffix [7, 8]: the 2-gram occurs once (followed by 1); the 1-gram 8 occurs later (followed by 9).
    toks = [7, 8, 1, 5, 8, 9, 4, 7, 8]
    assert ngram_propose(toks, 1, 1, 2) == [1]
    assert ngram_propose(toks, 1, 1, 1) == [9]


def test_most_recent_occurrence_wins() -> None:
    toks = [5, 1, 5, 2, 5]
    assert ngram_propose(toks, 1, 1, 1) == [2]


def test_truncated_to_k_and_to_end_of_context() -> None:
    toks = [1, 2, 3, 4, 5, 6, 1, 2]
    assert ngram_propose(toks, 3, 1, 2) == [3, 4, 5]
    assert ngram_propose(toks, 100, 1, 2) == [3, 4, 5, 6, 1, 2]
    # the match right before the suffix can only propose what exists
    assert ngram_propose([4, 4], 5, 1, 1) == [4]


def test_min_ngram_respected() -> None:
    assert ngram_propose([3, 9, 1, 3], 2, 2, 3) == []
    assert ngram_propose([3, 9, 1, 3], 2, 1, 3) == [9, 1]


def test_incremental_index_equals_rebuilding() -> None:
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(0, 6, (300,), generator=g).tolist()
    index = NGramIndex(1, 3)
    pos = 0
    while pos < len(toks):
        step = int(torch.randint(1, 5, (1,), generator=g))
        index.extend(toks[pos : pos + step])
        pos += step
        assert index.propose(4) == ngram_propose(toks[:pos], 4, 1, 3)


def test_drafter_is_incremental_and_fast_on_long_contexts() -> None:
    drafter = NGramDrafter(1, 4)
    ctx_tokens = torch.randint(0, 50, (1, 8000), generator=torch.Generator().manual_seed(1))
    cfg = SamplingConfig()
    gen = cfg.make_generator()
    drafter.propose(DraftContext(ctx_tokens[:, :7000], None, cfg, gen), 5)  # index the prompt once
    t0 = time.perf_counter()
    for t in range(7001, 7201):
        ctx = DraftContext(ctx_tokens[:, :t], None, cfg, gen)
        drafter.commit(ctx, [0])
        drafter.propose(ctx, 5)
    per_round = (time.perf_counter() - t0) / 200
    # Generous bound (shared CI machine): incremental work per round is a handful of dict ops,
    # a rescan of 7000 positions in Python would take milliseconds.
    assert per_round < 2e-3
    drafter.reset()
    assert drafter.propose(DraftContext(ctx_tokens[:, :3], None, cfg, gen), 5).num_tokens <= 2


def test_next_token_equals_propose_on_the_indexed_tokens() -> None:
    g = torch.Generator().manual_seed(2)
    toks = torch.randint(0, 5, (120,), generator=g).tolist()
    index = NGramIndex(2, 4)
    index.extend(toks)
    first = ngram_propose(toks, 1, 2, 4)
    assert index.next_token(toks) == (first[0] if first else None)


def test_next_token_follows_a_suffix_past_the_indexed_tokens() -> None:
    index = NGramIndex(2, 3)
    index.extend([7, 1, 2, 3, 4, 9, 1])
    # drafted [2, 3] after the indexed 1: suffix [1, 2, 3] occurred before, followed by 4
    assert index.next_token([9, 1, 2, 3]) == 4
    assert index.next_token([9, 1, 2]) == 3
    assert index.next_token([5, 6]) is None
    assert index.next_token([3]) is None  # shorter than min_ngram


# ------------------------------------------------------------------------------- batches
# Prompts of different lengths (one of a single token), repetitive so copying drafters find matches.
BATCH_PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 4, 5, 4], [7], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]]
BATCH_NEW = 13  # not a multiple of the draft lengths the tests use (4, and "auto" up to 6)


def flat_verify_costs(target: TargetModel, max_k: int = 32) -> TargetModel:
    """Verification as cheap for max_k tokens as for none at every batch-size bucket the tests
    reach, so "auto" and self-sizing drafters never time anything (tokens stay machine-independent)."""
    target.verify_costs = {b: [1.0] * (max_k + 1) for b in (1, 2, 4)}
    return target


def auto_decoder(target: TargetModel, drafter: object, max_draft_tokens: int = 6) -> SpeculativeDecoder:
    """num_draft_tokens="auto" with given costs: no measurement."""
    return SpeculativeDecoder(target, drafter, num_draft_tokens="auto", max_draft_tokens=max_draft_tokens,
                              verify_curve=[1.0] * (max_draft_tokens + 1), draft_cost=0.1)


def stopped_mid_round(row: GenerationResult, stop: Sequence[int]) -> bool:
    """The row ended on a stop token that cut a round's emitted tokens short."""
    tokens = row.token_ids[0].tolist()
    return bool(tokens) and tokens[-1] in stop and row.stats.new_tokens < row.stats.accepted + row.stats.rounds


def batch_equals_one_by_one(dec: SpeculativeDecoder, prompts: list[list[int]], max_new_tokens: int,
                            stop: Sequence[int]) -> BatchResult:
    """generate_batch gives every row exactly generate(prompt)'s tokens (greedy); returns the batch."""
    batch = dec.generate_batch(prompts, max_new_tokens, stop_token_ids=stop)
    assert len(batch) == len(prompts)
    for prompt, row in zip(prompts, batch):
        alone = dec.generate(prompt, max_new_tokens, stop_token_ids=stop)
        assert row.token_ids[0].tolist() == alone.token_ids[0].tolist(), (prompt, stop)
    return batch


def check_batches(dec: SpeculativeDecoder, prompts: list[list[int]] = BATCH_PROMPTS,
                  max_new_tokens: int = BATCH_NEW) -> list[BatchResult]:
    """Batch == one by one without stop tokens, and with a stop token that ends some row in the
    middle of a round (the first of the generated tokens that does); drafts were accepted."""
    free = batch_equals_one_by_one(dec, prompts, max_new_tokens, [])
    assert all(row.stats.new_tokens == max_new_tokens for row in free)
    assert any(row.stats.accepted > 0 for row in free), "no draft accepted: the test would be vacuous"
    for tok in dict.fromkeys(t for row in free for t in row.token_ids[0, 1:].tolist()):
        if any(stopped_mid_round(row, [tok]) for row in dec.generate_batch(prompts, max_new_tokens, stop_token_ids=[tok])):
            return [free, batch_equals_one_by_one(dec, prompts, max_new_tokens, [tok])]
    raise AssertionError("no stop token ends a row in the middle of a round: the stop case is not covered")


@pytest.mark.parametrize("k", [4, "auto"])
def test_batch_equals_one_by_one(k: int | str) -> None:
    target = flat_verify_costs(tiny_random_target(vocab_size=16, seed=9))  # a seed whose outputs repeat
    drafter = NGramDrafter(1, 3)
    dec = SpeculativeDecoder(target, drafter, num_draft_tokens=k) if k != "auto" else auto_decoder(target, drafter)
    check_batches(dec)


def test_batch_proposals_are_per_row_and_padded() -> None:
    drafter = NGramDrafter(1, 2)
    cfg = SamplingConfig()
    gen = cfg.make_generator()
    # row 0: [9, 1, 2, 3, 1, 2] -> suffix [1, 2] followed by 3, 1, 2; row 1 (left padded): [5, 6] no match
    tokens = torch.tensor([[9, 1, 2, 3, 1, 2], [0, 0, 0, 0, 5, 6]])
    ctx = DraftContext(tokens, None, cfg, gen, lengths=(6, 2))
    draft = drafter.propose(ctx, 4)
    assert draft.token_ids[0].tolist() == [3, 1, 2] and draft.lengths.tolist() == [3, 0]
    assert draft.token_ids.shape == (2, 3)
    # row 1 commits [5, 6, 5]: its own index finds 5 -> 6; row 0 commits nothing new
    tokens = torch.tensor([[9, 1, 2, 3, 1, 2], [0, 0, 0, 5, 6, 5]])
    ctx = DraftContext(tokens, None, cfg, gen, lengths=(6, 3))
    drafter.commit(ctx, [0, 0])
    draft = drafter.propose(ctx, 1)
    assert draft.token_ids.tolist() == [[3], [6]] and draft.lengths is None  # every row has 1
    drafter.keep_rows([1])  # row 0 finished: row 1 goes on alone, with its index
    ctx = DraftContext(tokens[1:, 3:], None, cfg, gen)
    assert drafter.propose(ctx, 2).token_ids.tolist() == [[6, 5]]
    drafter.reset()
    assert drafter.propose(DraftContext(torch.tensor([[1, 2]]), None, cfg, gen), 2).num_tokens == 0
