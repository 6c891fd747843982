"""PrunedVocab: projection, expansion to the target vocabulary, frequency ranking, save/load."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specdraft.vocab import PrunedVocab, build_pruned_vocab


def test_logits_and_expand_match_full_head() -> None:
    torch.manual_seed(0)
    weight = torch.randn(10, 4)  # [V, H]
    hidden = torch.randn(2, 3, 4)  # [B, T, H]
    vocab = PrunedVocab(torch.tensor([7, 2, 5]), 10)
    full = hidden @ weight.T  # [B, T, V]
    sub = vocab.logits(hidden, vocab.head(weight))  # [B, T, M]
    torch.testing.assert_close(sub, full[..., [7, 2, 5]])
    torch.testing.assert_close(vocab.logits(hidden, weight), sub)
    probs = torch.softmax(sub, -1)
    expanded = vocab.expand(probs)  # [B, T, V]
    assert expanded.shape == (2, 3, 10)
    torch.testing.assert_close(expanded[..., [7, 2, 5]], probs)
    assert float(expanded[..., [0, 1, 3, 4, 6, 8, 9]].abs().sum()) == 0.0
    # softmax over -inf-expanded logits is the same distribution
    torch.testing.assert_close(torch.softmax(vocab.expand_logits(sub), -1), expanded)


def test_index_mapping_and_coverage() -> None:
    vocab = PrunedVocab([7, 2, 5], 10)
    assert vocab.to_target(torch.tensor([0, 2])).tolist() == [7, 5]
    assert vocab.to_subset(torch.tensor([5, 3, 7])).tolist() == [2, -1, 0]
    assert vocab.coverage(torch.tensor([5, 3, 7, 7])) == 0.75
    assert vocab.size == 3


def test_build_ranks_by_frequency_and_forces_ids() -> None:
    blocks = torch.tensor([[3, 3, 3, 1], [1, 4, 4, 3]])  # 3 x4, 1 x2, 4 x2
    vocab = build_pruned_vocab(blocks, size=2, vocab_size=6)
    assert vocab.ids.tolist() == [3, 1]  # tie 1 vs 4 keeps the smaller id
    forced = build_pruned_vocab([blocks[0], blocks[1]], size=3, vocab_size=6, always_include=[5])
    assert forced.ids.tolist() == [5, 3, 1]


def test_save_load_round_trip(tmp_path: Path) -> None:
    vocab = PrunedVocab([4, 0, 9], 12)
    vocab.save(tmp_path / "v.json")
    back = PrunedVocab.load(tmp_path / "v.json")
    assert back.ids.tolist() == [4, 0, 9] and back.vocab_size == 12


@pytest.mark.parametrize(
    ("ids", "vocab_size", "match"),
    [([1, 1], 4, "unique"), ([0, 9], 4, r"\[0, 4\)"), ([], 4, "non-empty")],
)
def test_bad_ids_are_clear_errors(ids: list[int], vocab_size: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PrunedVocab(ids, vocab_size)


def test_bad_build_inputs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="size"):
        build_pruned_vocab(torch.tensor([1, 2]), size=0, vocab_size=4)
    with pytest.raises(ValueError, match="tokenizer"):
        build_pruned_vocab(torch.tensor([1, 7]), size=2, vocab_size=4)
    with pytest.raises(ValueError, match="does not exist"):
        PrunedVocab.load(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="rows"):
        PrunedVocab([0, 1], 4).head(torch.zeros(5, 2))
