"""Repeated random sequences (the synthetic copying task of the distillation recipe)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specdraft.models import tiny_random_target
from specdraft.train.distill import distill_loss, run
from specdraft.train.repeats import repeat_examples, repeat_sequences, token_pool
from specdraft.vocab import PrunedVocab
from tests.test_distill import tiny_cfg


@pytest.fixture(scope="module")
def tiny() -> tuple:
    """A tiny random target and 12 of its greedy sequences of 24 tokens."""
    target = tiny_random_target(vocab_size=64, seed=1, num_layers=3)
    with torch.inference_mode():
        seqs = target.model.generate(torch.arange(12)[:, None], max_new_tokens=23, min_new_tokens=23,
                                     do_sample=False, pad_token_id=0)  # [12, 24]
    return target, seqs


def test_sequences_are_a_span_twice_from_the_pool_and_seeded() -> None:
    pool = torch.tensor([5, 9, 11, 40])
    seqs = repeat_sequences(pool, count=40, min_span=4, max_span=12, seed=3)
    assert len(seqs) == 40
    for s in seqs:
        span = len(s) // 2
        assert 4 <= span <= 12 and len(s) == 2 * span and s.dtype == torch.long
        assert torch.equal(s[:span], s[span:])
        assert set(s.tolist()) <= set(pool.tolist())
    assert len({len(s) for s in seqs}) > 3  # the span varies: no fixed offset to copy from
    again = repeat_sequences(pool, count=40, min_span=4, max_span=12, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(seqs, again))
    other = repeat_sequences(pool, count=40, min_span=4, max_span=12, seed=4)
    assert not all(torch.equal(a, b) for a, b in zip(seqs, other))


def test_examples_train_the_second_copy_towards_the_copied_token() -> None:
    vocab = PrunedVocab([3, 5, 9, 11, 40, 41], vocab_size=64)
    pool = torch.tensor([5, 9, 11, 40])
    (ex,) = repeat_examples(pool, count=1, min_span=6, max_span=6, top_k=4, seed=0)
    assert ex.positions.tolist() == [6, 7, 8, 9, 10]  # second copy, except its last token
    labels = ex.ids[ex.positions + 1]
    assert torch.equal(labels, ex.ids[ex.positions + 1 - 6])  # the copied token
    assert ex.topk_values.shape == ex.topk_indices.shape == (5, 4)
    assert torch.equal(ex.topk_indices, labels[:, None].expand(-1, 4))
    # the one-hot teacher makes the recipe's loss the cross-entropy of the copied token
    student = torch.randn(5, vocab.size)  # [N, M]
    expected = torch.nn.functional.cross_entropy(student, vocab.to_subset(labels))
    torch.testing.assert_close(distill_loss(student, ex.topk_values, vocab.to_subset(ex.topk_indices)), expected)


def test_pool_is_the_most_frequent_tokens_without_special_ones() -> None:
    ids = torch.tensor([2, 7, 1, 8, 4, 6])  # frequency order, 2 = end of sequence
    assert token_pool(ids, 3, exclude={2}).tolist() == [7, 1, 8]
    assert token_pool(ids, 10, exclude={2, 4}).tolist() == [7, 1, 8, 6]


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="count >= 0"):
        repeat_sequences(torch.tensor([1, 2]), count=-1, min_span=4, max_span=4, seed=0)
    with pytest.raises(ValueError, match="2 <= min_span <= max_span"):
        repeat_sequences(torch.tensor([1, 2]), count=3, min_span=1, max_span=4, seed=0)
    with pytest.raises(ValueError, match="2 <= min_span <= max_span"):
        repeat_sequences(torch.tensor([1, 2]), count=3, min_span=8, max_span=4, seed=0)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        repeat_sequences(torch.tensor([1]), count=3, min_span=4, max_span=4, seed=0)


def test_recipe_with_repeats_trains_on_them_and_evaluates_copying(tiny: tuple, tmp_path: Path) -> None:
    target, seqs = tiny
    cfg = tiny_cfg(tmp_path, steps=6)
    cfg["data"].update({"sequences": [{"train": seqs[:10], "eval": seqs[10:]}], "repeats": 30, "repeat_min_span": 8,
                        "repeat_max_span": 8, "repeat_pool": 20})
    summary = run(cfg, target=target)
    # 16 held-out sequences, scored at every position of the second copy (the last one predicts a[0] again)
    assert summary["held_out"]["repeats"]["positions"] == 16 * 8
    assert summary["train_positions"] == 10 * 24 + 30 * 7


def test_student_attention_implementation_can_be_switched() -> None:
    """build_student's cloned layers read the student's config, so eager attention (which returns
    attention weights, needed by the induction warm-up) reaches them."""
    from specdraft.models import tiny_random_llama
    from specdraft.train.distill import build_student

    student = build_student(tiny_random_llama(num_layers=3), [0, 2])
    student.set_attn_implementation("eager")
    out = student(input_ids=torch.tensor([[1, 2, 3, 1, 2, 3]]), output_attentions=True, use_cache=False)
    assert len(out.attentions) == 2 and out.attentions[0].shape[-2:] == (6, 6)


def test_induction_warmup_supervises_two_heads_and_reports_copying(tiny: tuple, tmp_path: Path) -> None:
    target, seqs = tiny
    cfg = tiny_cfg(tmp_path, steps=3)
    cfg["student"]["init_candidates"] = [[0, 2]]
    cfg["data"].update({"sequences": [{"train": seqs[:10], "eval": seqs[10:]}], "induction_warmup_steps": 4,
                        "repeat_min_span": 4, "repeat_max_span": 8, "repeat_pool": 20})
    summary = run(cfg, target=target)
    warm = summary["induction_warmup"]
    assert warm["steps"] == 4 and 0.0 <= warm["copy_accuracy"] <= 1.0
    assert warm["heads"]["previous_token"][0] == 0 and warm["heads"]["induction"][0] == 1
    assert summary["train_steps"] == 3  # then the distillation as usual (sdpa again: it ran)


def test_induction_warmup_needs_two_layers(tiny: tuple, tmp_path: Path) -> None:
    target, _ = tiny
    cfg = tiny_cfg(tmp_path, steps=1)
    cfg["student"]["init_candidates"] = [[1]]
    cfg["data"].update({"sequences": [{"train": torch.arange(40).view(2, 20), "eval": torch.arange(20).view(1, 20)}],
                        "induction_warmup_steps": 2, "repeat_min_span": 4, "repeat_max_span": 8, "repeat_pool": 20})
    with pytest.raises(ValueError, match="at least 2 layers"):
        run(cfg, target=target)



def test_recipe_continues_from_an_exported_draft(tiny: tuple, tmp_path: Path) -> None:
    """student.init_from starts from an exported draft (its layers, weights and pruned vocabulary):
    its untrained evaluation is the first run's final one."""
    import json

    target, seqs = tiny
    cfg = tiny_cfg(tmp_path / "a", steps=6)
    cfg["data"]["sequences"] = [{"train": seqs[:10], "eval": seqs[10:]}]
    first = run(cfg, target=target)
    cfg2 = tiny_cfg(tmp_path / "b", steps=2)
    cfg2["data"]["sequences"] = cfg["data"]["sequences"]
    cfg2["student"]["init_from"] = str(tmp_path / "a" / "artifact")
    second = run(cfg2, target=target)
    (init,) = second["init_candidates"]
    assert init["layer_ids"] == json.loads((tmp_path / "a" / "artifact" / "draft.json").read_text())["layer_ids"]
    assert init["sequences"]["greedy_agreement"] == pytest.approx(first["held_out"]["sequences"]["greedy_agreement"], abs=0.02)
    assert second["pruned_vocab_size"] == first["pruned_vocab_size"]
