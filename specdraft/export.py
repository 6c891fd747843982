"""specdraft-export: write a trained drafter in the layout a serving engine loads (one command for
every exportable drafter; conf/export.yaml).

kind=eagle format=vllm: the speculators EAGLE-3 directory vLLM's `llama_eagle3.py` and SGLang
    load (`specdraft.formats.eagle_head` documents the names, shapes and dtypes). Our heads are
    stored in that format already; the export checks the head against the target, re-casts the
    weights to `dtype`, names the verifier by its hub id (what vLLM's `--model` serves) and keeps
    how the head was made.
kind=medusa format=vllm | medusa: Medusa heads with their LoRA deltas merged, in vLLM's or
    FasterDecoding/Medusa's layout (`drafters.medusa_export`).

Everything that can be checked without the target (format, dtype, the source, the output folder)
is checked before it loads; a non-empty out_dir is refused unless overwrite=true.

    specdraft-export kind=eagle source=smollm2-135m out_dir=outputs/eagle_vllm
    specdraft-export kind=medusa format=vllm source=smollm2-135m out_dir=outputs/medusa_vllm
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig

from specdraft.build import target_label
from specdraft.console import hydra_cli
from specdraft.formats.eagle_head import CONFIG_FILE, DEFAULT_ARTIFACT, load_head, save_head
from specdraft.outputs import prepare_output_dir
from specdraft.shipped import require_artifact

FORMATS = {"eagle": ("vllm",), "medusa": ("vllm", "medusa")}  # kind (drafter) -> the layouts it exports to
DTYPES = ("float32", "float16", "bfloat16")
MEDUSA_EXPORT = "drafters.medusa_export.export_from_config"
HUB_IDS = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}  # target aliases -> the model's hub id


def verifier_name(target_cfg: DictConfig | dict) -> str:
    """The target as a serving engine names it: the hub id of an alias, else its name_or_path."""
    name = target_label(target_cfg)
    return HUB_IDS.get(name, name)


def check_request(cfg: DictConfig) -> None:
    """The settings that need no model: kind, format, dtype and the output folder."""
    if cfg.kind not in FORMATS:
        raise ValueError(f"kind must be one of {sorted(FORMATS)} (the exportable drafters), got {cfg.kind!r}.")
    if cfg.format not in FORMATS[cfg.kind]:
        raise ValueError(f"format={cfg.format} is not a layout for kind={cfg.kind}: "
                         f"use one of {list(FORMATS[cfg.kind])}.")
    if cfg.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {cfg.dtype!r}.")
    prepare_output_dir(cfg.out_dir, bool(cfg.overwrite))


def export_eagle(cfg: DictConfig) -> Path:
    """Re-write an EAGLE-3 head (a directory or a shipped alias) for vLLM, checked against cfg.target."""
    source = require_artifact(cfg.source, "EAGLE-3 head", default=DEFAULT_ARTIFACT)  # before the target loads
    target = instantiate(cfg.target)
    head = load_head(source, target)
    record = json.loads((source / CONFIG_FILE).read_text())
    provenance = {k: v for k, v in record.get("specdraft", {}).items() if k != "eagle_config"}
    methods = record.get("speculators_config", {}).get("proposal_methods") or [{}]
    tokens = int(methods[0].get("speculative_tokens", 3))
    return save_head(head, cfg.out_dir, target, verifier=verifier_name(cfg.target), speculative_tokens=tokens,
                     provenance=provenance, dtype=getattr(torch, cfg.dtype))


def export_from_config(cfg: DictConfig) -> Path:
    """Check the request, then export (conf/export.yaml)."""
    check_request(cfg)
    if cfg.kind == "eagle":
        return export_eagle(cfg)
    export_medusa = get_method(MEDUSA_EXPORT)  # by name: the core never imports drafters
    return export_medusa(cfg, verifier_name(cfg.target))


@hydra_cli("export")
def main(cfg: DictConfig) -> None:
    """`specdraft-export kind=eagle|medusa format=vllm source=DIR|ALIAS out_dir=DIR` (a user
    error: one `error:` line, exit 2, from `specdraft.console.hydra_cli`)."""
    path = export_from_config(cfg)
    print(f"wrote the {cfg.kind} drafter in the {cfg.format} layout to {path}")


if __name__ == "__main__":
    main()
