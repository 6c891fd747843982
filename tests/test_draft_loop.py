"""mix_in_copy: the copy proposal mixed into a drafter's q, on hand-built distributions; the
drafting loop's greedy copies that skip the model."""

from __future__ import annotations

import torch

from specdraft.draft_loop import CopySource, draft_autoregressively, mix_in_copy
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
