"""mix_in_copy: the copy proposal mixed into a drafter's q, on hand-built distributions; the
drafting loop's greedy copies that skip the model."""

from __future__ import annotations

import pytest
import torch

from specdraft.draft_loop import CopySource, draft_autoregressively, mix_in_copy, worth_verifying
from specdraft.protocol import DraftContext
from specdraft.sampling import SamplingConfig


def test_sampled_mixture_is_a_distribution_with_the_copy_weight() -> None:
    q = torch.tensor([[0.5, 0.25, 0.25, 0.0]])
    mixed, tok = mix_in_copy(q.clone(), 3, 0.4, torch.Generator().manual_seed(0))
    torch.testing.assert_close(mixed, torch.tensor([[0.3, 0.15, 0.15, 0.4]]))
    assert tok.shape == (1,) and 0 <= int(tok) < 4


def test_sampled_tokens_follow_the_mixture() -> None:
    q = torch.tensor([[0.8, 0.2, 0.0]])
    gen = torch.Generator().manual_seed(1)
    draws = [int(mix_in_copy(q.clone(), 2, 0.5, gen)[1]) for _ in range(4000)]
    freq = torch.bincount(torch.tensor(draws), minlength=3).float() / len(draws)
    torch.testing.assert_close(freq, torch.tensor([0.4, 0.1, 0.5]), atol=0.03, rtol=0.0)


def test_greedy_copies_from_half_weight_on_and_reports_one_hot() -> None:
    def next_logits(feed: torch.Tensor) -> torch.Tensor:
        return torch.tensor([[0.0, 1.0, 0.0]])  # a greedy draft: one-hot on token 1

    sampling = SamplingConfig()
    ctx = DraftContext(torch.tensor([[0]]), None, sampling, sampling.make_generator())
    draft = draft_autoregressively(next_logits, torch.tensor([[0]]), 1, ctx, copy=CopySource(lambda d: 2, 0.5, 3))
    assert int(draft.token_ids[0, 0]) == 2 and draft.probs[0].tolist() == [[0.0, 0.0, 1.0]]
    draft = draft_autoregressively(next_logits, torch.tensor([[0]]), 1, ctx, copy=CopySource(lambda d: 2, 0.49, 3))
    assert int(draft.token_ids[0, 0]) == 1 and draft.probs[0].tolist() == [[0.0, 1.0, 0.0]]


def test_greedy_copies_skip_the_model_and_are_fed_with_the_next_forward() -> None:
    feeds = []

    def next_logits(feed: torch.Tensor) -> torch.Tensor:
        feeds.append(feed[0].tolist())
        return torch.nn.functional.one_hot(torch.tensor([5]), 8).float()  # the model always says 5

    copies = {0: 3, 1: 4}  # copies for the first two drafted positions, then none
    source = CopySource(lambda drafted: copies.get(len(drafted)), 0.9, 8)
    sampling = SamplingConfig()
    ctx = DraftContext(torch.tensor([[1, 2]]), None, sampling, sampling.make_generator())
    draft = draft_autoregressively(next_logits, torch.tensor([[2]]), 4, ctx, copy=source)
    assert draft.token_ids[0].tolist() == [3, 4, 5, 5]
    assert feeds == [[2, 3, 4], [5]]  # one forward for the committed token and both copies
    assert draft.probs.shape == (1, 4, 8) and draft.probs[0, 1].tolist() == [0, 0, 0, 0, 1, 0, 0, 0]


def test_draft_cache_keeps_the_longest_matching_prefix() -> None:
    """The cache of a drafting model stays the committed tokens' longest cached prefix: a commit
    crops rejected K/V, the newest token is fed again when everything is cached, a different prompt
    starts over; the hidden state is a plain forward's at every step."""
    from specdraft.draft_loop import DraftCache
    from specdraft.models import tiny_random_target

    runner = tiny_random_target(vocab_size=16, seed=2)
    cache = DraftCache(runner)
    cache.reset()

    def plain_last_hidden(ids: list[int]) -> torch.Tensor:  # [1, H] post-norm, no cache
        with torch.inference_mode():
            return runner.model.base_model(input_ids=torch.tensor([ids])).last_hidden_state[:, -1]

    committed = torch.tensor([[1, 2, 3, 4]])
    feed = cache.feed(committed)
    assert feed.tolist() == [[1, 2, 3, 4]]
    torch.testing.assert_close(cache.forward(feed), plain_last_hidden([1, 2, 3, 4]), rtol=1e-4, atol=1e-5)
    cache.forward(torch.tensor([[5]]))  # two drafted tokens enter the cache: 5 (then 6 is drafted)
    assert cache.length == 5 and runner.cache_length == 5
    cache.sync(torch.tensor([[1, 2, 3, 4, 7]]))  # the target rejected 5 and chose 7: commit crops
    assert cache.length == 4 and runner.cache_length == 4
    committed = torch.tensor([[1, 2, 3, 4, 7]])
    feed = cache.feed(committed)
    assert feed.tolist() == [[7]]
    torch.testing.assert_close(cache.forward(feed), plain_last_hidden([1, 2, 3, 4, 7]), rtol=1e-4, atol=1e-5)
    assert cache.feed(committed).tolist() == [[7]] and cache.length == 4  # all cached: the newest again
    assert cache.feed(torch.tensor([[9, 9]])).tolist() == [[9, 9]] and cache.length == 0  # a new prompt


def _left_padded(rows: list[list[int]], pad: int = 0) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([[pad] * (width - len(r)) + r for r in rows])


def test_batched_greedy_copies_skip_the_model_per_row() -> None:
    """B rows draft together: a row that copies takes the copy, not the model's token, but feeds what
    it owes with the forward the other rows need anyway, so no row's unfed tail grows from round to
    round (one wide catch-up forward would be computed for every row); a step in which every row
    copies runs no forward."""
    calls = []

    def next_logits(tokens: torch.Tensor, counts: tuple[int, ...] | None) -> torch.Tensor:
        n = tokens.shape[1]  # each row's real inputs: its last counts[i] columns (the rest is padding)
        calls.append([row[n - c :] for row, c in zip(tokens.tolist(), counts or (n,) * len(tokens))])
        return torch.nn.functional.one_hot(torch.tensor([5, 6]), 8).float()  # row 0 says 5, row 1 says 6

    from specdraft.draft_loop import RowFeed

    copies = {0: 3, 1: 4}  # row 0 copies twice, then follows the model; row 1 never copies
    sources = [CopySource(lambda drafted: copies.get(len(drafted)), 0.9, 8), None]
    sampling = SamplingConfig()
    ctx = DraftContext(_left_padded([[1, 2], [3]]), None, sampling, sampling.make_generator(), lengths=(2, 1))
    draft = draft_autoregressively(next_logits, RowFeed(ctx.token_ids, (2, 1)), 4, ctx, copy=sources)
    assert draft.token_ids.tolist() == [[3, 4, 5, 5], [6, 6, 6, 6]] and draft.lengths is None
    assert calls == [
        [[1, 2], [3]],  # row 0 copies (its token is 3, whatever the model says) and feeds its tokens
        [[3], [6]],
        [[4], [6]],  # row 0's second copy is fed with the forward that gives its first own token
        [[5], [6]],
    ]
    assert draft.probs.shape == (2, 4, 8) and draft.probs[0, 1].tolist() == [0, 0, 0, 0, 1, 0, 0, 0]
    assert draft.probs[1, 0].tolist() == [0, 0, 0, 0, 0, 0, 1, 0]
    calls.clear()
    every = [CopySource(lambda drafted: 7, 1.0, 8)] * 2  # every row copies: the model never runs
    assert draft_autoregressively(next_logits, RowFeed(ctx.token_ids, (2, 1)), 3, ctx, copy=every).token_ids.tolist() \
        == [[7, 7, 7], [7, 7, 7]] and calls == []
    calls.clear()  # the rows all copy at first, then one needs the model: everything owed goes with it
    late = [CopySource(lambda drafted: 7 if len(drafted) < 2 else None, 1.0, 8), CopySource(lambda drafted: 7, 1.0, 8)]
    assert draft_autoregressively(next_logits, RowFeed(ctx.token_ids, (2, 1)), 3, ctx, copy=late).token_ids.tolist() \
        == [[7, 7, 5], [7, 7, 7]] and calls == [[[1, 2, 7, 7], [3, 7, 7]]]


def test_batched_sampled_copies_mix_per_row_and_are_seeded() -> None:
    def next_logits(tokens: torch.Tensor, counts: tuple[int, ...] | None) -> torch.Tensor:
        return torch.zeros((tokens.shape[0], 4))  # q uniform over 4 tokens

    sampling = SamplingConfig(temperature=1.0, seed=3)
    ctx = DraftContext(torch.tensor([[1], [2]]), None, sampling, sampling.make_generator())
    sources = [CopySource(lambda drafted: 3, 0.5, 4), None]
    draft = draft_autoregressively(next_logits, torch.tensor([[1], [2]]), 2, ctx, copy=sources)
    torch.testing.assert_close(draft.probs[0, 0], torch.tensor([0.125, 0.125, 0.125, 0.625]))
    torch.testing.assert_close(draft.probs[1, 0], torch.full((4,), 0.25))
    ctx2 = DraftContext(torch.tensor([[1], [2]]), None, sampling, sampling.make_generator())
    again = draft_autoregressively(next_logits, torch.tensor([[1], [2]]), 2, ctx2, copy=sources)
    assert again.token_ids.tolist() == draft.token_ids.tolist()


def test_draft_cache_rows_keep_their_own_prefixes() -> None:
    """A batch: every row of the drafting model's cache keeps its own longest prefix of its
    committed tokens, is fed only what it misses (right aligned, padded) and matches a plain forward
    of its tokens; rows that finish leave, and the last row goes on at batch size 1."""
    from specdraft.draft_loop import DraftCache, RowFeed
    from specdraft.models import tiny_random_target

    runner = tiny_random_target(vocab_size=16, seed=2)
    cache = DraftCache(runner)
    cache.reset()
    sampling = SamplingConfig()

    def ctx_of(rows: list[list[int]]) -> DraftContext:
        lengths = tuple(len(r) for r in rows)
        return DraftContext(_left_padded(rows, pad=15), None, sampling, sampling.make_generator(),
                            lengths=None if len(set(lengths)) == 1 else lengths)

    def check_hidden(hidden: torch.Tensor, rows: list[list[int]]) -> None:
        for h, ids in zip(hidden, rows):
            with torch.inference_mode():
                plain = runner.model.base_model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
            torch.testing.assert_close(h, plain, rtol=1e-4, atol=1e-5)

    rows = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    feed = cache.feed(ctx_of(rows))
    assert isinstance(feed, RowFeed) and feed.counts == (4, 2, 3)
    check_hidden(cache.forward(feed.tokens, feed.counts), rows)
    assert cache.row_lengths() == runner.row_lengths() == [4, 2, 3]
    cache.forward(torch.tensor([[10], [11], [12]]))  # a drafted token per row enters the cache
    assert cache.row_lengths() == runner.row_lengths() == [5, 3, 4]
    # row 0 kept 10 and got 13, row 1's 11 was rejected for 14, row 2 kept 12 and got a bonus 15
    rows = [[1, 2, 3, 4, 10, 13], [5, 6, 14], [7, 8, 9, 12, 15]]
    cache.sync(ctx_of(rows))
    assert cache.row_lengths() == runner.row_lengths() == [5, 2, 4]
    assert [cache.ids(i).tolist() for i in range(3)] == [r[:n] for r, n in zip(rows, [5, 2, 4])]
    feed = cache.feed(ctx_of(rows))
    assert feed.tokens.tolist() == [[13], [14], [15]] and feed.counts is None
    check_hidden(cache.forward(feed.tokens, feed.counts), rows)
    feed = cache.feed(ctx_of(rows))  # all cached: every row's newest is fed again
    assert feed.tokens.tolist() == [[13], [14], [15]] and cache.row_lengths() == [5, 2, 4]
    cache.keep_rows([2, 0])  # row 1 finished
    assert cache.row_lengths() == runner.row_lengths() == [4, 5]
    rows = [rows[2], rows[0]]
    feed = cache.feed(ctx_of(rows))
    check_hidden(cache.forward(feed.tokens, feed.counts), rows)
    cache.keep_rows([1])  # one row left: the batch-size-1 path
    feed = cache.feed(torch.tensor([rows[1]]))
    assert feed.tolist() == [[13]] and cache.row_lengths() == runner.row_lengths() == [5]
    check_hidden(cache.forward(feed), [rows[1]])


def scripted_logits(steps: list[list[list[float]]]):  # noqa: ANN201 - a next_logits callable
    """next_logits returning the log of steps[i] (one [B, V] distribution per call) at call i."""
    calls = []

    def next_logits(feed: torch.Tensor, counts: object = None) -> torch.Tensor:
        calls.append(feed.shape)
        return torch.tensor(steps[len(calls) - 1]).log()

    return next_logits, calls


def test_an_unsure_token_ends_the_draft_after_it() -> None:
    """Greedy draft probabilities 0.9, 0.4, 0.9: with stop_below=0.5 the draft is the first two tokens
    (the unsure one included, as transformers' confidence criterion does) and the model runs twice;
    without it all three. Sampled: the drawn token's q decides (0.6 goes on, 0.4 stops)."""
    steps = [[[0.9, 0.1, 0.0]], [[0.4, 0.25, 0.35]], [[0.0, 0.9, 0.1]]]
    greedy = SamplingConfig()
    ctx = DraftContext(torch.tensor([[0]]), None, greedy, greedy.make_generator())
    logits, calls = scripted_logits(steps)
    draft = draft_autoregressively(logits, torch.tensor([[0]]), 3, ctx, stop_below=0.5)
    assert draft.token_ids[0].tolist() == [0, 0] and len(calls) == 2 and draft.probs.shape == (1, 2, 3)
    logits, calls = scripted_logits(steps)
    assert draft_autoregressively(logits, torch.tensor([[0]]), 3, ctx).token_ids[0].tolist() == [0, 0, 1]
    sampled = SamplingConfig(temperature=1.0)
    lengths = set()
    for seed in range(40):
        ctx = DraftContext(torch.tensor([[0]]), None, sampled, torch.Generator().manual_seed(seed))
        logits, _ = scripted_logits([[[0.6, 0.4, 0.0]]] * 3)
        draft = draft_autoregressively(logits, torch.tensor([[0]]), 3, ctx, stop_below=0.5)
        ids = draft.token_ids[0].tolist()
        assert all(t == 0 for t in ids[:-1]) and (ids[-1] == 1 or len(ids) == 3)  # stops right after a 1
        lengths.add(len(ids))
    assert lengths == {1, 2, 3}


def test_batch_rows_end_their_drafts_on_their_own() -> None:
    """Row 0 is unsure at its second token, row 1 never: lengths [2, 3]; when every row is unsure by
    the second step the loop ends there."""
    sure, unsure = [0.9, 0.1, 0.0], [0.4, 0.25, 0.35]
    greedy = SamplingConfig()
    ctx = DraftContext(torch.tensor([[0], [1]]), None, greedy, greedy.make_generator())
    logits, calls = scripted_logits([[sure, sure], [unsure, sure], [sure, sure]])
    draft = draft_autoregressively(logits, torch.tensor([[0], [1]]), 3, ctx, stop_below=0.5)
    assert draft.num_tokens == 3 and draft.lengths.tolist() == [2, 3] and len(calls) == 3
    logits, calls = scripted_logits([[sure, unsure], [unsure, sure], [sure, sure]])
    draft = draft_autoregressively(logits, torch.tensor([[0], [1]]), 3, ctx, stop_below=0.5)
    assert draft.num_tokens == 2 and draft.lengths.tolist() == [2, 1] and len(calls) == 2


def test_siblings_make_a_tree_of_the_models_runner_up_tokens() -> None:
    """Greedy, siblings=1: every position the model ran for gets its next-best token as a leaf beside the
    drafted one (no extra model call); a greedy copy has none; at temperature > 0 it is a clear error."""
    steps = [[[0.1, 0.6, 0.3, 0.0]], [[0.5, 0.1, 0.0, 0.4]]]
    greedy = SamplingConfig()
    ctx = DraftContext(torch.tensor([[0]]), None, greedy, greedy.make_generator())
    logits, calls = scripted_logits(steps)
    draft = draft_autoregressively(logits, torch.tensor([[0]]), 2, ctx, siblings=1)
    assert draft.token_ids[0].tolist() == [1, 2, 0, 3] and draft.parents[0].tolist() == [-1, -1, 0, 0]
    assert len(calls) == 2
    logits, _ = scripted_logits(steps)
    chain = draft_autoregressively(logits, torch.tensor([[0]]), 2, ctx)
    assert chain.parents is None and chain.token_ids[0].tolist() == [1, 0]
    copy = CopySource(lambda drafted: 3 if not drafted else None, 0.9, 4)  # position 1 is a greedy copy
    logits, calls = scripted_logits([[[0.5, 0.1, 0.0, 0.4]]])
    draft = draft_autoregressively(logits, torch.tensor([[0]]), 2, ctx, copy=copy, siblings=2)
    assert draft.token_ids[0].tolist() == [3, 0, 3, 1] and draft.parents[0].tolist() == [-1, 0, 0, 0]
    sampled = SamplingConfig(temperature=1.0)
    ctx = DraftContext(torch.tensor([[0]]), None, sampled, sampled.make_generator())
    with pytest.raises(ValueError, match="siblings=1 needs greedy"):
        draft_autoregressively(scripted_logits(steps)[0], torch.tensor([[0]]), 2, ctx, siblings=1)


def test_siblings_are_kept_as_far_as_the_verify_cost_curve_pays() -> None:
    """A sibling's chance is the draft's probability of the chain before it times its own; the chain's
    positions are verified anyway, and the best siblings are added while expected tokens per verify
    time grow (specdraft.costs.nodes_worth_verifying with the chain fixed)."""
    others = [[(5, 0.3)], [(6, 0.2)]]  # beside chain positions 0 and 1: chances 0.3 and 0.6 * 0.2
    sure_of = [0.6, 0.5]
    assert worth_verifying(others, sure_of, None) == [[5], [6]]  # no curve: every sibling
    assert worth_verifying(others, sure_of, [1.0] * 6) == [[5], [6]]  # free positions
    assert worth_verifying(others, sure_of, [1.0, 1.0, 1.0, 1.1, 3.0]) == [[5], []]  # 2.2 / 1.1 > 1.9 > 2.32 / 3
    assert worth_verifying(others, sure_of, [1.0, 1.0, 1.0, 5.0, 5.0]) == [[], []]
    assert worth_verifying(others, sure_of, [1.0, 1.0, 1.0]) == [[], []]  # the curve ends at the chain


def test_a_steep_curve_leaves_the_chain_alone() -> None:
    """With siblings on and verify positions past the chain too dear, the draft is the plain chain (q kept)."""
    steps = [[[0.1, 0.6, 0.3, 0.0]], [[0.5, 0.1, 0.0, 0.4]]]
    greedy = SamplingConfig()
    ctx = DraftContext(torch.tensor([[0]]), None, greedy, greedy.make_generator())
    logits, _ = scripted_logits(steps)
    draft = draft_autoregressively(logits, torch.tensor([[0]]), 2, ctx, siblings=1, curve=[1.0, 1.0, 1.0, 9.0, 9.0])
    assert draft.parents is None and draft.token_ids[0].tolist() == [1, 0] and draft.probs is not None
