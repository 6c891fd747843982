"""Copy chats: the target's answers asked for again (specdraft.train.copy_chats)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdraft.models import load_tokenizer, tiny_random_target
from specdraft.train.copy_chats import REQUESTS, copy_chat_sequences, request_turn
from specdraft.train.distill import run
from specdraft.train.selfgen import load_selfgen_records
from specdraft.train.selfgen_prompts import suite_user_texts
from tests.test_distill import tiny_cfg


def test_no_request_is_a_suite_user_text() -> None:
    suite = {t.strip().lower() for t in suite_user_texts("builtin")}
    assert not {r.strip().lower() for r in REQUESTS} & suite
    assert len(set(REQUESTS)) == len(REQUESTS)


class _NoVerbatimTemplate:
    def apply_chat_template(self, msgs: list, add_generation_prompt: bool, tokenize: bool) -> str:
        return "".join(m["role"] for m in msgs)


def test_bad_inputs_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="verbatim"):
        request_turn(_NoVerbatimTemplate(), "again")
    with pytest.raises(ValueError, match="copy_chats must be >= 0"):
        copy_chat_sequences([], _NoVerbatimTemplate(), [2], -1, 100)


def test_recipe_refuses_copy_chats_without_a_tokenizer(tmp_path: Path) -> None:
    target = tiny_random_target(vocab_size=64, seed=1, num_layers=1)  # no tokenizer
    cfg = tiny_cfg(tmp_path, steps=1)
    cfg["data"].update(selfgen=True, copy_chats=4)
    with pytest.raises(ValueError, match="copy_chats repeats the target.s answers"):
        run(cfg, target=target)


@pytest.mark.slow  # loads the default target's tokenizer (GGUF), ~10 s
def test_copy_chat_repeats_the_answer_after_a_request_in_the_chat_template() -> None:
    tok = load_tokenizer("smollm2-135m")
    turn = request_turn(tok, "Again")
    assert tok.decode(turn) == "<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n"
    records = load_selfgen_records("train")[:40]
    seqs, starts = copy_chat_sequences(records, tok, [2], count=10, max_len=400, seed=3)
    assert 0 < len(seqs) <= 10
    by_answer = {tuple(r["completion_ids"]): r for r in records}
    for seq, start in zip(seqs, starts, strict=True):
        assert len(seq) <= 400
        answer = tuple(seq[start + 1 :].tolist())  # the repeated answer: all positions after start
        r = by_answer[answer]
        said = list(answer[:-1] if answer[-1] == 2 else answer)
        head = r["prompt_ids"] + said
        assert seq[: len(head)].tolist() == head  # the conversation and the first answer
        request = tok.decode(seq[len(head) : start + 1])
        assert any(q in request for q in REQUESTS) and request.endswith("<|im_start|>assistant\n")
    again, _ = copy_chat_sequences(records, tok, [2], count=10, max_len=400, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(seqs, again, strict=True))  # seeded


@pytest.mark.slow  # the default target's tokenizer on a tiny random model, ~15 s
def test_recipe_trains_on_copy_chats_and_caches_their_teacher(tmp_path: Path) -> None:
    target = tiny_random_target(vocab_size=49152, seed=0, tokenizer="smollm2-135m", hidden_size=16, num_layers=2)
    def short(r: dict) -> bool:  # a copy chat fits the tiny model's 256 positions
        return len(r["prompt_ids"]) + 2 * len(r["completion_ids"]) < 220

    records = [r for split in ("train", "eval") for r in [r for r in load_selfgen_records(split) if short(r)][:3]]
    path = tmp_path / "selfgen.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = tiny_cfg(tmp_path / "out", steps=3)
    cfg["vocab"] = {"size": 512}
    cfg["student"] = {"init_candidates": [[0]]}
    cfg["data"].update(selfgen=str(path), eval_selfgen=3, copy_chats=2, copy_max_len=250,
                       teacher_cache=str(tmp_path / "teacher"), max_len=250)
    summary = run(cfg, target=target)
    # a teacher pass scores every answer token and the position after the last one
    lengths = [len(r["completion_ids"]) + 1 for r in records if r["split"] == "train"]
    copied = summary["train_positions"] - sum(lengths)  # the answers' positions + the repeated answers'
    assert copied in {sum(lengths) - n for n in lengths}  # two of the three answers, every token once more
    assert len(list((tmp_path / "teacher").glob("copy-2-*.pt"))) == 1  # cached for the next run
