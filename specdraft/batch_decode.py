"""Plain autoregressive decoding of many prompts at once, left padded, through `TargetModel`.

One forward per step for the whole batch amortises the weights over its rows: a decode step on CPU
streams every weight whatever the batch, so B rows cost far less than B steps. Prompts of different
lengths are left padded; the padding is masked out of every attention and each row's positions
count its own tokens only, so a row decodes as it would alone (up to float rounding in a batched
product). Finished rows leave the batch (`TargetModel.keep_rows`) once a quarter of it has
finished, so stragglers do not make the whole batch pay for their length. The target
runs on its fast stack when it has one (the same path as speculative decoding), else on Hugging
Face's. This is the self-distillation data's generator (`specdraft.train.selfgen`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from specdraft.ragged import padding_mask
from specdraft.sampling import SamplingConfig, draw, warp
from specdraft.target import TargetModel


@torch.inference_mode()
def decode_batch(target: TargetModel, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 sampling: SamplingConfig, stop_ids: Sequence[int]) -> list[tuple[list[int], bool]]:
    """Continue every prompt by up to `max_new_tokens` tokens in one batch: per row, (the new ids up
    to and including the first stop id, whether it stopped). Sampling draws from one generator
    seeded with `sampling.seed` (the same call gives the same tokens)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("decode_batch needs at least one prompt, and every prompt needs at least one token.")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
    width = max(len(p) for p in prompts)
    if width + max_new_tokens > target.max_context:
        raise ValueError(f"a prompt of {width} tokens + {max_new_tokens} new ones exceeds the target's "
                         f"context of {target.max_context}; shorten it or lower max_new_tokens.")
    batch, pad_id = len(prompts), 0  # the padding id never counts: masked in, cut off out
    ids = torch.full((batch, width), pad_id, dtype=torch.long)  # [B, W] left padded
    valid = torch.zeros((batch, width), dtype=torch.bool)  # [B, W]
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        valid[i, width - len(p):] = True
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)  # [B, W]: each row counts its own tokens
    gen = sampling.make_generator("cpu")
    stops = torch.tensor(sorted(set(stop_ids)), dtype=torch.long)
    out = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long)  # [B, N]
    rows = torch.arange(batch)  # [b]: the prompts still in the batch, in cache row order
    done = torch.zeros(batch, dtype=torch.bool)  # [b]
    target.reset()
    try:
        logits = target.forward(ids.to(target.device), num_logits=1,
                                attention_mask=padding_mask(valid, width, torch.float32).to(target.device),
                                position_ids=positions.to(target.device)).logits  # [b, 1, V]
        last = positions[:, -1:]  # [b, 1]
        for step in range(max_new_tokens):
            token = draw(warp(logits[:, -1], sampling), sampling, gen).cpu()  # [b]
            token = torch.where(done, torch.full_like(token, pad_id), token)
            out[rows, step] = token
            done |= torch.isin(token, stops)
            if bool(done.all()) or step == max_new_tokens - 1:
                break
            valid = torch.cat([valid, torch.ones((len(rows), 1), dtype=torch.bool)], dim=1)  # [b, W + step + 1]
            if 4 * int(done.sum()) >= len(rows):  # a quarter finished: they leave the batch
                keep = (~done).nonzero().squeeze(1)  # [b']
                target.keep_rows(keep.tolist())
                rows, done, valid, last, token = rows[keep], done[keep], valid[keep], last[keep], token[keep]
            last = last + 1
            logits = target.forward(token[:, None].to(target.device), num_logits=1,
                                    attention_mask=padding_mask(valid, 1, torch.float32).to(target.device),
                                    position_ids=last.to(target.device)).logits  # [b, 1, V]
    finally:
        target.reset()  # the next user of the target starts from an empty batch-1 cache
    results = []
    stop_set = set(stop_ids)
    for row in out.tolist():
        cut = next((k + 1 for k, t in enumerate(row) if t in stop_set), None)
        results.append((row[:cut], True) if cut is not None else (row, False))
    return results
