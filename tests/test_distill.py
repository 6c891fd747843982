"""The distillation recipe end to end on a tiny random target, its pieces, and self-generated data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from specdraft.formats.draft import build_student, load_draft_artifact
from specdraft.models import tiny_random_target
from specdraft.target import TargetModel
from specdraft.train.distill import (
    Example,
    answer_label_examples,
    answer_sequences,
    answer_window,
    batch_at,
    cache_selfgen_topk,
    collate,
    exit_cache_examples,
    pack_batches,
    run,
    selfgen_examples,
    teacher_examples,
)
from specdraft.train.early_exit import precompute_teacher
from specdraft.train.losses import distill_loss
from specdraft.train.selfgen import load_selfgen_records
from specdraft.vocab import VOCAB_FILE, PrunedVocab


def tiny_cfg(out: Path, steps: int) -> dict:
    return {
        "target": "tiny", "out_dir": str(out), "export_dir": str(out / "artifact"), "seed": 0,
        "threads": 1, "log": False,
        "student": {"init_candidates": [[0], [2]]},
        "vocab": {"size": 48},
        "data": {"selfgen": False, "corpus_tokens": 0, "top_k": 8, "max_len": 64, "batch_tokens": 256},
        "train": {"max_steps": steps, "lr": 3e-3, "warmup_steps": 2, "eval_every": 10, "checkpoint_every": 5},
    }


@pytest.fixture(scope="module")
def target_and_data() -> tuple[TargetModel, dict]:
    target = tiny_random_target(vocab_size=64, seed=1, num_layers=3)
    starts = torch.arange(24)[:, None]  # [24, 1]
    with torch.inference_mode():  # the target's own greedy text, one batched call
        seqs = target.model.generate(starts, max_new_tokens=31, min_new_tokens=31, do_sample=False, pad_token_id=0)
    return target, {"train": seqs[:20], "eval": seqs[20:]}


def test_recipe_runs_loss_goes_down_and_checkpoint_loads(target_and_data: tuple, tmp_path: Path) -> None:
    target, seqs = target_and_data
    cfg = tiny_cfg(tmp_path, steps=30)
    cfg["data"]["sequences"] = [seqs]
    summary = run(cfg, target=target)
    losses = [h["loss"] for h in torch.load(tmp_path / "ckpt.pt", weights_only=False)["history"] if "loss" in h]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5
    first, last = summary["history"][0]["eval"]["sequences"], summary["held_out"]["sequences"]
    assert last["expected_acceptance"] >= first["expected_acceptance"] - 0.02
    assert 0.0 <= last["greedy_agreement"] <= 1.0
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert hf.config.num_hidden_layers == 1
    draft = load_draft_artifact(tmp_path / "artifact", target)
    assert PrunedVocab.load(tmp_path / "artifact" / VOCAB_FILE).size == 48 and draft.config.num_hidden_layers == 1
    meta = json.loads((tmp_path / "artifact" / "draft.json").read_text())
    assert meta["layer_ids"] in ([0], [2]) and len(meta["init_candidates"]) == 2
    # only new weights are exported: no embeddings / lm_head
    assert not any("embed" in k or "lm_head" in k for k in load_file(tmp_path / "artifact" / "draft.safetensors"))


def test_continuing_a_draft_records_init_from_as_given(
    target_and_data: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`student.init_from` continues an exported draft, and draft.json records the name the user gave
    (a shipped name such as "smollm2-135m/draft"), not the path it resolved to on this machine."""
    target, seqs = target_and_data
    first = tiny_cfg(tmp_path / "first", steps=3)
    first["data"]["sequences"] = [seqs]
    run(first, target=target)
    shipped = {"tiny/draft": tmp_path / "first" / "artifact"}  # a stand-in for the shipped artifacts
    monkeypatch.setattr("specdraft.train.distill.require_artifact", lambda spec, what: shipped[spec])
    cont = tiny_cfg(tmp_path / "second", steps=3)
    cont["data"]["sequences"] = [seqs]
    cont["student"]["init_from"] = "tiny/draft"
    run(cont, target=target)
    meta = json.loads((tmp_path / "second" / "artifact" / "draft.json").read_text())
    assert [c["init_from"] for c in meta["init_candidates"]] == ["tiny/draft"]


def test_continuing_a_draft_keeps_its_vocabulary_unless_rebuilt(
    target_and_data: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`student.init_from` keeps the init's pruned vocabulary; `vocab.rebuild=true` ranks one from the
    new run's data (text made of tokens the first vocabulary lacks) and the layers still carry over."""
    target, seqs = target_and_data
    first = tiny_cfg(tmp_path / "first", steps=2)
    first["vocab"]["size"] = 16
    first["data"]["sequences"] = [seqs]
    run(first, target=target)
    init_ids = set(PrunedVocab.load(tmp_path / "first" / "artifact" / VOCAB_FILE).ids.tolist())
    unseen = torch.tensor(sorted(set(range(64)) - init_ids)[:16])  # [16] tokens the first vocabulary lacks
    pick = torch.Generator().manual_seed(3)
    other = {"train": unseen[torch.randint(0, 16, (8, 24), generator=pick)],
             "eval": unseen[torch.randint(0, 16, (2, 24), generator=pick)], "name": "other"}
    monkeypatch.setattr("specdraft.train.distill.require_artifact", lambda spec, what: tmp_path / "first" / "artifact")
    ids = {}
    for name, rebuild in (("kept", False), ("rebuilt", True)):
        cfg = tiny_cfg(tmp_path / name, steps=2)
        cfg["vocab"].update(size=16, rebuild=rebuild)
        cfg["data"]["sequences"] = [other]
        cfg["student"]["init_from"] = "tiny/draft"
        run(cfg, target=target)
        ids[name] = set(PrunedVocab.load(tmp_path / name / "artifact" / VOCAB_FILE).ids.tolist())
    assert ids["kept"] == init_ids
    assert ids["rebuilt"] != init_ids and len(ids["rebuilt"] & set(unseen.tolist())) >= 12


def test_recipe_resumes_exactly_from_checkpoint(
    target_and_data: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of 8 steps killed in step 6 (after the checkpoint of step 5) and started again gives
    the same losses and weights as 8 steps in one go (the batch of a step is a function of the step)."""
    target, seqs = target_and_data
    cfg = tiny_cfg(tmp_path / "resumed", steps=8)
    cfg["data"]["sequences"] = [seqs]
    calls = []

    def dies_in_step_6(*args: torch.Tensor, **kwargs: bool) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return distill_loss(*args, **kwargs)

    monkeypatch.setattr("specdraft.train.distill.distill_loss", dies_in_step_6)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, target=target)
    monkeypatch.undo()
    assert torch.load(tmp_path / "resumed" / "ckpt.pt", weights_only=False)["step"] == 5
    with pytest.raises(FileExistsError, match="overwrite=true"):  # its folder is not empty now
        run(cfg, target=target)
    run({**cfg, "overwrite": True}, target=target)  # resumes from the ckpt.pt there
    whole = tiny_cfg(tmp_path / "whole", steps=8)
    whole["data"]["sequences"] = [seqs]
    run(whole, target=target)
    history = torch.load(tmp_path / "resumed" / "ckpt.pt", weights_only=False)["history"]
    reference = torch.load(tmp_path / "whole" / "ckpt.pt", weights_only=False)["history"]
    assert [h["step"] for h in history if "loss" in h] == list(range(1, 9))
    assert [h["loss"] for h in history if "loss" in h] == [h["loss"] for h in reference if "loss" in h]
    resumed = load_file(tmp_path / "resumed" / "artifact" / "draft.safetensors")
    for name, weight in load_file(tmp_path / "whole" / "artifact" / "draft.safetensors").items():
        torch.testing.assert_close(resumed[name], weight, rtol=0, atol=0)


def test_old_train_keys_are_a_clear_error(target_and_data: tuple, tmp_path: Path) -> None:
    target, _ = target_and_data
    cfg = tiny_cfg(tmp_path, steps=1)
    cfg["train"]["steps"] = 1
    with pytest.raises(ValueError, match=r"unknown train settings \['steps'\]"):
        run(cfg, target=target)


def test_recipe_without_data_is_a_clear_error(target_and_data: tuple, tmp_path: Path) -> None:
    target, _ = target_and_data
    with pytest.raises(ValueError, match="no training"):
        run(tiny_cfg(tmp_path, steps=1), target=target)


def test_exit_cache_examples_equal_a_fresh_teacher_pass(target_and_data: tuple, tmp_path: Path) -> None:
    """The corpus examples read from the early-exit recipe's teacher cache are what the distill
    recipe's own teacher pass gives on the same blocks; a cache of another stream or a short cache
    is a clear error."""
    target, seqs = target_and_data
    stream = seqs["train"]  # [20, 32]: the target's own greedy text (next token = its top-1)
    precompute_teacher(target, stream, 1, top_k=8, out_dir=tmp_path / "train", shard_blocks=4)
    examples = exit_cache_examples(stream, 3, tmp_path / "train")
    fresh = teacher_examples(target, list(stream[3:]), [0] * 17, top_k=8)
    assert len(examples) == len(fresh) == 17
    for got, want in zip(examples, fresh):
        assert torch.equal(got.ids, want.ids) and torch.equal(got.positions, want.positions)
        assert torch.equal(got.topk_indices, want.topk_indices)
        torch.testing.assert_close(got.topk_values.float(), want.topk_values.float(), atol=2e-2, rtol=1e-2)
    other = torch.randint(0, target.vocab_size, stream.shape, generator=torch.Generator().manual_seed(5))
    with pytest.raises(ValueError, match="does not match the token stream"):
        exit_cache_examples(other, 3, tmp_path / "train")
    with pytest.raises(ValueError, match="larger train_tokens"):
        exit_cache_examples(torch.cat([stream, stream]), 3, tmp_path / "train")
    precompute_teacher(target, stream[:18], 1, top_k=8, out_dir=tmp_path / "short", shard_blocks=4)  # last shard: 2 blocks
    with pytest.raises(ValueError, match="no complete shard for blocks from 16"):
        exit_cache_examples(stream, 3, tmp_path / "short")
    assert len(exit_cache_examples(stream[:18], 3, tmp_path / "short")) == 15


def test_selfgen_repeat_must_be_positive(target_and_data: tuple, tmp_path: Path) -> None:
    target, _ = target_and_data
    cfg = tiny_cfg(tmp_path, steps=1)
    cfg["data"]["selfgen_repeat"] = 0
    with pytest.raises(ValueError, match="selfgen_repeat"):
        run(cfg, target=target)


def test_recipe_loss_drops_teacher_tokens_outside_the_subset() -> None:
    """The recipe's setting of the shared loss: a teacher token outside the subset keeps its share
    of the teacher's mass out of the loss (renormalize=False)."""
    student = torch.tensor([[2.0, 0.0, -1.0]])  # [N=1, M=3]
    teacher = torch.tensor([[1.0, 1.0]])  # top-2 logits, equal
    subs = torch.tensor([[0, -1]])  # second teacher token is outside the subset
    expected = -0.5 * torch.log_softmax(student, -1)[0, 0]
    torch.testing.assert_close(distill_loss(student, teacher, subs, renormalize=False), expected)


def test_student_copies_target_layers(target_and_data: tuple) -> None:
    target, _ = target_and_data
    student = build_student(target.model, [2])
    torch.testing.assert_close(
        student.model.layers[0].mlp.up_proj.weight, target.model.model.layers[2].mlp.up_proj.weight
    )
    assert student.model.embed_tokens.weight is target.model.model.embed_tokens.weight
    with pytest.raises(ValueError, match="layer ids"):
        build_student(target.model, [5])


def test_batches_pack_every_example_and_each_epoch_visits_every_batch_once() -> None:
    examples = [Example(torch.zeros(n, dtype=torch.long), torch.arange(n), torch.zeros(n, 2), torch.zeros(n, 2, dtype=torch.long))
                for n in (5, 9, 3, 12, 7, 4, 8, 6)]
    batches = pack_batches(examples, batch_tokens=16, seed=0)
    assert sorted(id(e) for b in batches for e in b) == sorted(id(e) for e in examples)
    assert all(max(len(e.ids) for e in b) * len(b) <= 16 or len(b) == 1 for b in batches)
    n = len(batches)
    for epoch in range(2):
        seen = [id(batch_at(batches, epoch * n + i, seed=0)) for i in range(n)]
        assert sorted(seen) == sorted(id(b) for b in batches)
    assert [id(batch_at(batches, s, 0)) for s in range(3 * n)] == [id(batch_at(batches, s, 0)) for s in range(3 * n)]
    assert [id(batch_at(batches, s, 0)) for s in range(n, 2 * n)] != [id(batch_at(batches, s, 0)) for s in range(n)] or n < 3


def test_selfgen_loader_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="split"):
        load_selfgen_records("test")
    with pytest.raises(ValueError, match="does not exist"):
        load_selfgen_records("train", tmp_path / "none.jsonl")


def test_missing_selfgen_topk_is_computed_once_and_cached(target_and_data: tuple, tmp_path: Path) -> None:
    target, seqs = target_and_data
    records = [{"id": f"r{i}", "prompt_ids": s[:4].tolist(), "completion_ids": s[4 : 10 + i].tolist()}
               for i, s in enumerate(seqs["train"][:3])]
    examples, missing = selfgen_examples(records, tmp_path, max_len=64)
    assert not examples and len(missing) == 3
    cache_selfgen_topk(target, missing, tmp_path, top_k=4)
    examples, missing = selfgen_examples(records, tmp_path, max_len=64)
    assert not missing and len(examples) == 3
    for r, ex in zip(records, examples, strict=True):
        assert len(ex.positions) == len(r["completion_ids"])
        assert ex.ids[ex.positions + 1].tolist() == r["completion_ids"]  # row i predicts answer token i
        with torch.inference_mode():
            logits = target.model(ex.ids[None]).logits[0, ex.positions]  # [n, V]
        top = logits.topk(4)
        torch.testing.assert_close(ex.topk_values.float(), top.values, atol=2e-2, rtol=1e-2)
        assert ex.topk_indices[:, 0].tolist() == top.indices[:, 0].tolist()


def test_answer_labels_are_the_answer_tokens_at_the_teacher_positions(target_and_data: tuple, tmp_path: Path) -> None:
    """`data.selfgen_labels=answer`: each answer position's label is the token the target wrote there
    (one-hot, full weight), at exactly the positions the teacher's top-k would cover, long prompts too."""
    target, seqs = target_and_data
    flat = seqs["train"].flatten()  # [640]
    records = [{"id": "short", "prompt_ids": flat[:5].tolist(), "completion_ids": flat[5:20].tolist()},
               {"id": "long", "prompt_ids": flat[:200].tolist(), "completion_ids": flat[200:230].tolist()}]
    cache_selfgen_topk(target, records, tmp_path, top_k=4)
    teacher, _ = selfgen_examples(records, tmp_path, max_len=64)
    answers = answer_label_examples(records, max_len=64)
    for r, got, want in zip(records, answers, teacher, strict=True):
        assert torch.equal(got.ids, want.ids) and torch.equal(got.positions, want.positions)
        assert got.topk_indices[:, 0].tolist() == r["completion_ids"] and got.topk_indices.shape[1] == 1
        student = torch.randn(len(got.positions), 64)  # [n, V]
        ce = torch.nn.functional.cross_entropy(student, got.topk_indices[:, 0])
        torch.testing.assert_close(distill_loss(student, got.topk_values, got.topk_indices, renormalize=False), ce)


def test_recipe_trains_on_answer_tokens_without_a_teacher_pass(
    target_and_data: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe with `data.selfgen_labels=answer` runs no teacher over the training answers (only
    the held-out ones are scored against the exact p), raises the held-out greedy agreement on the
    target's own greedy answers, and an unknown label kind is a clear error."""
    target, seqs = target_and_data
    path = tmp_path / "selfgen.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "split": "eval" if i >= 20 else "train",
                                        "prompt_ids": s[:4], "completion_ids": s[4:]}) + "\n"
                            for i, s in enumerate(seqs["train"].tolist() + seqs["eval"].tolist())))
    monkeypatch.setattr("specdraft.train.distill.teacher_examples", lambda *a, **k: pytest.fail("a teacher pass"))
    cfg = tiny_cfg(tmp_path / "out", steps=40)
    cfg["data"].update(selfgen=str(path), selfgen_labels="answer", eval_selfgen=4)
    summary = run(cfg, target=target)
    assert summary["train_positions"] == 20 * 28  # every answer token of every training answer
    first, last = summary["init_candidates"], summary["held_out"]["selfgen"]
    assert last["greedy_agreement"] > max(c["selfgen"]["greedy_agreement"] for c in first)
    cfg = tiny_cfg(tmp_path / "bad", steps=1)
    cfg["data"].update(selfgen=str(path), selfgen_labels="argmax", eval_selfgen=4)
    with pytest.raises(ValueError, match="selfgen_labels must be one of"):
        run(cfg, target=target)


def test_a_batch_mixing_answer_labels_and_teacher_top_k_scores_each_as_alone() -> None:
    """An answer-label example (k = 1) and a teacher example (k = 3) in one batch: the padded
    columns carry no mass, so each position's loss is what it is in a batch of its own."""
    vocab = PrunedVocab(torch.arange(10), 10)  # every token kept, subset index = token id
    answer = Example(torch.tensor([1, 2, 3, 4]), torch.tensor([1, 2]), torch.zeros(2, 1, dtype=torch.float16),
                     torch.tensor([[3], [4]]))
    teacher = Example(torch.tensor([5, 6, 7]), torch.tensor([0]), torch.tensor([[2.0, 1.0, 0.5]], dtype=torch.float16),
                      torch.tensor([[6, 1, 9]]))
    ids, where, vals, subs = collate([answer, teacher], vocab)
    assert ids.shape == (2, 4) and where.tolist() == [[0, 1], [0, 2], [1, 0]] and vals.shape == subs.shape == (3, 3)
    logits = torch.randn(3, 10)  # [N, M]
    alone = [distill_loss(logits[:2], answer.topk_values, answer.topk_indices, renormalize=False) * 2,
             distill_loss(logits[2:], teacher.topk_values, teacher.topk_indices, renormalize=False)]
    torch.testing.assert_close(distill_loss(logits, vals, subs, renormalize=False), sum(alone) / 3)


def test_answer_window_keeps_answer_positions_of_long_prompts() -> None:
    assert answer_window(10, 50, 64) == 0  # fits
    assert answer_window(10, 100, 64) == 0  # a long answer after a short prompt: the start, as before
    assert answer_window(100, 120, 64) == 56  # ends at the sequence end: the whole answer is kept
    assert answer_window(3000, 3200, 320) == 2880  # a document prompt, a 200-token answer: all of it
    # a 400-token answer: a quarter window of the document as context, then the answer's start
    assert answer_window(3000, 3400, 320) == 3000 - 1 - 80
    for prompt, total, m in [(5, 400, 64), (300, 310, 64), (1, 2, 1), (1000, 1001, 8)]:
        w = answer_window(prompt, total, m)
        assert 0 <= w <= total - m and w <= prompt - 1  # a full window holding the first answer prediction


def test_long_prompt_records_train_on_their_answers(target_and_data: tuple, tmp_path: Path) -> None:
    target, seqs = target_and_data
    flat = seqs["train"].flatten()  # [640]
    records = [{"id": "long", "prompt_ids": flat[:200].tolist(), "completion_ids": flat[200:230].tolist()}]
    cache_selfgen_topk(target, records, tmp_path, top_k=4)  # the teacher sees the whole sequence
    (ex,), missing = selfgen_examples(records, tmp_path, max_len=64)
    assert not missing and len(ex.ids) == 64
    assert ex.ids[ex.positions + 1].tolist() == records[0]["completion_ids"]  # every answer token, in the window
    seq, start = answer_sequences(records, 64)
    assert torch.equal(seq[0], ex.ids) and start[0] == ex.positions[0].item()


def test_selfgen_sources_can_be_listed(tmp_path: Path) -> None:
    def write(name: str, n: int) -> Path:
        path = tmp_path / name
        path.write_text("".join(json.dumps({"id": f"{name}{i}", "split": "train", "prompt_ids": [1],
                                            "completion_ids": [2, 3]}) + "\n" for i in range(n)))
        return path

    a, b = write("a.jsonl", 2), write("b.jsonl", 3)
    assert [r["id"] for r in load_selfgen_records("train", [b, str(a)])] == ["b.jsonl0", "b.jsonl1", "b.jsonl2",
                                                                              "a.jsonl0", "a.jsonl1"]
    with pytest.raises(ValueError, match="empty"):
        load_selfgen_records("train", [])
    with pytest.raises(ValueError, match="does not exist"):
        load_selfgen_records("train", [a, tmp_path / "none.jsonl"])


def test_teacher_batches_are_bounded_in_padded_tokens(target_and_data: tuple) -> None:
    target, seqs = target_and_data
    rows = [seqs["train"][i, : 8 + 3 * i] for i in range(8)]
    small = teacher_examples(target, rows, [0] * 8, top_k=4, max_batch_tokens=40)
    big = teacher_examples(target, rows, [0] * 8, top_k=4)
    for x, y in zip(small, big, strict=True):
        assert torch.equal(x.ids, y.ids) and torch.equal(x.topk_indices[:, 0], y.topk_indices[:, 0])
