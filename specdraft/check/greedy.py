"""The greedy audit (temperature 0) and the reference decoder it compares against."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from specdraft.decode import SpeculativeDecoder
from specdraft.target import TargetModel


@torch.inference_mode()
def reference_greedy(
    target: TargetModel, prompt: Sequence[int], max_new_tokens: int, stop_token_ids: Sequence[int] = ()
) -> list[int]:
    """Plain greedy decoding with the Hugging Face model's own forward and DynamicCache, one token
    per step, no specdraft code on the path: what every speculative greedy output must equal (the
    tests and benchmarks/gpu_check.py compare against it). Stops after a token in stop_token_ids
    (included)."""
    model = target.model
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([list(prompt)], device=target.device)  # [1, T]
    out: list[int] = []
    while len(out) < max_new_tokens:
        tok = int(model(ids, cache=cache, use_cache=True).logits[0, -1].argmax())
        out.append(tok)
        if tok in stop_token_ids:
            break
        ids = torch.tensor([[tok]], device=target.device)  # [1, 1]
    return out


def audit_greedy(
    decoder: SpeculativeDecoder, baseline: SpeculativeDecoder, prompts: list[list[int]],
    max_new_tokens: int,
) -> list[int]:
    """Indices of prompts whose speculative greedy output differs from the AR output."""
    return [
        i for i, ids in enumerate(prompts)
        if decoder.generate(ids, max_new_tokens).token_ids.tolist()
        != baseline.generate(ids, max_new_tokens).token_ids.tolist()
    ]
