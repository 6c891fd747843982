"""The distilled-draft artifact: only the weights a draft adds to its target, rebuilt on load.

A distilled draft (`specdraft-train-draft`) is the target's token embeddings (shared), copies of a
few of its decoder layers (trained), a copy of its final norm (trained) and an lm_head tied to the
embeddings. The artifact stores only what the target does not have:

    <dir>/draft.safetensors   decoder layers + final norm, float16 (`new_weights`)
    <dir>/draft.json          {"layer_ids": [...], "target_model": {the target's record}, ...how it was made}
    <dir>/pruned_vocab.json   the head's pruned vocabulary (`specdraft.vocab.VOCAB_FILE`)

`load_draft_artifact` rebuilds the draft from the target it was distilled from, after checking that
the target is one the draft was made for (`specdraft.formats.target_info`: hidden size, vocabulary
and tokenizer). Used by `drafters.draft_model` (loading) and `specdraft.train.distill` (saving).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import LlamaForCausalLM, PreTrainedModel

from specdraft.formats.target_info import (
    DRAFT_KEYS,
    check_target,
    from_shapes,
    read_record,
)
from specdraft.shipped import artifact_label
from specdraft.vocab import VOCAB_FILE, PrunedVocab

if TYPE_CHECKING:
    from specdraft.target import TargetModel

ARTIFACT_FILE = "draft.safetensors"
META_FILE = "draft.json"
NEW_WEIGHT_PREFIXES = ("model.layers.", "model.norm.")  # what a draft adds to its target


def build_student(target_model: PreTrainedModel, layer_ids: Sequence[int]) -> LlamaForCausalLM:
    """A Llama draft: the target's embeddings (shared tensor, frozen), copies of the target's decoder
    layers `layer_ids` (in order), a copy of its final norm, and an lm_head tied to the embeddings.

    Works for Llama-architecture targets (the default); other targets need their own builder.
    """
    cfg = target_model.config
    if getattr(cfg, "model_type", None) != "llama":
        raise ValueError(
            f"build_student initialises drafts from Llama targets, got model_type="
            f"{getattr(cfg, 'model_type', None)!r}; pass your own draft model to DraftModelDrafter."
        )
    n_target = int(cfg.num_hidden_layers)
    if not layer_ids or any(not 0 <= i < n_target for i in layer_ids):
        raise ValueError(f"student layer ids must be in [0, {n_target}), got {list(layer_ids)}.")
    dcfg = cfg.__class__.from_dict(cfg.to_dict())
    dcfg.num_hidden_layers = len(layer_ids)
    dcfg.tie_word_embeddings = True
    if getattr(dcfg, "layer_types", None) is not None:
        dcfg.layer_types = [dcfg.layer_types[i] for i in layer_ids]
    with torch.device("meta"):
        student = LlamaForCausalLM(dcfg)
    student.model.embed_tokens = target_model.get_input_embeddings()
    student.model.layers = nn.ModuleList()
    for new_idx, i in enumerate(layer_ids):
        layer = copy.deepcopy(target_model.model.layers[i])
        layer.self_attn.layer_idx = new_idx
        layer.self_attn.config = student.config  # the clone's own config copy would ignore set_attn_implementation
        student.model.layers.append(layer)
    student.model.norm = copy.deepcopy(target_model.model.norm)
    student.model.rotary_emb = copy.deepcopy(target_model.model.rotary_emb)
    student.lm_head = nn.Linear(dcfg.hidden_size, dcfg.vocab_size, bias=False)
    student.lm_head.weight = student.model.embed_tokens.weight
    student.model.embed_tokens.weight.requires_grad_(False)
    return student.eval()


def new_weights(student: LlamaForCausalLM) -> dict[str, Tensor]:
    """The student's weights that the target does not have: decoder layers + final norm."""
    return {k: v.detach() for k, v in student.state_dict().items() if k.startswith(NEW_WEIGHT_PREFIXES)}


def is_draft_artifact(path: str | Path) -> bool:
    """Whether `path` is a directory written by `save_draft_artifact`."""
    p = Path(path)
    return p.is_dir() and (p / META_FILE).is_file() and (p / ARTIFACT_FILE).is_file()


def save_draft_artifact(
    student: LlamaForCausalLM, vocab: PrunedVocab, layer_ids: Sequence[int], export_dir: str | Path,
    meta: dict[str, Any],
) -> None:
    """Write only the new weights (float16), the pruned vocabulary and how the draft was made."""
    out = Path(export_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.half().contiguous() for k, v in new_weights(student).items()}, str(out / ARTIFACT_FILE))
    vocab.save(out / VOCAB_FILE)
    (out / META_FILE).write_text(json.dumps({"layer_ids": list(layer_ids), **meta}, indent=2) + "\n")


def draft_layer_ids(export_dir: str | Path) -> list[int]:
    """The target layers a saved draft was initialised from (its `draft.json`)."""
    return [int(i) for i in json.loads((Path(export_dir) / META_FILE).read_text())["layer_ids"]]


def draft_record(export_dir: str | Path) -> dict[str, Any]:
    """The target a saved draft was made for: its draft.json record, or (a draft saved before
    records existed) the hidden size of its final norm and its pruned vocabulary's size."""
    d = Path(export_dir)
    return read_record(d / META_FILE) or from_shapes(
        d / ARTIFACT_FILE, hidden=lambda name: name == "model.norm.weight", vocab_file=d / VOCAB_FILE)


def check_draft_target(export_dir: str | Path, target: TargetModel) -> None:
    """A ValueError naming both targets when `target` is not one the draft was made for."""
    check_target(draft_record(export_dir), target, artifact_label(export_dir), DRAFT_KEYS,
                 fix="Use a draft distilled from this target (specdraft-train-draft target=... export_dir=...).")


def load_draft_artifact(export_dir: str | Path, target: TargetModel) -> LlamaForCausalLM:
    """Rebuild a draft saved by `save_draft_artifact` from the target it was distilled from, on the
    target's device and dtype (a clear error first if `target` is another model). Its pruned
    vocabulary (`VOCAB_FILE` beside it) is read by `specdraft.vocab.resolve_pruned_vocab`."""
    d = Path(export_dir)
    for name in (ARTIFACT_FILE, META_FILE):
        if not (d / name).is_file():
            raise ValueError(
                f"draft artifact {str(d)!r} has no {name}; train one with `specdraft-train-draft "
                f"export_dir={d}` or pass an existing draft."
            )
    check_draft_target(d, target)
    target_model = target.model
    student = build_student(target_model, draft_layer_ids(d))
    weights = load_file(str(d / ARTIFACT_FILE))
    dtype = target_model.get_input_embeddings().weight.dtype
    loaded = student.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, strict=False)
    if loaded.unexpected_keys:
        raise ValueError(f"draft artifact {str(d)!r} has unexpected weights {loaded.unexpected_keys[:3]}.")
    device = target_model.get_input_embeddings().weight.device
    return student.to(device).eval()
