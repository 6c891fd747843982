"""Medusa heads in the layouts other engines load (`specdraft-export kind=medusa`).

The LoRA deltas are merged into full per-head projections (W + (alpha/r) B A), because neither
engine knows about a shared lm_head plus low-rank deltas.

format=vllm (default): a directory vLLM's Medusa speculative model loads:
    config.json        model_type "medusa", architectures ["MedusaModel"], hidden_size,
                       vocab_size, num_heads, num_hidden_layers (ResBlocks per head), max_paths,
                       topk, truncated_vocab_size, original_lm_head, medusa_fc_bias
    model.safetensors  blocks.{i}.layers.{j}.weight [H, H], blocks.{i}.layers.{j}.bias [H],
                       lm_heads.{i}.weight [V, H]
  Layout per vLLM's vllm/model_executor/models/medusa.py (ResidualBlock.layers, Medusa.blocks,
  Medusa.lm_heads; `medusa_fc_bias` switches the block biases on) and config class
  vllm/transformers_utils/configs/medusa.py (MedusaConfig); checked against stored copies of
  both files on 2026-11-30 (vLLM strips a "medusa_heads." prefix, reads lm_heads.0 as the shared
  head only when original_lm_head is true, and sizes the heads by truncated_vocab_size).
format=medusa: the FasterDecoding/Medusa head file medusa_lm_head.safetensors with keys
    {i}.{j}.linear.weight / .bias and {i}.{num_layers}.weight (the state dict of its
    `medusa_head` ModuleList of nn.Sequential(ResBlock..., Linear(bias=False))), plus a
    config.json with medusa_num_heads / medusa_num_layers / base_model_name_or_path (its
    MedusaConfig; from_pretrained loads the base model from that name).

A non-empty `out_dir` is refused unless `overwrite=true`, and the folder is checked writable before
the target loads (`specdraft.outputs`); heads trained for another target are a clear error
(`specdraft.formats.medusa_heads.check_heads_target`).

    specdraft-export kind=medusa format=vllm source=smollm2-135m out_dir=outputs/medusa_vllm   (conf/export.yaml)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from safetensors.torch import save_file
from torch import Tensor, nn

from drafters.medusa_forms import CompiledHeads
from specdraft.formats.medusa_heads import (
    check_heads_target,
    load_heads,
    resolve_heads_dir,
)
from specdraft.outputs import prepare_output_dir

FORMATS = ("vllm", "medusa")


@torch.no_grad()
def _linear_weights(linear: nn.Module) -> tuple[Tensor, Tensor]:
    """(weight [out, in], bias [out]) of a Linear, with any PEFT LoRA delta merged in."""
    base = getattr(linear, "base_layer", linear)
    weight = base.weight.detach().clone()
    lora_a = getattr(linear, "lora_A", None)
    if isinstance(lora_a, nn.ModuleDict) and len(lora_a) > 0:
        name = next(iter(lora_a.keys()))
        weight += float(linear.scaling[name]) * linear.lora_B[name].weight @ lora_a[name].weight
    return weight, base.bias.detach().clone()


@torch.no_grad()
def merged_heads(model: nn.Module) -> tuple[list[list[tuple[Tensor, Tensor]]], list[Tensor]]:
    """Per head: the ResBlocks' (weight, bias) and the merged projection [V, H]."""
    compiled = CompiledHeads(model)
    if compiled.recurrent:
        raise ValueError(
            "these are recurrent heads (each reads the token drafted before it): neither vLLM's "
            "Medusa loader nor FasterDecoding/Medusa has that architecture. Export heads trained "
            "with recurrent=false (the shipped 'smollm2-135m' heads)."
        )
    blocks = [[_linear_weights(res.linear) for res in head] for head in compiled.blocks]
    projections = []
    for w, factors in zip(compiled.weights, compiled.lora):
        merged = w.clone()
        if factors is not None:
            a, b, s = factors
            merged += s * b @ a  # [V, H]
        projections.append(merged)
    return blocks, projections


def export(model: nn.Module, out_dir: str | Path, fmt: str = "vllm",
           dtype: torch.dtype = torch.float32, topk: int = 10, max_paths: int = 64,
           base_model: str | None = None, overwrite: bool = False) -> Path:
    """Write the heads of `model` (PEFT-wrapped or plain MedusaHeads) in format `fmt`.
    base_model: the target's hub id or path, recorded for FasterDecoding's loader. overwrite:
    write into a non-empty out_dir (else FileExistsError)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}.")
    out = prepare_output_dir(out_dir, overwrite)
    blocks, projections = merged_heads(model)
    num_heads, num_layers = len(blocks), len(blocks[0])
    vocab, hidden = projections[0].shape
    tensors: dict[str, Tensor] = {}
    for i, (head, proj) in enumerate(zip(blocks, projections)):
        for j, (w, b) in enumerate(head):
            key = f"blocks.{i}.layers.{j}" if fmt == "vllm" else f"{i}.{j}.linear"
            tensors[f"{key}.weight"] = w.to(dtype).contiguous()
            tensors[f"{key}.bias"] = b.to(dtype).contiguous()
        key = f"lm_heads.{i}" if fmt == "vllm" else f"{i}.{num_layers}"
        tensors[f"{key}.weight"] = proj.to(dtype).contiguous()
    if fmt == "vllm":
        config = {
            "model_type": "medusa",
            "architectures": ["MedusaModel"],
            "hidden_size": hidden,
            "vocab_size": vocab,
            "num_heads": num_heads,
            "num_hidden_layers": num_layers,
            "max_paths": max_paths,
            "topk": topk,
            "truncated_vocab_size": vocab,
            "original_lm_head": False,
            "medusa_fc_bias": True,
            "torch_dtype": str(dtype).removeprefix("torch."),
        }
        save_file(tensors, str(out / "model.safetensors"))
    else:
        config = {"medusa_num_heads": num_heads, "medusa_num_layers": num_layers,
                  "base_model_name_or_path": base_model, "hidden_size": hidden, "vocab_size": vocab}
        save_file(tensors, str(out / "medusa_lm_head.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def export_from_config(cfg: DictConfig, base_model: str) -> Path:
    """Load the heads named by cfg.source onto cfg.target's embeddings and export them
    (`specdraft-export kind=medusa`, which has checked the request). base_model: the target's
    hub id or path, recorded for FasterDecoding's loader."""
    heads = resolve_heads_dir(cfg.source)  # before loading the target
    target = instantiate(cfg.target)
    check_heads_target(heads, target)
    source = target.model
    model = load_heads(heads, source.get_output_embeddings().weight, source.get_input_embeddings().weight)
    return export(model, cfg.out_dir, cfg.format, getattr(torch, cfg.dtype), topk=cfg.medusa.topk,
                  max_paths=cfg.medusa.max_paths, base_model=base_model, overwrite=bool(cfg.overwrite))
