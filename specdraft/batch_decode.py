"""Plain autoregressive decoding of many prompts at once: the rows-and-stop-flags form of the one
decoding loop with no drafter (`SpeculativeDecoder(target).generate_batch`).

One forward per step for the whole batch amortises the weights over its rows. Prompts of different
lengths are left padded and masked (the fast stack's prefill computes only their own tokens), each
row counts its own positions (`specdraft.ragged`), so a row decodes as it would alone (up to float
rounding in a batched product), and finished rows leave the batch. This is the self-distillation data's generator (`specdraft.train.selfgen`).
"""

from __future__ import annotations

from collections.abc import Sequence

from specdraft.decode import SpeculativeDecoder
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel


def decode_batch(target: TargetModel, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 sampling: SamplingConfig, stop_ids: Sequence[int]) -> list[tuple[list[int], bool]]:
    """Continue every prompt by up to `max_new_tokens` tokens in one batch: per row, (the new ids up
    to and including the first stop id, whether it stopped). Sampling draws from one generator
    seeded with `sampling.seed` (the same call gives the same tokens)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("decode_batch needs at least one prompt, and every prompt needs at least one token.")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
    decoder = SpeculativeDecoder(target, sampling=sampling)
    try:
        out = decoder.generate_batch([list(p) for p in prompts], max_new_tokens, stop_token_ids=list(stop_ids))
    finally:
        target.reset()  # the next user of the target starts from an empty cache
    stops = set(stop_ids)
    rows = [r.token_ids[0].tolist() for r in out]
    return [(row, bool(row) and row[-1] in stops) for row in rows]
