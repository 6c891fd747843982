"""Batched plain decoding (left padded): each row decodes as it would alone, on both stacks."""

from __future__ import annotations

import pytest
import torch

from specdraft.batch_decode import decode_batch
from specdraft.ragged import padding_mask
from specdraft.models import tiny_random_target
from specdraft.sampling import SamplingConfig

GREEDY = SamplingConfig(temperature=0.0)


def test_padding_mask_hides_padding_and_the_future() -> None:
    valid = torch.tensor([[False, True, True], [True, True, True]])
    mask = padding_mask(valid, 3, torch.float32)  # [2, 1, 3, 3]
    seen = mask[:, 0] == 0
    assert seen[0].tolist() == [[True, False, False], [False, True, False], [False, True, True]]  # pad sees itself
    assert seen[1].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert (padding_mask(valid, 1, torch.float32)[:, 0, 0] == 0).tolist() == [[False, True, True], [True, True, True]]


@pytest.mark.parametrize("fast", [True, False])
def test_every_row_of_a_batch_equals_its_own_greedy_decoding(fast: bool) -> None:
    target = tiny_random_target(vocab_size=96, seed=3, hidden_size=32, num_layers=2, fast=fast)
    prompts = [[5, 9, 17, 3, 44, 12, 7], [8, 2], [30, 31, 32, 33]]
    rows = decode_batch(target, prompts, 10, GREEDY, [])
    for p, (ids, done) in zip(prompts, rows, strict=True):
        with torch.inference_mode():
            alone = target.model.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False, pad_token_id=0)
        assert ids == alone[0, len(p):].tolist() and not done
    assert target.cache_length == 0  # the target is left empty for its next user


@pytest.mark.parametrize("fast", [True, False])
def test_rows_stop_on_their_own_stop_token_leave_the_batch_and_sampling_is_seeded(fast: bool) -> None:
    target = tiny_random_target(vocab_size=96, seed=3, hidden_size=32, num_layers=2, fast=fast)
    prompts = [[5, 9, 17], [8, 2, 1, 1], [40, 41], [7] * 6]
    free = decode_batch(target, prompts, 12, GREEDY, [])
    stop = free[0][0][3]  # row 0 stops at step 4; the others (sooner, later or never) go on without it
    cut = decode_batch(target, prompts, 12, GREEDY, [stop])
    for (ids, _), (short, done) in zip(free, cut, strict=True):
        if stop in ids:
            assert done and short == ids[: ids.index(stop) + 1]
        else:
            assert not done and short == ids
    hot = SamplingConfig(temperature=1.0, seed=7)
    assert decode_batch(target, prompts, 8, hot, []) == decode_batch(target, prompts, 8, hot, [])
    assert decode_batch(target, prompts, 8, hot, []) != decode_batch(target, prompts, 8, SamplingConfig(temperature=1.0, seed=8), [])


def test_bad_input_is_named() -> None:
    target = tiny_random_target(vocab_size=32, seed=0, hidden_size=16, num_layers=1)
    with pytest.raises(ValueError, match="at least one token"):
        decode_batch(target, [[1], []], 4, GREEDY, [])
    with pytest.raises(ValueError, match="context"):
        decode_batch(target, [[1] * 10], 10**7, GREEDY, [])
