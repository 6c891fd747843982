"""Weight formats of the fast stack (specdraft/linear_formats.py): each product against the float
product of the weight it stands for, the Q4_1-style grid round trip, and a whole stack in each format
through verify + rollback."""

from __future__ import annotations

import pytest
import torch

from specdraft.linear_formats import (
    FLOAT,
    Int4Linear,
    PackedLinear,
    WeightFormat,
    dequantize_int4,
    make_linear,
    quantize_int4,
)
from specdraft.models import tiny_random_llama
from specdraft.target import TargetModel


@pytest.fixture(autouse=True)
def _seeded() -> None:
    """Every input below is random: the same draw on every run."""
    torch.manual_seed(0)


def _weight(out_features: int = 40, in_features: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed))


def test_float_format_is_the_plain_product() -> None:
    w, b = _weight(), torch.randn(40)
    for rows in (1, 3, 4, 9):  # below, at and above the padded row count
        x = torch.randn(2, rows, 64)
        torch.testing.assert_close(make_linear(w, b, FLOAT)(x), x @ w.T + b, rtol=1e-5, atol=1e-5)


def test_bfloat16_format_rounds_the_weight_and_returns_float32() -> None:
    w, x = _weight(), torch.randn(5, 64)
    y = make_linear(w, None, WeightFormat("bfloat16"))(x)
    assert y.dtype == torch.float32
    reference = x.bfloat16().float() @ w.bfloat16().float().T
    torch.testing.assert_close(y, reference, rtol=2e-2, atol=2e-2)
    assert make_linear(w, None, WeightFormat("bfloat16")).nbytes == w.numel() * 2


def test_int4_grid_round_trip() -> None:
    """A weight already on a 4-bit asymmetric grid (what a Q4_1 file dequantizes to) comes back
    exactly: the group's min maps to 0 and its max to 15."""
    q, scale, minimum = quantize_int4(_weight(), 32)
    assert q.min() >= 0 and q.max() <= 15 and scale.shape == (40, 2)
    on_grid = dequantize_int4(q, scale, minimum)
    q2, scale2, minimum2 = quantize_int4(on_grid, 32)
    assert torch.equal(q2, q)
    torch.testing.assert_close(dequantize_int4(q2, scale2, minimum2), on_grid, rtol=0, atol=1e-6)


@pytest.mark.parametrize("rows", [1, 4, 7])
@pytest.mark.parametrize("group_size", [32, 64])
def test_int4_kernel_computes_the_dequantized_product(rows: int, group_size: int) -> None:
    """40 outputs (padded to 48 for the kernel), inputs in blocks of 4 rows; bfloat16 activations."""
    w, b, x = _weight(), torch.randn(40), torch.randn(rows, 64)
    linear = make_linear(w, b, WeightFormat("int4", group_size))
    assert isinstance(linear, Int4Linear)
    y = linear(x)
    reference = x.bfloat16().float() @ dequantize_int4(*quantize_int4(w, group_size)).T + b
    assert y.shape == (rows, 40) and y.dtype == torch.float32
    torch.testing.assert_close(y, reference, rtol=2e-2, atol=5e-2)


def test_int8_kernel_computes_the_per_channel_product() -> None:
    w, x = _weight(), torch.randn(3, 64)
    y = make_linear(w, None, WeightFormat("int8"))(x)
    scale = w.abs().amax(dim=1) / 127
    reference = x @ ((w / scale[:, None]).round() * scale[:, None]).T
    torch.testing.assert_close(y, reference, rtol=1e-4, atol=1e-4)


def test_formats_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="weight format must be one of"):
        WeightFormat("int3")
    with pytest.raises(ValueError, match="group_size must be one of"):
        WeightFormat("int4", 48)
    with pytest.raises(ValueError, match="choose a group_size that divides 64"):
        make_linear(_weight(), None, WeightFormat("int4", 128))
    assert isinstance(make_linear(_weight(), None), PackedLinear)


@pytest.mark.parametrize("kind", ["int4", "int8", "bfloat16"])
def test_a_stack_in_each_format_follows_its_own_weights_through_verify_and_rollback(kind: str) -> None:
    """The fast stack with quantized projections gives the logits of the Hugging Face forward of a
    model holding the weights those projections stand for (dequantized), for k = 1..8 new positions
    after verify + rollback, within 3% of the logits' scale (int4 and bfloat16 round activations to bfloat16)."""
    fmt = WeightFormat(kind, 32)
    model = tiny_random_llama(vocab_size=32, seed=5, hidden_size=64, init_std=0.1)  # a trained model's scale
    reference = tiny_random_llama(vocab_size=32, seed=5, hidden_size=64, init_std=0.1)
    reference.lm_head.weight = torch.nn.Parameter(reference.lm_head.weight.detach().clone())  # untied
    with torch.no_grad():
        for module in [*reference.model.layers.modules(), reference.lm_head]:
            if isinstance(module, torch.nn.Linear):
                w = module.weight
                if kind == "int4":
                    w.copy_(dequantize_int4(*quantize_int4(w, 32)))
                elif kind == "int8":
                    scale = w.abs().amax(dim=1, keepdim=True) / 127
                    w.copy_((w / scale).round() * scale)
                else:
                    w.copy_(w.bfloat16().float())
    target = TargetModel(model, weights=fmt)
    gen = torch.Generator().manual_seed(0)
    committed = torch.randint(0, 32, (7,), generator=gen).tolist()
    target.reset()
    target.forward(torch.tensor([committed]), num_logits=0)
    for k in (1, 3, 8, 2, 5):
        new = torch.randint(0, 32, (k,), generator=gen).tolist()
        logits = target.forward(torch.tensor([new])).logits
        with torch.inference_mode():
            expected = reference(torch.tensor([committed + new])).logits[:, -k:].float()
        assert (logits - expected).abs().max() <= 0.03 * expected.abs().max()  # bfloat16 activations
        committed += new[: int(torch.randint(0, k + 1, (1,), generator=gen))]
        target.crop(len(committed))


def test_weight_formats_need_the_fast_stack() -> None:
    with pytest.raises(ValueError, match="need the fast stack"):
        TargetModel(tiny_random_llama(), fast=False, weights=WeightFormat("int4"))


@pytest.mark.slow
def test_the_default_target_lies_on_the_int4_grid(default_target: TargetModel) -> None:
    """The default target is dequantized from a Q4_1 GGUF (groups of 32 inputs), so an int4 copy at
    group_size 32 holds its projection weights up to float rounding (why its acceptance is high)."""
    w = default_target.model.model.layers[3].mlp.down_proj.weight.detach()
    restored = dequantize_int4(*quantize_int4(w, 32))
    assert (restored - w).abs().max() <= 1e-5 * w.abs().max()
    coarse = dequantize_int4(*quantize_int4(w, 64))
    assert (coarse - w).abs().max() > 10 * (restored - w).abs().max()  # not a grid at 64
