"""warp(): temperature, top-k, top-p, greedy; SamplingConfig validation; sample()."""

import pytest
import torch

from specdraft.sampling import SamplingConfig, sample, warp


def test_greedy_is_one_hot_argmax() -> None:
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.9]])
    probs = warp(logits, SamplingConfig(temperature=0.0))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_temperature_one_is_softmax() -> None:
    logits = torch.randn(3, 10)
    torch.testing.assert_close(warp(logits, SamplingConfig(temperature=1.0)), logits.softmax(-1))


def test_top_k_keeps_k_tokens() -> None:
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0]])
    probs = warp(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert (probs[0, 2:] == 0).all()
    torch.testing.assert_close(probs[0, :2], logits[0, :2].softmax(-1))


def test_top_p_keeps_smallest_set_reaching_p() -> None:
    probs_in = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    probs = warp(probs_in.log(), SamplingConfig(temperature=1.0, top_p=0.8))
    # 0.5 < 0.8, 0.5 + 0.3 reaches 0.8: the first two tokens stay.
    torch.testing.assert_close(probs, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    top1 = warp(probs_in.log(), SamplingConfig(temperature=1.0, top_p=0.01))
    assert top1.tolist() == [[1.0, 0.0, 0.0, 0.0]]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
    ],
)
def test_bad_settings_raise_clear_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**kwargs)


def test_sample_never_picks_zero_probability_and_matches_distribution() -> None:
    probs = torch.tensor([0.0, 0.2, 0.0, 0.8]).expand(100_000, 4)
    gen = torch.Generator().manual_seed(0)
    draws = sample(probs, gen)
    counts = torch.bincount(draws, minlength=4).double() / len(draws)
    assert counts[0] == 0 and counts[2] == 0
    assert abs(counts[1].item() - 0.2) < 0.01
