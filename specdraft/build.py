"""Turn composed Hydra configs into runtime objects (target, drafter, sampling, decoder).

Configs hold only flat parameters and `_target_`s; runtime objects are created here and injected
(the drafter gets the target in `bind`), so the loop and the bench never branch on a drafter's type.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from specdraft.decode import SpeculativeDecoder
from specdraft.protocol import Drafter
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel


def target_label(cfg: DictConfig | dict) -> str:
    """A `target` group's name for records: its name_or_path (an alias, hub id, directory or .gguf),
    else its `_target_` (e.g. the tiny random target of the tests)."""
    return str(cfg.get("name_or_path") or cfg.get("_target_", ""))


def make_drafter(cfg: DictConfig | dict | None) -> Drafter | None:
    """Instantiate a drafter config (`_target_` + flat params); empty / None = no drafter (AR)."""
    if cfg is None or "_target_" not in cfg:
        return None
    return instantiate(cfg, _convert_="all")


def make_sampling(cfg: DictConfig | dict) -> SamplingConfig:
    return instantiate(cfg) if "_target_" in cfg else SamplingConfig(**cfg)


def make_decoder(cfg: DictConfig, target: TargetModel, drafter: Drafter | None) -> SpeculativeDecoder:
    """The decoder for `drafter` with the run's K setting and sampling."""
    return SpeculativeDecoder(
        target,
        drafter,
        num_draft_tokens=cfg.num_draft_tokens,
        sampling=make_sampling(cfg.sampling),
        max_draft_tokens=cfg.max_draft_tokens,
    )


def drafter_config(name: str) -> DictConfig:
    """The packaged `conf/drafter/<name>.yaml` (used to compare several drafters in one run)."""
    path = resources.files("conf").joinpath("drafter", f"{name}.yaml")
    if not path.is_file():
        known = sorted(p.name[:-5] for p in resources.files("conf").joinpath("drafter").iterdir() if p.name.endswith(".yaml"))
        raise ValueError(f"unknown drafter config {name!r}; choose from {known}.")
    loaded = OmegaConf.create(path.read_text())
    return loaded if isinstance(loaded, DictConfig) else OmegaConf.create({})


def prompt_token_ids(
    tokenizer: Any, prompt: str, chat: bool = True, system: str | None = None
) -> list[int]:
    """Token ids of a user message (chat template applied) or of a raw prompt."""
    if not prompt:
        raise ValueError('the prompt is empty; pass prompt="..." on the command line.')
    if tokenizer is None:
        raise ValueError("this target has no tokenizer; use a target config with a tokenizer.")
    if not chat:
        return list(tokenizer.encode(prompt, add_special_tokens=False))
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}
    ]
    return list(
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )
