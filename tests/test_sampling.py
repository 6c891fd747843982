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
        ({"temperature": "abc"}, "sampling.temperature must be a number, got 'abc'"),
        ({"top_k": 2.5}, "sampling.top_k must be an integer, got 2.5"),
        ({"seed": None}, "sampling.seed must be an integer"),
        ({"top_p": True}, "sampling.top_p must be a number"),
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


@pytest.mark.parametrize("temperature", [1e-6, 1e-40, 5e-324])
def test_tiny_temperatures_put_all_mass_on_the_top_logit(temperature: float) -> None:
    logits = torch.tensor([[1.0, 3.0, -2.0, 2.999], [50.0, -50.0, 0.0, 49.0]])
    probs = warp(logits, SamplingConfig(temperature=temperature, top_p=0.9))
    assert not probs.isnan().any()
    if temperature < 1e-3:  # 1e-3 apart is a factor e^(1e-3 / T) in probability
        assert probs.argmax(-1).tolist() == [1, 0] and probs.max(-1).values.tolist() == [1.0, 1.0]
    gen = torch.Generator().manual_seed(0)
    assert sample(probs, gen).tolist() == [1, 0]
