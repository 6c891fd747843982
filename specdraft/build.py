"""Turn composed Hydra configs into runtime objects (target, drafter, sampling, decoder).

Configs hold only flat parameters and `_target_`s; runtime objects are created here and injected
(the drafter gets the target in `bind`), so the loop and the bench never branch on a drafter's type.
"""

from __future__ import annotations

import hashlib
import json
import sys
from importlib import resources
from pathlib import Path
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


def make_decoder(
    cfg: DictConfig, target: TargetModel, drafter: Drafter | None, drafter_cfg: DictConfig | dict | None = None
) -> SpeculativeDecoder:
    """The decoder for `drafter` (built from `drafter_cfg`, default `cfg.drafter`) with the run's K
    setting and sampling. The drafter's config names its measured cost in the cost cache, so every
    run with the same config on this machine makes the same K choices (seeded runs reproduce)."""
    spec = cfg.get("drafter") if drafter_cfg is None else drafter_cfg
    return SpeculativeDecoder(
        target,
        drafter,
        num_draft_tokens=cfg.num_draft_tokens,
        sampling=make_sampling(cfg.sampling),
        max_draft_tokens=cfg.max_draft_tokens,
        cost_key=None if drafter is None else config_hash(spec),
    )


def config_hash(cfg: DictConfig | dict | None) -> str:
    """A short stable hash of a (resolved) config: the same settings give the same string."""
    plain = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    return hashlib.sha1(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:16]


def drafter_config(name: str) -> DictConfig:
    """The packaged `conf/drafter/<name>.yaml` (used to compare several drafters in one run)."""
    path = resources.files("conf").joinpath("drafter", f"{name}.yaml")
    if not path.is_file():
        known = sorted(p.name[:-5] for p in resources.files("conf").joinpath("drafter").iterdir() if p.name.endswith(".yaml"))
        raise ValueError(f"unknown drafter config {name!r}; choose from {known}.")
    loaded = OmegaConf.create(path.read_text())
    return loaded if isinstance(loaded, DictConfig) else OmegaConf.create({})


def prompt_text(prompt: Any, prompt_file: str | None = None) -> str:
    """The prompt as the user meant it: the contents of `prompt_file` when given (`-` = stdin),
    else `prompt`, which may reach us as a number (Hydra parses `prompt=123` as an int): it is text."""
    if prompt_file:
        if str(prompt_file) == "-":
            return sys.stdin.read()
        path = Path(str(prompt_file)).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"prompt_file={prompt_file}: no such file; give a text file or - for stdin.")
        return path.read_text()
    if isinstance(prompt, bool) or not isinstance(prompt, (str, int, float)):
        raise ValueError(
            f"prompt must be text, got {prompt!r}; quote it for Hydra: 'prompt=\"...\"', or use prompt_file=PATH."
        )
    return str(prompt)


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
