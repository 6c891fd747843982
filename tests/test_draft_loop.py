"""mix_in_copy: the copy proposal mixed into a drafter's q, on hand-built distributions."""

from __future__ import annotations

import torch

from specdraft.draft_loop import mix_in_copy


def test_sampled_mixture_is_a_distribution_with_the_copy_weight() -> None:
    q = torch.tensor([[0.5, 0.25, 0.25, 0.0]])
    mixed, tok = mix_in_copy(q.clone(), 3, 0.4, False, torch.Generator().manual_seed(0))
    torch.testing.assert_close(mixed, torch.tensor([[0.3, 0.15, 0.15, 0.4]]))
    assert tok.shape == (1,) and 0 <= int(tok) < 4


def test_sampled_tokens_follow_the_mixture() -> None:
    q = torch.tensor([[0.8, 0.2, 0.0]])
    gen = torch.Generator().manual_seed(1)
    draws = [int(mix_in_copy(q.clone(), 2, 0.5, False, gen)[1]) for _ in range(4000)]
    freq = torch.bincount(torch.tensor(draws), minlength=3).float() / len(draws)
    torch.testing.assert_close(freq, torch.tensor([0.4, 0.1, 0.5]), atol=0.03, rtol=0.0)


def test_greedy_copies_from_half_weight_on_and_reports_one_hot() -> None:
    q = torch.tensor([[0.0, 1.0, 0.0]])  # a greedy draft: one-hot on token 1
    gen = torch.Generator()
    mixed, tok = mix_in_copy(q.clone(), 2, 0.5, True, gen)
    assert int(tok) == 2 and mixed.tolist() == [[0.0, 0.0, 1.0]]
    mixed, tok = mix_in_copy(q.clone(), 2, 0.49, True, gen)
    assert int(tok) == 1 and mixed.tolist() == [[0.0, 1.0, 0.0]]
