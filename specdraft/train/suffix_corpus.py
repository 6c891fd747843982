"""specdraft-suffix-corpus: write the static corpus a suffix drafter reads (`drafters.suffix_corpus`).

The corpus is what the target itself wrote before: the answers of `specdraft-selfgen` runs (one
split; the held-out split stays out) and, optionally, suffix stores a deployment saved
(`SuffixDrafter.save_store`, its requests' outputs). Only answers go in, never prompts: the drafter
predicts what the target writes. Sequences are kept newest last; over `max_tokens` the oldest are
left out. The directory records the target (vocabulary size and tokenizer hash: the drafter refuses
a corpus of other token ids), the sources and the command.

    specdraft-suffix-corpus selfgen=[data/smollm2-135m/selfgen_broad] out_dir=outputs/suffix_corpus
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from drafters.suffix import STORE_FORMAT
from drafters.suffix_corpus import save_corpus
from specdraft.console import hydra_cli
from specdraft.formats.target_info import RECORD_KEY, target_info
from specdraft.outputs import prepare_output_dir
from specdraft.train.selfgen import load_selfgen_records


def store_sequences(path: str | Path) -> list[list[int]]:
    """The requests' outputs in a suffix store file, oldest first."""
    try:
        record = json.loads(Path(path).expanduser().read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"stores: {path} is not a readable suffix store file ({err}).") from err
    if not isinstance(record, dict) or record.get("format") != STORE_FORMAT:
        raise ValueError(f"stores: {path} is not a {STORE_FORMAT} file; write one with SuffixDrafter.save_store.")
    return [[int(t) for t in seq] for seq in record["sequences"]]


def build(cfg: DictConfig) -> Path:
    """Read the sources, check the budget and the output folder, write the corpus; returns its folder."""
    if int(cfg.max_tokens) < 1:
        raise ValueError(f"max_tokens must be >= 1, got {cfg.max_tokens}.")
    selfgen = list(cfg.selfgen or [])
    stores = list(cfg.stores or [])
    if not selfgen and not stores:
        raise ValueError("no sources: name specdraft-selfgen outputs in selfgen=[...] and/or suffix stores "
                         "in stores=[...].")
    out = prepare_output_dir(cfg.out_dir, bool(cfg.overwrite))
    sequences = [r["completion_ids"] for r in load_selfgen_records(cfg.split, selfgen)] if selfgen else []
    for path in stores:
        sequences += store_sequences(path)
    target = instantiate(cfg.target)
    record = {RECORD_KEY: target_info(target),
              "sources": {"selfgen": [str(p) for p in selfgen], "split": cfg.split, "stores": [str(p) for p in stores]},
              "max_tokens": int(cfg.max_tokens),
              "command": "specdraft-suffix-corpus " + " ".join(sys.argv[1:]),
              "config": OmegaConf.to_container(cfg, resolve=True)}
    return save_corpus(sequences, out, record, int(cfg.max_tokens))


@hydra_cli("suffix_corpus")
def main(cfg: DictConfig) -> None:
    """`specdraft-suffix-corpus selfgen=[DIR] out_dir=DIR` (conf/suffix_corpus.yaml)."""
    out = build(cfg)
    print(f"wrote the suffix corpus to {out}")


if __name__ == "__main__":
    main()
