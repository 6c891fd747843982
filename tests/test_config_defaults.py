"""Code defaults equal config defaults: for every drafter YAML in conf/drafter/, each key equals the
default of the same parameter of its `_target_` class, so `SomeDrafter()` in Python is the drafter
that `drafter=<name>` builds on the command line. Variant YAMLs change what they name (declared
below); each class has exactly one primary YAML."""

from __future__ import annotations

import inspect
from importlib import resources
from typing import Any

import pytest
from hydra import compose
from hydra.utils import get_class
from omegaconf import OmegaConf

DRAFTER_DIR = resources.files("conf").joinpath("drafter")
NAMES = sorted(p.name[:-5] for p in DRAFTER_DIR.iterdir() if p.name.endswith(".yaml"))
# Variant YAMLs: another configuration of a class that has its own primary YAML, exempt for the
# keys they exist to change (and only for those).
VARIANTS: dict[str, set[str]] = {"medusa_recurrent": {"heads"}, "suffix_cold": {"store_tokens", "corpus"}, "suffix_tree": {"tree"},
                                 "eagle_chain": {"tree"}}


@pytest.fixture(autouse=True)
def _hydra(hydra_conf: None) -> None:
    """Every test here composes the shipped configs."""


def drafter_yaml(name: str) -> dict[str, Any]:
    """The drafter group as the CLI composes it (`drafter=<name>`)."""
    cfg = compose("generate", overrides=[f"drafter={name}"]).drafter
    return OmegaConf.to_container(cfg, resolve=True) if cfg else {}  # type: ignore[return-value]


def plain(value: Any) -> Any:
    """A default as YAML can write it (tuples are lists)."""
    return [plain(v) for v in value] if isinstance(value, tuple | list) else value


def constructor_defaults(target: str) -> dict[str, inspect.Parameter]:
    params = inspect.signature(get_class(target)).parameters
    return {k: p for k, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


@pytest.mark.parametrize("name", NAMES)
def test_yaml_repeats_the_constructor_defaults(name: str) -> None:
    yaml = drafter_yaml(name)
    if "_target_" not in yaml:
        assert name == "none" and not yaml  # the AR baseline: no drafter, no keys
        return
    params = constructor_defaults(yaml["_target_"])
    unknown = set(yaml) - {"_target_"} - set(params)
    assert not unknown, f"conf/drafter/{name}.yaml sets {sorted(unknown)}, which {yaml['_target_']} does not take"
    exempt = VARIANTS.get(name, set())
    differ = {k: (v, plain(params[k].default)) for k, v in yaml.items()
              if k != "_target_" and k not in exempt and v != plain(params[k].default)}
    assert not differ, f"conf/drafter/{name}.yaml (yaml, constructor) disagree: {differ}"
    required = {k for k, p in params.items() if p.default is p.empty and k not in yaml}
    assert not required, f"{yaml['_target_']} requires {sorted(required)}: give it a default (and the YAML its value)"


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variants_change_what_they_declare(name: str) -> None:
    yaml = drafter_yaml(name)
    params = constructor_defaults(yaml["_target_"])
    for key in VARIANTS[name]:
        assert yaml[key] != plain(params[key].default), f"{name}.yaml no longer changes {key}: drop the exemption"


def test_every_drafter_class_has_one_primary_yaml() -> None:
    primaries: dict[str, list[str]] = {}
    for name in NAMES:
        target = drafter_yaml(name).get("_target_")
        if target is not None and name not in VARIANTS:
            primaries.setdefault(target, []).append(name)
    assert all(len(names) == 1 for names in primaries.values()), primaries
    for name in VARIANTS:
        assert drafter_yaml(name)["_target_"] in primaries, f"variant {name} has no primary YAML"
