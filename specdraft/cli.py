"""`specdraft-generate`: one prompt (or chat message) through one drafter; prints text + stats.

    specdraft-generate drafter=ngram drafter.max_ngram=4 num_draft_tokens=6 \
        sampling=sample sampling.temperature=0.7 prompt="Rewrite this code: ..."
"""

from __future__ import annotations

import json

from hydra.utils import instantiate
from omegaconf import DictConfig

from specdraft.build import make_decoder, make_drafter, prompt_token_ids
from specdraft.console import hydra_cli


def run_generate(cfg: DictConfig) -> dict:
    """Generate once; returns the printed record (text + stats) as a dict."""
    target = instantiate(cfg.target)
    drafter = make_drafter(cfg.drafter)
    decoder = make_decoder(cfg, target, drafter)
    ids = prompt_token_ids(target.tokenizer, cfg.prompt, chat=cfg.chat, system=cfg.system)
    result = decoder.generate(ids, cfg.max_new_tokens)
    text = target.tokenizer.decode(result.token_ids[0], skip_special_tokens=True)
    s = result.stats
    print(text)
    print(
        f"\n[{type(drafter).__name__ if drafter else 'autoregressive'}] {s.new_tokens} tokens, "
        f"{s.tokens_per_s:.1f} tok/s, acceptance {s.acceptance_rate:.2f}, "
        f"mean accepted length {s.mean_accepted_length:.2f}, rounds {s.rounds}"
    )
    record = {"text": text, "token_ids": result.token_ids[0].tolist(), "stats": s.as_dict()}
    if cfg.get("output_json"):
        with open(cfg.output_json, "w") as f:
            json.dump(record, f, indent=1)
    return record


@hydra_cli("generate")
def generate_main(cfg: DictConfig) -> None:
    run_generate(cfg)
