"""Every config in conf/ composes, and every drafter config instantiates (and binds where the
tiny target allows) through its public `_target_`."""

from __future__ import annotations

from importlib import resources

import pytest
from hydra import compose
from hydra.utils import instantiate

from specdraft.build import make_drafter, make_sampling
from specdraft.protocol import Drafter

CONF = resources.files("conf")
DRAFTERS = sorted(p.name[:-5] for p in CONF.joinpath("drafter").iterdir() if p.name.endswith(".yaml"))
PRIMARY = sorted(p.name[:-5] for p in CONF.iterdir() if p.name.endswith(".yaml"))


@pytest.fixture(autouse=True)
def _hydra(hydra_conf: None) -> None:
    """Every test here composes the shipped configs."""


def test_every_yaml_starts_with_its_command() -> None:
    for group in ("", "drafter", "target", "sampling", "suite"):
        folder = CONF.joinpath(group) if group else CONF
        for p in folder.iterdir():
            if p.name.endswith(".yaml"):
                assert p.read_text().startswith("# "), f"{group}/{p.name} lacks its command comment"


@pytest.mark.parametrize("name", PRIMARY)
def test_primary_configs_compose(name: str) -> None:
    cfg = compose(name)
    assert cfg is not None


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_bench_composes_with_every_drafter(drafter: str) -> None:
    cfg = compose("bench", overrides=[f"drafter={drafter}", "sampling=sample", "num_draft_tokens=4"])
    make_sampling(cfg.sampling)
    if drafter == "none":
        assert make_drafter(cfg.drafter) is None
    else:
        assert cfg.drafter._target_.startswith("drafters.")


@pytest.mark.parametrize("drafter", [d for d in DRAFTERS if d != "none"])
def test_every_drafter_instantiates(drafter: str) -> None:
    cfg = compose("generate", overrides=[f"drafter={drafter}"])
    obj = make_drafter(cfg.drafter)
    assert isinstance(obj, Drafter)


def test_tiny_target_and_ngram_bind() -> None:
    cfg = compose("generate", overrides=["target=tiny_random", "target.tokenizer=null",
                                         "target.vocab_size=32"])
    target = instantiate(cfg.target)
    drafter = make_drafter(cfg.drafter)
    drafter.bind(target)
    assert target.vocab_size == 32


def test_a_drafter_entry_changes_settings_typed_as_in_yaml() -> None:
    """"draft_model siblings=1 copy_ngram=null": the packaged config with those settings (YAML types),
    labelled by the whole entry; nothing else changes."""
    from specdraft.build import drafter_config, drafter_label

    base = drafter_config("draft_model")
    cfg = drafter_config("draft_model  siblings=1 copy_ngram=null")
    assert cfg.siblings == 1 and cfg.copy_ngram is None
    assert {k: v for k, v in cfg.items() if k not in ("siblings", "copy_ngram")} == \
        {k: v for k, v in base.items() if k not in ("siblings", "copy_ngram")}
    assert drafter_label("draft_model  siblings=1 copy_ngram=null") == "draft_model siblings=1 copy_ngram=null"
    assert drafter_label("conf/x/ngram_wide.yaml max_ngram=4") == "ngram_wide max_ngram=4"
