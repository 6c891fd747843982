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
    setting, sampling and prefix cache. The drafter's config names its measured cost in the cost
    cache, so every run with the same config on this machine makes the same K choices (seeded runs
    reproduce)."""
    spec = cfg.get("drafter") if drafter_cfg is None else drafter_cfg
    return SpeculativeDecoder(
        target,
        drafter,
        num_draft_tokens=cfg.num_draft_tokens,
        sampling=make_sampling(cfg.sampling),
        max_draft_tokens=cfg.max_draft_tokens,
        cost_key=None if drafter is None else config_hash(spec),
        prefix_cache_tokens=cfg.get("prefix_cache_tokens", 0),  # the bench's; a single generation has none
    )


def config_hash(cfg: DictConfig | dict | None) -> str:
    """A short stable hash of a (resolved) config: the same settings give the same string."""
    plain = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    return hashlib.sha1(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:16]


_MISSING = object()  # OmegaConf.select's answer for a setting the config does not have


def drafter_config(entry: str) -> DictConfig:
    """The drafter config a `bench.drafters` entry names: the packaged `conf/drafter/<name>.yaml`, or
    a drafter config file of your own when the name is a path ending in .yaml (e.g. the shipped
    draft's config pointing at a draft you trained), optionally followed by settings that replace the
    config's own, space-separated: "draft_model siblings=1 copy_ngram=null". So several drafters, or
    variants of one, are compared in one run without a config file per variant."""
    name, overrides = split_drafter_entry(entry)
    base = _config_file(name) if is_config_file(name) else _packaged_config(name)
    bad = [k for k in overrides if k == "_target_" or OmegaConf.select(base, k, default=_MISSING) is _MISSING]
    if bad:
        settings = sorted(k for k in base if k != "_target_")
        raise ValueError(f"drafter {name!r} has no setting {bad[0]!r} to change in {entry!r}; its settings are "
                         f"{settings}.")
    merged = OmegaConf.merge(base, OmegaConf.from_dotlist([f"{k}={v}" for k, v in overrides.items()]))
    assert isinstance(merged, DictConfig)
    return merged


def split_drafter_entry(entry: str) -> tuple[str, dict[str, str]]:
    """A `bench.drafters` entry as (config name or file, {setting: value as written})."""
    parts = str(entry).split()
    if not parts:
        raise ValueError("a bench.drafters entry is empty; name a drafter config, e.g. draft_model.")
    name, settings = parts[0], parts[1:]
    overrides: dict[str, str] = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"{setting!r} in the bench.drafters entry {entry!r} is not key=value; write e.g. "
                             "\"draft_model siblings=1\" (null, true, numbers and text as in YAML).")
        if key in overrides:
            raise ValueError(f"the bench.drafters entry {entry!r} sets {key!r} twice; set it once.")
        overrides[key] = value
    return name, overrides


def _config_file(name: str) -> DictConfig:
    own = Path(name).expanduser()
    if not own.is_file():
        raise ValueError(f"drafter config file {name!r} does not exist; give the path of a YAML file "
                         "written like conf/drafter/<name>.yaml (a _target_ and its settings).")
    loaded = OmegaConf.create(own.read_text())
    if not isinstance(loaded, DictConfig) or "_target_" not in loaded:
        raise ValueError(f"drafter config file {name!r} has no _target_; copy one of conf/drafter/*.yaml "
                         "and change its settings.")
    return loaded


def _packaged_config(name: str) -> DictConfig:
    path = resources.files("conf").joinpath("drafter", f"{name}.yaml")
    if not path.is_file():
        known = sorted(p.name[:-5] for p in resources.files("conf").joinpath("drafter").iterdir() if p.name.endswith(".yaml"))
        raise ValueError(f"unknown drafter config {name!r}; choose from {known}, or give the path of your own "
                         "drafter .yaml file.")
    loaded = OmegaConf.create(path.read_text())
    return loaded if isinstance(loaded, DictConfig) else OmegaConf.create({})


def is_config_file(name: str) -> bool:
    """Whether a drafter name is the path of a config file of your own (it ends in .yaml / .yml)."""
    return name.endswith((".yaml", ".yml"))


def drafter_label(entry: str) -> str:
    """The name a `bench.drafters` entry goes by in results: the config's name (a file's stem),
    followed by the settings it changes as written: "draft_model siblings=1"."""
    name, overrides = split_drafter_entry(entry)
    stem = Path(name).stem if is_config_file(name) else name
    return " ".join([stem, *(f"{k}={v}" for k, v in overrides.items())])


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
