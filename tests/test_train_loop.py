"""The one training skeleton: schedule, time budget, resumable checkpoints, evaluation hook."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from specdraft.train.loop import TrainSettings, lr_at, train


def _problem(seed: int = 0) -> tuple[nn.Module, callable]:
    """A linear regression; `seed` sets the initial weights only (the data is always the same)."""
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(123))
    torch.manual_seed(seed)
    module = nn.Linear(4, 1)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])

    def step_loss(step: int) -> tuple[torch.Tensor, dict]:
        idx = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(step))
        return ((module(x[idx]) - y[idx]) ** 2).mean(), {}

    return module, step_loss


def test_schedule_warms_up_then_anneals_to_the_floor() -> None:
    s = TrainSettings(max_steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, s) == pytest.approx(0.1) and lr_at(9, s) == pytest.approx(1.0)
    assert lr_at(10, s) == pytest.approx(1.0) and lr_at(100, s) == pytest.approx(0.1)
    rates = [lr_at(k, s) for k in range(10, 101)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))
    budget = TrainSettings(max_steps=100, lr=1.0, warmup_steps=0, max_minutes=1.0)
    assert lr_at(1, budget, elapsed_s=60.0) == pytest.approx(0.1)  # the budget is spent: fully annealed


def test_training_reduces_the_loss_and_evaluates_at_the_end() -> None:
    module, step_loss = _problem()
    seen: list[int] = []
    log = train(module, step_loss, TrainSettings(max_steps=200, lr=0.05, checkpoint_every=0), name="t",
                evaluate=lambda step: seen.append(step) or {"loss": float(step_loss(0)[0])}, log=False)
    assert log.step == 200 and seen == [200] and not module.training
    assert log.history[-1]["eval"]["loss"] < 0.5 * log.history[0]["loss"]


class _Crash(Exception):
    pass


def test_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    settings = TrainSettings(max_steps=40, lr=0.05, checkpoint_every=10)
    straight, loss_a = _problem()
    train(straight, loss_a, settings, name="t", log=False)

    crashed, loss_b = _problem()

    def crash_at_25(step: int) -> tuple[torch.Tensor, dict]:
        if step == 25:
            raise _Crash
        return loss_b(step)

    ckpt = tmp_path / "ckpt.pt"
    with pytest.raises(_Crash):
        train(crashed, crash_at_25, settings, name="t", checkpoint=ckpt, log=False)
    fresh, loss_c = _problem(seed=1)  # other initial weights: the checkpoint must restore them
    log = train(fresh, loss_c, settings, name="t", checkpoint=ckpt, log=False)
    assert log.step == 40 and [row["step"] for row in log.history] == list(range(1, 41))
    assert torch.equal(fresh.weight, straight.weight) and torch.equal(fresh.bias, straight.bias)


def test_bad_settings_name_the_key() -> None:
    with pytest.raises(ValueError, match="max_minutes"):
        TrainSettings(max_minutes=0)
    with pytest.raises(ValueError, match="unknown train settings"):
        TrainSettings.from_config({"max_seconds": 10})
    with pytest.raises(ValueError, match="no trainable parameters"):
        train(nn.Linear(2, 2).requires_grad_(False), lambda s: (torch.zeros(()), {}), TrainSettings(), name="t", log=False)
