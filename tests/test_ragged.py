"""Ragged rows in one KV cache (`specdraft.ragged`, `TargetModel.forward(valid=)` / `crop(rows)`):
each row's cached K/V equal a fresh forward over that row's own tokens alone, after rounds that
keep different numbers of tokens per row, after compaction and after rows leave."""

from __future__ import annotations

import pytest
import torch

from specdraft import ragged
from specdraft.models import tiny_random_target
from specdraft.ragged import RowLayout
from specdraft.target import TargetModel


def test_positions_count_each_rows_own_tokens_and_crop_marks_holes() -> None:
    layout = RowLayout(torch.tensor([[False, True, True], [True, True, True]]))
    mask, positions = layout.inputs(torch.tensor([[True, True], [True, False]]), torch.float32)
    assert positions.tolist() == [[2, 3], [3, 3]]  # a padding input repeats its row's last position
    assert mask.shape == (2, 1, 2, 5)
    assert ((mask[1, 0, 1] == 0).tolist()) == [True, True, True, True, True]  # padding sees itself
    assert ((mask[1, 0, 0] == 0).tolist()) == [True, True, True, True, False]
    layout.append(torch.tensor([[True, True], [True, False]]))
    assert layout.row_lengths().tolist() == [4, 4]
    width = layout.crop_rows(torch.tensor([3, 4]))  # row 0 rolls back its newest token
    assert width == 4 and layout.valid.tolist() == [[False, True, True, True], [True, True, True, True]]
    width = layout.crop_rows(torch.tensor([1, 2]))
    assert width == 2 and layout.valid.tolist() == [[False, True], [True, True]]


def test_compaction_packs_rows_to_the_right_in_order() -> None:
    valid = torch.tensor([[True, False, False, True, False, True], [True, True, False, False, False, False]])
    layout = RowLayout(valid.clone())
    index = layout.compaction()
    assert index is not None and index.shape == (2, 3)
    assert index[0].tolist() == [0, 3, 5]  # row 0's own columns, in order
    assert index[1, 1:].tolist() == [0, 1]  # row 1 left padded by one
    layout.packed()
    assert layout.valid.tolist() == [[True, True, True], [False, True, True]]
    assert RowLayout(torch.ones((2, 4), dtype=torch.bool)).compaction() is None  # no holes: no copy


def row_kv(target: TargetModel, row: int) -> list[torch.Tensor]:
    """Row `row`'s own cached keys per layer [kv_heads, n, D] (its valid columns, in order)."""
    cols = target.row_lengths()[row]
    layout = target._stack.layout  # the test reads the private layout to pick the row's columns
    mask = layout.valid[row] if layout is not None else torch.ones(target.cache_length, dtype=torch.bool)
    out = [k[row][:, mask] for k, _ in target.cache_tensors()]
    assert all(t.shape[1] == cols for t in out)
    return out


def alone_kv(target_factory, tokens: list[int]) -> list[torch.Tensor]:
    alone = target_factory()
    alone.reset()
    alone.forward(torch.tensor([tokens]), num_logits=0)
    return [k[0] for k, _ in alone.cache_tensors()]


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("compact", [False, True])
def test_each_row_cache_equals_its_own_forward_after_ragged_rounds(
    fast: bool, compact: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if compact:  # pack after every rollback that leaves any hole
        monkeypatch.setattr(ragged, "COMPACT_FRACTION", 0.0)

    def make() -> TargetModel:
        return tiny_random_target(vocab_size=64, seed=5, hidden_size=32, num_layers=2, fast=fast)

    target = make()
    rows = [[3, 9, 4, 11, 20, 7], [5, 6], [8, 1, 2, 40]]
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])  # [3, 6] left padded
    valid = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    target.reset()
    logits = target.forward(ids, valid=valid).logits  # [3, 6, V]
    for i, r in enumerate(rows):  # the last real position of every row scores like the row alone
        alone = make().model(torch.tensor([r])).logits[0, -1]
        torch.testing.assert_close(logits[i, -1], alone, atol=1e-4, rtol=1e-4)
    gen = torch.Generator().manual_seed(0)
    for step in range(5):  # rounds of 4 new tokens per row, each row keeping its own number
        new = torch.randint(1, 64, (3, 4), generator=gen)
        real = torch.arange(4)[None] < torch.tensor([[4], [2 + step % 3], [3]])  # [3, 4] ragged drafts
        before = target.row_lengths()
        target.forward(new, valid=real)
        keep = [int(torch.randint(0, int(real[i].sum()) + 1, (), generator=gen)) for i in range(3)]
        target.crop([n + k for n, k in zip(before, keep)])
        for i in range(3):
            rows[i] = rows[i] + new[i, : keep[i]].tolist()
        assert target.row_lengths() == [len(r) for r in rows]
        for i, r in enumerate(rows):
            for got, want in zip(row_kv(target, i), alone_kv(make, r)):
                torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    target.keep_rows([2, 0])  # row 1 finished: the others stay exact
    rows = [rows[2], rows[0]]
    assert target.row_lengths() == [len(r) for r in rows]
    for i, r in enumerate(rows):
        for got, want in zip(row_kv(target, i), alone_kv(make, r)):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_left_padded_tells_a_batch_of_prompts_from_holes() -> None:
    assert ragged.left_padded(torch.tensor([[False, True, True], [True, True, True], [False, False, False]]))
    assert not ragged.left_padded(torch.tensor([[True, False, True]]))  # a hole
    assert not ragged.left_padded(torch.tensor([[True, True, False]]))  # right padded


def test_packed_prefill_equals_the_masked_padded_prefill() -> None:
    """The fast stack's packed prefill of ragged prompts (no work on the padding) leaves the same K/V
    in every row's own columns, and the same hidden states there, as the padded forward with the
    layout's mask; a row with no own token (a one-token prompt) is allowed."""
    target = tiny_random_target(vocab_size=64, seed=3, hidden_size=32, num_layers=2, fast=True)
    stack = target._stack  # the test drives both stack paths directly
    rows = [[3, 9, 4, 11, 20, 7, 1], [5, 6], [], [8, 1, 2, 40]]
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])  # [4, 7] left padded
    valid = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    stack.reset(len(rows))
    packed = stack.prefill_packed(ids, valid)  # [4, 7, H]
    packed_kv = [(k.clone(), v.clone()) for k, v in stack.layer_tensors()]
    stack.reset(len(rows))
    mask, positions = RowLayout(valid[:, :0]).inputs(valid, torch.float32)
    masked, _ = stack.forward(ids, mask, positions)
    assert packed.shape == masked.shape
    torch.testing.assert_close(packed[valid], masked[valid], atol=1e-5, rtol=1e-5)
    assert not packed[~valid].any()
    for (pk, pv), (mk, mv) in zip(packed_kv, stack.layer_tensors()):
        cols = valid[:, None, :, None].expand_as(pk)  # [B, kvh, W, D]
        torch.testing.assert_close(pk[cols], mk[cols], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(pv[cols], mv[cols], atol=1e-5, rtol=1e-5)
        assert not pk[~cols].any() and not pv[~cols].any()  # padding columns hold zeros, never NaN


def test_packed_continuation_equals_the_masked_padded_forward() -> None:
    """After a ragged prefill, a continuation whose rows bring different numbers of tokens (rows that
    drafted less, right padded) gives, packed, the hidden states and K/V of every row's own columns
    that the padded forward with the layout's mask gives; padding columns hold zeros."""
    target = tiny_random_target(vocab_size=64, seed=5, hidden_size=32, num_layers=2, fast=True)
    stack = target._stack  # the test drives both stack paths directly
    prompts = [[3, 9, 4, 11, 20], [5, 6], [8, 1, 2]]
    width = max(len(r) for r in prompts)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in prompts])  # [3, 5] left padded
    valid = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in prompts])
    step = torch.tensor([[7, 12, 30, 2], [4, 0, 0, 0], [9, 10, 0, 0]])  # [3, 4]: 4, 1 and 2 own tokens
    step_valid = step != 0
    results = []
    for packed in (True, False):
        stack.reset(len(prompts))
        layout = RowLayout(valid[:, :0])
        stack.start_layout(layout)
        mask, positions = layout.inputs(valid, torch.float32)
        stack.forward(ids, mask, positions)
        layout.append(valid)
        mask, positions = layout.inputs(step_valid, torch.float32)
        if packed:
            hidden = stack.forward_packed(step, step_valid, mask, positions)
        else:
            hidden, _ = stack.forward(step, mask, positions)
        results.append((hidden, [(k[:, :, width:].clone(), v[:, :, width:].clone()) for k, v in stack.layer_tensors()]))
    (packed_hidden, packed_kv), (masked_hidden, masked_kv) = results
    torch.testing.assert_close(packed_hidden[step_valid], masked_hidden[step_valid], atol=1e-5, rtol=1e-5)
    assert not packed_hidden[~step_valid].any()
    for (pk, pv), (mk, mv) in zip(packed_kv, masked_kv):
        cols = step_valid[:, None, :, None].expand_as(pk)  # [B, kvh, 4, D]
        torch.testing.assert_close(pk[cols], mk[cols], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(pv[cols], mv[cols], atol=1e-5, rtol=1e-5)
        assert not pk[~cols].any() and not pv[~cols].any()


def test_bad_crops_are_named() -> None:
    target = tiny_random_target(vocab_size=32, seed=0, hidden_size=16, num_layers=1)
    target.reset()
    target.forward(torch.tensor([[1, 2, 3], [4, 5, 6]]), num_logits=0)
    with pytest.raises(ValueError, match="cannot crop rows"):
        target.crop([1, 4])
    with pytest.raises(ValueError, match="cannot crop rows"):
        target.crop([1])
    target.crop([1, 2])
    assert target.ragged and target.row_lengths() == [1, 2]
    with pytest.raises(ValueError, match="batch size 1"):
        target.forward_prefix(torch.tensor([[1], [2]]), 1)
