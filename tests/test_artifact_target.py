"""Artifacts know their target: loading one onto another target is one error naming both."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from drafters.draft_model import DraftModelDrafter
from drafters.early_exit import EarlyExitDrafter
from drafters.medusa import MedusaDrafter
from specdraft.formats.medusa_heads import HEADS_CONFIG, MedusaHeads, save_heads
from specdraft.formats.target_info import (
    CACHE_RECORD,
    DRAFT_KEYS,
    HEADS_KEYS,
    RECORD_KEY,
    check_target,
    guard_cache,
    target_info,
)
from specdraft.models import tiny_random_target
from specdraft.shipped import ARTIFACTS_DIR
from specdraft.target import TargetModel
from specdraft.train.medusa import build_peft_heads

SHIPPED = ARTIFACTS_DIR / "smollm2-135m"
DEFAULT_RECORD = {"name_or_path": "smollm2-135m", "hidden_size": 576, "vocab_size": 49152, "num_layers": 30}


@pytest.fixture(scope="module")
def deep_target() -> TargetModel:
    """Enough layers for the shipped adapter's exit layer 6, so only the record can object."""
    return tiny_random_target(vocab_size=16, seed=1, num_layers=8)


def test_every_shipped_artifact_records_the_default_target() -> None:
    configs = ["draft/draft.json", "early_exit/adapter_config.json", f"medusa/{HEADS_CONFIG}",
               f"medusa_recurrent/{HEADS_CONFIG}"]
    for name in configs:
        record = json.loads((SHIPPED / name).read_text())[RECORD_KEY]
        assert {k: record[k] for k in DEFAULT_RECORD} == DEFAULT_RECORD, name
        assert len(record["tokenizer_hash"]) == 12


def test_default_draft_on_the_tiny_target_names_both(tiny_target: TargetModel) -> None:
    with pytest.raises(ValueError, match=r"smollm2-135m/draft was trained for a target with hidden size 576, "
                                         r"vocab 49152 \(smollm2-135m\); this target has hidden size 32, vocab 16 "
                                         r"\(an unnamed llama model\)\. Use a draft distilled from this target"):
        DraftModelDrafter().bind(tiny_target)


def test_default_heads_on_the_tiny_target_name_both(tiny_target: TargetModel) -> None:
    for heads in ("smollm2-135m", "smollm2-135m/medusa_recurrent"):
        with pytest.raises(ValueError, match=r"smollm2-135m/medusa\w* was trained for a target with hidden size "
                                             r"576, vocab 49152 \(smollm2-135m\); this target has hidden size 32, "
                                             r"vocab 16 .*specdraft-train-medusa target="):
            MedusaDrafter(heads=heads).bind(tiny_target)


def test_default_adapter_on_the_tiny_target_names_both(deep_target: TargetModel) -> None:
    with pytest.raises(ValueError, match=r"smollm2-135m/early_exit was trained for a target with hidden size 576, "
                                         r"vocab 49152, 30 layers \(smollm2-135m\); this target has hidden size 32, "
                                         r"vocab 16, 8 layers"):
        EarlyExitDrafter().bind(deep_target)


def _without_record(src: Path, dst: Path, config: str) -> Path:
    """A copy of a shipped artifact as saved before records existed."""
    shutil.copytree(src, dst)
    meta = json.loads((dst / config).read_text())
    del meta[RECORD_KEY]
    (dst / config).write_text(json.dumps(meta, indent=2) + "\n")
    return dst


def test_artifacts_without_a_record_are_checked_on_their_shapes(tiny_target: TargetModel, deep_target: TargetModel,
                                                                 tmp_path: Path) -> None:
    draft = _without_record(SHIPPED / "draft", tmp_path / "draft", "draft.json")
    with pytest.raises(ValueError, match=r"draft was trained for a target with hidden size 576, vocab 49152; "
                                         r"this target has hidden size 32, vocab 16"):
        DraftModelDrafter(model=str(draft)).bind(tiny_target)
    heads = _without_record(SHIPPED / "medusa", tmp_path / "heads", HEADS_CONFIG)
    with pytest.raises(ValueError, match=r"heads was trained for a target with hidden size 576, vocab 49152; "
                                         r"this target has hidden size 32, vocab 16"):
        MedusaDrafter(heads=str(heads)).bind(tiny_target)
    adapter = _without_record(SHIPPED / "early_exit", tmp_path / "adapter", "adapter_config.json")
    with pytest.raises(ValueError, match=r"adapter was trained for a target with hidden size 576, vocab 49152; "
                                         r"this target has hidden size 32, vocab 16"):
        EarlyExitDrafter(adapter=adapter).bind(deep_target)


def test_heads_load_on_their_own_target_and_not_on_a_wider_one(tmp_path: Path) -> None:
    target = tiny_random_target(vocab_size=16, seed=1, hidden_size=32)
    heads = build_peft_heads(MedusaHeads(target.lm_head.weight, num_heads=2), rank=2, alpha=4)
    save_heads(heads, tmp_path / "heads", {"command": "test"}, target=target_info(target, "tiny-a"))
    assert json.loads((tmp_path / "heads" / HEADS_CONFIG).read_text())[RECORD_KEY]["name_or_path"] == "tiny-a"
    MedusaDrafter(heads=str(tmp_path / "heads"), tree=None).bind(target)  # the architecture ignores the record
    wider = tiny_random_target(vocab_size=16, seed=1, hidden_size=64)
    with pytest.raises(ValueError, match=r"hidden size 32, vocab 16 \(tiny-a\); this target has hidden size 64"):
        MedusaDrafter(heads=str(tmp_path / "heads"), tree=None).bind(wider)


def test_check_compares_only_the_given_keys_both_sides_know(tiny_target: TargetModel) -> None:
    record = {**target_info(tiny_target), "num_layers": 99, "tokenizer_hash": "0123456789ab"}
    check_target(record, tiny_target, "x", keys=("hidden_size", "vocab_size"))  # layers not compared
    check_target(record, tiny_target, "x", keys=("tokenizer_hash",))  # the tiny target has no tokenizer
    with pytest.raises(ValueError, match=r"x was trained for a target with 99 layers"):
        check_target(record, tiny_target, "x", keys=("num_layers",))


def test_a_cache_refuses_another_target(tiny_target: TargetModel, tmp_path: Path) -> None:
    guard_cache(tmp_path / "cache", tiny_target)
    assert json.loads((tmp_path / "cache" / CACHE_RECORD).read_text())["hidden_size"] == 32
    guard_cache(tmp_path / "cache", tiny_target)  # the same target: fine
    other = tiny_random_target(vocab_size=16, seed=1, hidden_size=64)
    with pytest.raises(ValueError, match=r"holds the outputs of a target with hidden size 32.*Pass another cache_dir"):
        guard_cache(tmp_path / "cache", other)


@pytest.mark.slow  # loads the default target's tokenizer (GGUF)
def test_the_tokenizer_hash_is_the_shipped_one_and_a_draft_compares_it() -> None:
    target = tiny_random_target(vocab_size=49152, seed=0, tokenizer="smollm2-135m")
    shipped = json.loads((SHIPPED / "draft" / "draft.json").read_text())[RECORD_KEY]
    assert target_info(target)["tokenizer_hash"] == shipped["tokenizer_hash"]  # deterministic across loads
    other = {**target_info(target), "tokenizer_hash": "0123456789ab"}
    check_target(other, target, "heads", HEADS_KEYS)  # heads do not compare tokenizers
    with pytest.raises(ValueError, match=r"draft was trained for a target with .*tokenizer 0123456789ab"):
        check_target(other, target, "draft", DRAFT_KEYS)
