"""Outputs never overwrite silently: exports and recipes refuse a non-empty folder unless
overwrite=true, check it before any model loads, and train into Hydra's run directory by default."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose
from omegaconf import DictConfig, OmegaConf

from specdraft.formats.medusa_heads import HEADS_CONFIG, MedusaHeads
from specdraft.formats.target_info import RECORD_KEY
from specdraft.models import tiny_random_target
from specdraft.shipped import ARTIFACTS_DIR
from specdraft.train import distill, early_exit, medusa
from specdraft.export import export_from_config
from drafters.medusa_export import export
from specdraft.outputs import prepare_output_dir
from specdraft.train.selfgen import run_selfgen

RECIPES = ("train_distill", "train_medusa", "train_early_exit", "selfgen")
UNLOADABLE = {"_target_": "specdraft.no_such_loader"}  # instantiating it fails: proves nothing loaded


def non_empty(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}\n")
    return folder


def composed(name: str, *overrides: str) -> DictConfig:
    cfg = compose(name, overrides=list(overrides))
    OmegaConf.set_struct(cfg, False)
    return cfg


def test_prepare_output_dir(tmp_path: Path) -> None:
    fresh = prepare_output_dir(tmp_path / "a" / "b", overwrite=False)
    assert fresh.is_dir() and not any(fresh.iterdir())  # created, probe removed
    assert prepare_output_dir(fresh, overwrite=False) == fresh  # empty: fine
    full = non_empty(tmp_path / "full")
    with pytest.raises(FileExistsError, match=r"out_dir='.*full' is not empty \(it has config.json\); pass overwrite=true"):
        prepare_output_dir(full, overwrite=False)
    assert prepare_output_dir(full, overwrite=True) == full
    with pytest.raises(FileExistsError, match="is a file, not a folder"):
        prepare_output_dir(full / "config.json", overwrite=True)
    with pytest.raises(PermissionError, match=r"cannot write to export_dir='.*config.json/sub'"):
        prepare_output_dir(full / "config.json" / "sub", overwrite=True, key="export_dir")


def test_export_refuses_a_non_empty_folder_unless_overwrite(tmp_path: Path) -> None:
    target = tiny_random_target(vocab_size=16, seed=1)
    heads = MedusaHeads(target.lm_head.weight, num_heads=2)
    out = non_empty(tmp_path / "vllm")
    with pytest.raises(FileExistsError, match="overwrite=true"):
        export(heads, out)
    assert json.loads((out / "config.json").read_text()) == {}  # untouched
    export(heads, out, overwrite=True)
    assert json.loads((out / "config.json").read_text())["num_heads"] == 2


@pytest.mark.usefixtures("hydra_conf")
def test_export_cli_config_checks_the_folder_before_loading_the_target(tmp_path: Path) -> None:
    cfg = composed("export", "kind=medusa", f"out_dir={non_empty(tmp_path / 'out')}")
    cfg.target = UNLOADABLE
    with pytest.raises(FileExistsError, match="overwrite=true"):
        export_from_config(cfg)


@pytest.mark.usefixtures("hydra_conf")
def test_every_recipe_refuses_a_non_empty_out_dir_before_loading_the_target(tmp_path: Path) -> None:
    out = str(non_empty(tmp_path / "out"))
    cfg = composed("train_medusa", f"out_dir={out}", f"cache_dir={tmp_path / 'cache'}")
    cfg.target = UNLOADABLE
    with pytest.raises(FileExistsError, match="out_dir=.* is not empty"):
        medusa.run(cfg)
    cfg = composed("train_early_exit", f"out_dir={out}", f"cache_dir={tmp_path / 'cache'}")
    cfg.target = UNLOADABLE
    with pytest.raises(FileExistsError, match="out_dir=.* is not empty"):
        early_exit.run(cfg)
    plain = OmegaConf.to_container(composed("train_distill", f"out_dir={tmp_path / 'fresh'}", f"export_dir={out}"))
    plain["target"] = UNLOADABLE
    with pytest.raises(FileExistsError, match="export_dir=.* is not empty"):
        distill.run(plain)
    with pytest.raises(FileExistsError, match="out_dir=.* is not empty"):
        run_selfgen("no-such-model", out_dir=out)


@pytest.mark.usefixtures("hydra_conf")
def test_recipes_write_under_the_run_directory_by_default() -> None:
    for name in RECIPES:
        raw = OmegaConf.to_container(compose(name))
        assert raw["out_dir"].startswith("${hydra:runtime.output_dir}/"), name
        assert raw["overwrite"] is False, name
    assert OmegaConf.to_container(compose("export"))["overwrite"] is False


@pytest.mark.usefixtures("hydra_conf")
def test_medusa_recipe_writes_into_a_non_empty_folder_with_overwrite(tmp_path: Path) -> None:
    target = tiny_random_target(vocab_size=49152, seed=1, tokenizer="smollm2-135m", hidden_size=16, num_layers=1)
    out = non_empty(tmp_path / "heads")
    cfg = composed("train_medusa", *tiny_medusa_overrides(tmp_path), f"out_dir={out}", "overwrite=true")
    medusa.run(cfg, target)
    record = json.loads((out / HEADS_CONFIG).read_text())[RECORD_KEY]
    assert record["hidden_size"] == 16 and record["vocab_size"] == 49152 and record["num_layers"] == 1


def tiny_medusa_overrides(tmp_path: Path) -> list[str]:
    """A seconds-long Medusa recipe on the shipped self-generated answers (+ a little stdlib held out)."""
    return [f"cache_dir={tmp_path / 'cache'}", "data.selfgen_tokens=600", "data.eval_tokens=300",
            "data.stdlib_tokens=0", "pruned_vocab=64", "num_heads=2", "batch_size=16", "bf16=false",
            "eval_positions=40", "train.max_steps=2", "train.eval_every=0", "train.max_minutes=null"]


@pytest.mark.slow  # a console script end to end (a subprocess that loads the default target's tokenizer)
def test_medusa_cli_trains_into_the_run_directory_not_the_package(tmp_path: Path) -> None:
    shipped = ARTIFACTS_DIR / "smollm2-135m" / "medusa" / HEADS_CONFIG
    before = shipped.stat().st_mtime_ns
    cli = Path(sys.executable).with_name("specdraft-train-medusa")
    overrides = ["target=tiny_random", "+target.hidden_size=16", "+target.num_layers=1",
                 *tiny_medusa_overrides(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([str(cli), *overrides], check=False, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    made = list((tmp_path / "outputs").glob(f"*/*/medusa/{HEADS_CONFIG}"))
    assert len(made) == 1, run.stdout[-2000:]
    assert shipped.stat().st_mtime_ns == before


def test_export_cli_into_a_non_empty_folder_is_one_error_line(tmp_path: Path) -> None:
    out = non_empty(tmp_path / "out")
    cli = Path(sys.executable).with_name("specdraft-export")
    run = subprocess.run([str(cli), f"out_dir={out}"], check=False, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and run.stderr.startswith("error: out_dir=")
    assert "overwrite=true" in run.stderr
