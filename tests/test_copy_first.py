"""`drafters.copy_first`: each row's copy where it has one, else the model's draft; in a batch the
rows are merged with their own lengths and a one-hot q for copied rows."""

from __future__ import annotations

import pytest
import torch

from drafters.copy_first import CopyFirst, copy_first
from specdraft.protocol import Draft, DraftContext
from specdraft.sampling import SamplingConfig

V = 6


def model_chain(batch: int, k: int, probs: bool = False) -> Draft:
    ids = torch.arange(batch * k).reshape(batch, k) % V  # [B, K]
    q = torch.softmax(torch.randn(batch, k, V, generator=torch.Generator().manual_seed(0)), -1) if probs else None
    return Draft(token_ids=ids, probs=q)


def test_every_row_copies_and_the_model_is_not_asked() -> None:
    copy = Draft(token_ids=torch.tensor([[3, 4]]))

    def refuse() -> Draft:
        raise AssertionError("the model was asked to draft although every row copies")

    assert copy_first(copy, refuse, V) is copy


def test_no_copy_at_batch_size_one_returns_the_models_draft_as_it_is() -> None:
    tree = Draft(token_ids=torch.tensor([[1, 2, 3]]), parents=torch.tensor([[-1, -1, 0]]))
    assert copy_first(Draft(token_ids=torch.empty((1, 0), dtype=torch.long)), lambda: tree, V) is tree


def test_a_batch_merges_rows_with_their_own_lengths_and_one_hot_q_for_copies() -> None:
    copy = Draft(token_ids=torch.tensor([[5, 1, 2], [0, 0, 0]]), lengths=torch.tensor([3, 0]))
    model = model_chain(2, 2, probs=True)
    out = copy_first(copy, lambda: model, V)
    assert out.token_ids.tolist() == [[5, 1, 2], model.token_ids[1].tolist() + [0]]
    assert out.lengths.tolist() == [3, 2]
    assert torch.equal(out.probs[0], torch.eye(V)[[5, 1, 2]])
    assert torch.equal(out.probs[1, :2], model.probs[1])
    assert torch.allclose(out.probs.sum(-1), torch.ones(2, 3))  # padding is a valid one-hot too
    greedy = copy_first(copy, lambda: model_chain(2, 2), V)
    assert greedy.probs is None and greedy.token_ids.tolist() == out.token_ids.tolist()


def test_a_batch_where_no_row_copies_is_the_models_draft() -> None:
    model = model_chain(2, 3)
    empty = Draft(token_ids=torch.zeros((2, 0), dtype=torch.long), lengths=torch.tensor([0, 0]))
    assert copy_first(empty, lambda: model, V) is model


def test_a_tree_in_a_batch_is_refused() -> None:
    copy = Draft(token_ids=torch.tensor([[5], [0]]), lengths=torch.tensor([1, 0]))
    tree = Draft(token_ids=torch.tensor([[1, 2], [3, 4]]), parents=torch.tensor([[-1, -1], [-1, -1]]))
    with pytest.raises(ValueError, match="batch size 1"):
        copy_first(copy, lambda: tree, V)


def test_source_of_says_which_rows_copy_before_the_round() -> None:
    """Rows whose last 2-4 tokens occurred earlier copy (source 0), the others ask the model (1); with
    copying off there is one source. The answer agrees with what `propose` then drafts."""
    tokens = torch.tensor([[1, 2, 3, 1, 2], [0, 4, 5, 6, 7], [0, 0, 5, 3, 5]])  # [B, T] left padded
    ctx = DraftContext(tokens, None, SamplingConfig(), torch.Generator(), lengths=(5, 4, 3))
    copy = CopyFirst(2, 4)
    assert copy.sources == ("copy", "model")
    assert copy.source_of(ctx) == [0, 1, 1]
    drafted = copy.propose(ctx, 2, lambda: model_chain(3, 2), V)
    assert drafted.token_ids[0].tolist() == [3, 1] and drafted.lengths is None
    assert CopyFirst(1, 4).source_of(ctx) == [0, 1, 0]
    off = CopyFirst(None, 4)
    assert off.sources == () and off.source_of(ctx) == [0, 0, 0]
