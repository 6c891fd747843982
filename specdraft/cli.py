"""`specdraft-generate`: one prompt (or chat message) through one drafter; prints the text on
stdout and the stats on stderr (so `> out.txt` keeps only the text).

    specdraft-generate drafter=ngram num_draft_tokens=6 sampling=sample sampling.temperature=0.7 \
        'prompt="Rewrite this code: ..."'
    echo "Hello, world! What is f(x)=x+1?" | specdraft-generate prompt_file=-

Hydra parses `key=value`: a prompt with spaces, commas, '=' or brackets needs the quotes shown.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig

from specdraft.build import make_decoder, make_drafter, make_sampling, prompt_text, prompt_token_ids
from specdraft.console import hydra_cli
from specdraft.draft_length import check_max_draft_tokens, check_num_draft_tokens


def run_generate(cfg: DictConfig) -> dict:
    """Generate once; returns the printed record (text + stats) as a dict. Every setting is checked
    before the model loads."""
    text = prompt_text(cfg.prompt, cfg.get("prompt_file"))
    make_sampling(cfg.sampling)
    check_num_draft_tokens(cfg.num_draft_tokens)
    check_max_draft_tokens(cfg.max_draft_tokens)
    if isinstance(cfg.max_new_tokens, bool) or not isinstance(cfg.max_new_tokens, int) or cfg.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {cfg.max_new_tokens!r}.")
    if cfg.get("output_json"):
        check_writable_file(cfg.output_json)
    target = instantiate(cfg.target)
    drafter = make_drafter(cfg.drafter)
    decoder = make_decoder(cfg, target, drafter)
    ids = prompt_token_ids(target.tokenizer, text, chat=cfg.chat, system=cfg.system)
    result = decoder.generate(ids, cfg.max_new_tokens)
    out_text = target.tokenizer.decode(result.token_ids[0], skip_special_tokens=True)
    s = result.stats
    print(out_text)
    print(
        f"\n[{type(drafter).__name__ if drafter else 'autoregressive'}] {s.new_tokens} tokens, "
        f"{s.tokens_per_s:.1f} tok/s, acceptance {s.acceptance_rate:.2f}, "
        f"mean accepted length {s.mean_accepted_length:.2f}, rounds {s.rounds}",
        file=sys.stderr,
    )
    record = {"text": out_text, "token_ids": result.token_ids[0].tolist(), "stats": s.as_dict()}
    if cfg.get("output_json"):
        with open(cfg.output_json, "w") as f:
            json.dump(record, f, indent=1)
    return record


def check_writable_file(path: str) -> None:
    """Fail now, not after the generation, when `path` cannot be written."""
    folder = Path(path).expanduser().resolve().parent
    if not folder.is_dir():
        raise FileNotFoundError(f"output_json={path}: the folder {folder} does not exist; create it first.")
    if not os.access(folder, os.W_OK):
        raise PermissionError(f"output_json={path}: the folder {folder} is not writable; choose another path.")


@hydra_cli("generate")
def generate_main(cfg: DictConfig) -> None:
    run_generate(cfg)
