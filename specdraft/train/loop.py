"""The one training skeleton under every recipe (distilled draft, exit adapter, Medusa heads).

A recipe supplies the module to train and the loss of one step; the skeleton owns everything else
the recipes have in common: AdamW over the module's trainable parameters, a linear warm-up then a
cosine decay to `min_lr_ratio * lr`, a wall-clock budget (`max_minutes`; the schedule anneals over
whichever of steps and minutes runs out first), a resumable checkpoint, a progress bar and a
held-out evaluation hook. Every recipe's config has the same `train:` group (`TrainSettings`).

Resuming is exact when `step_loss(step)` picks its batch from `step` alone (e.g. a generator seeded
with `seed + step`): a resumed run then sees the batches an uninterrupted run would.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from specdraft.files import replace_atomically

StepLoss = Callable[[int], tuple[Tensor, Mapping[str, float]]]  # step -> (loss, values to log)
Evaluate = Callable[[int], Mapping[str, Any]]  # step -> held-out metrics


@dataclass(frozen=True)
class TrainSettings:
    """The `train:` group of every recipe's config.

    max_steps: optimizer steps at most. max_minutes: wall-clock budget (None = none); the run stops
        with a checkpoint when it is spent. warmup_steps: linear warm-up from lr / warmup_steps.
    min_lr_ratio: the cosine decay ends at this fraction of lr. grad_clip: max gradient norm (None = off).
    eval_every / checkpoint_every: every this many steps (0 = only at the end).
    """

    max_steps: int = 1000
    max_minutes: float | None = None
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    grad_clip: float | None = 1.0
    eval_every: int = 0
    checkpoint_every: int = 50

    def __post_init__(self) -> None:
        if self.max_steps < 0 or self.warmup_steps < 0 or self.eval_every < 0 or self.checkpoint_every < 0:
            raise ValueError(
                "train.max_steps, train.warmup_steps, train.eval_every and train.checkpoint_every must be "
                f">= 0, got {self.max_steps}, {self.warmup_steps}, {self.eval_every}, {self.checkpoint_every}."
            )
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError(f"train.max_minutes must be > 0 or null (no budget), got {self.max_minutes}.")
        if self.lr <= 0 or not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"need train.lr > 0 and 0 <= train.min_lr_ratio <= 1, got {self.lr}, {self.min_lr_ratio}.")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> TrainSettings:
        """From a recipe config's `train:` group (a dict or DictConfig); unknown keys are an error."""
        values = dict(cfg or {})
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown train settings {unknown}; the train: group takes {sorted(names)}.")
        return cls(**values)


def lr_at(step: int, s: TrainSettings, elapsed_s: float = 0.0) -> float:
    """Learning rate of `step`: linear warm-up, then cosine decay from lr to min_lr_ratio * lr over
    the larger of step / max_steps and elapsed / budget (so a time-limited run still anneals)."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    progress = (step - s.warmup_steps) / max(1, s.max_steps - s.warmup_steps)
    if s.max_minutes:
        progress = max(progress, elapsed_s / (60.0 * s.max_minutes))
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return s.lr * (s.min_lr_ratio + (1.0 - s.min_lr_ratio) * cosine)


@dataclass
class TrainLog:
    """What a run did: steps taken (in total, across resumes), seconds trained, and its history
    (one {"step", "loss", ...} row per step and one {"step", "eval": ...} row per evaluation)."""

    step: int = 0
    elapsed_s: float = 0.0
    history: list[dict[str, Any]] = field(default_factory=list)
    stopped_by_budget: bool = False

    @property
    def evals(self) -> list[dict[str, Any]]:
        return [row for row in self.history if "eval" in row]


def trainable_state(module: nn.Module) -> dict[str, Tensor]:
    """The module's trainable parameters (what a checkpoint keeps; frozen weights are the target's)."""
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}


def train(
    module: nn.Module,
    step_loss: StepLoss,
    settings: TrainSettings,
    *,
    name: str,
    checkpoint: str | Path | None = None,
    evaluate: Evaluate | None = None,
    log: bool = True,
    identity: Mapping[str, Any] | None = None,
) -> TrainLog:
    """Train `module`'s parameters that require grad, in place, and return the log.

    step_loss(step) -> (scalar loss tensor with grad, floats to show/log). checkpoint: a file to
    resume from and write to (None = no checkpoint). evaluate(step) runs with the module in eval mode
    and no grad, every `eval_every` steps and after the last step. name: the progress bar's label.
    identity: what this run trains (settings and data, not its budget), stored in the checkpoint; a
    checkpoint stored with another identity is refused instead of resumed (None = no check).
    """
    from tqdm import tqdm

    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{name}: the module has no trainable parameters (requires_grad=True); nothing to train.")
    opt = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    run = TrainLog()
    ckpt = Path(checkpoint) if checkpoint is not None else None
    if ckpt is not None and ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        if identity is not None and state.get("identity") != dict(identity):
            theirs = state.get("identity") or {}
            differ = sorted(k for k in set(theirs) | set(identity) if theirs.get(k) != identity.get(k))
            raise ValueError(f"{name}: the checkpoint {ckpt} was made by another run (it differs in: "
                             f"{', '.join(differ)}); pass resume=false to start over, or checkpoint=<another file> to keep it.")
        module.load_state_dict(state["trainable"], strict=False)
        opt.load_state_dict(state["optimizer"])
        run = TrainLog(step=int(state["step"]), elapsed_s=float(state["elapsed_s"]), history=list(state["history"]))
        if log:
            print(f"[{name}] resumed from {ckpt} at step {run.step} ({run.elapsed_s:.0f} s trained)", flush=True)

    def save() -> None:
        if ckpt is None:
            return
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        state = {"trainable": trainable_state(module), "optimizer": opt.state_dict(), "step": run.step,
                 "elapsed_s": run.elapsed_s, "history": run.history,
                 "identity": None if identity is None else dict(identity)}
        replace_atomically(ckpt, lambda tmp: torch.save(state, tmp))  # an interrupted save never corrupts it

    def run_eval() -> None:
        if evaluate is None:
            return
        module.eval()
        with torch.no_grad():
            metrics = dict(evaluate(run.step))
        module.train()
        run.history.append({"step": run.step, "eval": metrics})
        if log:
            print(f"\n[{name}] step {run.step} eval {metrics}", flush=True)

    budget_s = None if settings.max_minutes is None else 60.0 * settings.max_minutes
    bar = tqdm(total=settings.max_steps, initial=run.step, desc=name, disable=not log, file=sys.stdout, mininterval=5)
    t0 = time.monotonic() - run.elapsed_s
    module.train()
    last_eval = -1
    while run.step < settings.max_steps:
        if budget_s is not None and time.monotonic() - t0 >= budget_s:
            run.stopped_by_budget = True
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(run.step, settings, time.monotonic() - t0)
        loss, shown = step_loss(run.step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if settings.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
        opt.step()
        run.step += 1
        run.elapsed_s = time.monotonic() - t0
        run.history.append({"step": run.step, "loss": round(float(loss.detach()), 5), **shown})
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}")
        bar.update(1)
        if settings.eval_every and run.step % settings.eval_every == 0:
            run_eval()
            last_eval = run.step
        if settings.checkpoint_every and run.step % settings.checkpoint_every == 0:
            save()
    bar.close()
    if run.stopped_by_budget and log:
        print(f"[{name}] time budget of {settings.max_minutes} minutes spent at step {run.step}", flush=True)
    if last_eval != run.step:
        run_eval()
    save()
    module.eval()
    return run


def recipe_settings(cfg: Any) -> Any:
    """A Hydra recipe's config made ready to run: torch threads set, the struct flag off (the
    recipe adds keys) and the command-line overrides recorded in `cfg.overrides` (its provenance)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    torch.set_num_threads(int(cfg.threads))
    OmegaConf.set_struct(cfg, False)
    cfg.overrides = list(HydraConfig.get().overrides.task)
    return cfg
