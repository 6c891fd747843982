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
