"""specdraft-export kind=medusa: names, shapes and dtypes of vLLM's Medusa layout
(vllm/model_executor/models/medusa.py, vllm/transformers_utils/configs/medusa.py) and of
FasterDecoding's medusa_lm_head (medusa/model/medusa_model.py), checked by loading the exported
tensors strictly into modules with those engines' module structure, and the merged weights
reproduce the heads' logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from safetensors.torch import load_file

from specdraft.models import tiny_random_target
from drafters.medusa_export import export
from tests.test_medusa import random_heads

VLLM_CONFIG_FIELDS = {"hidden_size", "vocab_size", "num_heads", "num_hidden_layers", "max_paths",
                      "topk", "truncated_vocab_size", "original_lm_head"}


def _apply(tensors: dict, prefix_block: str, prefix_head: str, hidden: torch.Tensor, k: int,
           num_layers: int) -> torch.Tensor:
    x = hidden
    for j in range(num_layers):
        w, b = tensors[f"{prefix_block}{j}.weight"], tensors[f"{prefix_block}{j}.bias"]
        x = x + F.silu(F.linear(x, w, b))
    return F.linear(x, tensors[f"{prefix_head}.weight"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_vllm_layout_names_shapes_dtypes(tmp_path: Path, dtype: torch.dtype) -> None:
    target = tiny_random_target(vocab_size=16, seed=1)
    model = random_heads(target, num_heads=3)
    out = export(model, tmp_path / "vllm", "vllm", dtype=dtype)
    config = json.loads((out / "config.json").read_text())
    assert VLLM_CONFIG_FIELDS <= set(config)
    assert config["num_heads"] == 3 and config["num_hidden_layers"] == 1
    assert config["hidden_size"] == 32 and config["vocab_size"] == 16
    # vLLM builds the ResBlock biases only with medusa_fc_bias (else it silently drops ours), uses
    # per-head projections unless original_lm_head, and sizes them by truncated_vocab_size.
    assert config["medusa_fc_bias"] is True and config["original_lm_head"] is False
    assert config["truncated_vocab_size"] == config["vocab_size"]
    tensors = load_file(str(out / "model.safetensors"))
    expected = {}
    for i in range(3):
        expected[f"blocks.{i}.layers.0.weight"] = (32, 32)
        expected[f"blocks.{i}.layers.0.bias"] = (32,)
        expected[f"lm_heads.{i}.weight"] = (16, 32)
    assert {k: tuple(v.shape) for k, v in tensors.items()} == expected
    assert all(v.dtype == dtype for v in tensors.values())
    if dtype == torch.float32:  # merged LoRA reproduces every head's logits
        hidden = torch.randn(4, 32)
        with torch.no_grad():
            ref = model(hidden)  # [4, K, V]
        for k in range(3):
            got = _apply(tensors, f"blocks.{k}.layers.", f"lm_heads.{k}", hidden, k, 1)
            assert torch.allclose(got, ref[:, k], atol=1e-4)


def test_fasterdecoding_layout(tmp_path: Path) -> None:
    target = tiny_random_target(vocab_size=16, seed=1)
    model = random_heads(target, num_heads=2)
    out = export(model, tmp_path / "fd", "medusa")
    tensors = load_file(str(out / "medusa_lm_head.safetensors"))
    assert set(tensors) == {f"{i}.0.linear.{p}" for i in range(2) for p in ("weight", "bias")} | {
        "0.1.weight", "1.1.weight"}
    config = json.loads((out / "config.json").read_text())
    assert config["medusa_num_heads"] == 2 and config["medusa_num_layers"] == 1
    assert "base_model_name_or_path" in config  # FasterDecoding's loader reads the base model from it
    # FasterDecoding: medusa_head = ModuleList([Sequential(ResBlock(H) * layers, Linear(H, V, bias=False))])
    res_block = nn.Module()
    res_block.linear = nn.Linear(32, 32)
    heads = nn.ModuleList([nn.Sequential(res_block, nn.Linear(32, 16, bias=False)) for _ in range(2)])
    heads.load_state_dict(tensors, strict=True)  # every name and shape as that loader expects
    with pytest.raises(ValueError, match="format"):
        export(model, tmp_path / "x", "onnx")
