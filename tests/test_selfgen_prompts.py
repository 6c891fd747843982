"""The templated self-distillation prompts: the kinds they promise, none of the built-in suite."""

from __future__ import annotations

from collections import Counter

import pytest

from specdraft.train.selfgen import Prompt
from specdraft.train.selfgen_prompts import (
    KINDS,
    build_extra_prompts,
    exclude_suite,
    extra_prompts_for,
    followup_prompts,
    suite_user_texts,
)


def test_every_kind_is_built_with_unique_ids_and_both_splits() -> None:
    prompts = build_extra_prompts(seed=0)
    kinds = Counter(p.kind for p in prompts)
    assert set(kinds) == set(KINDS)
    assert kinds["math"] == 240 and kinds["code_edit"] == 200
    assert len({p.id for p in prompts}) == len(prompts)
    assert {p.split for p in prompts} == {"train", "eval"}
    assert build_extra_prompts(seed=0) == prompts  # deterministic: resumable generation relies on it


def test_no_prompt_is_a_builtin_suite_prompt_or_quotes_its_code() -> None:
    suite = suite_user_texts("builtin")
    joined = "\n".join(suite)
    for p in extra_prompts_for(["general_qa", "advice", "email", "math", "code_edit", "code_write", "docread"]):
        assert p.text not in suite
        if p.kind == "code_edit":
            first_line = p.text.split("```python\n", 1)[1].splitlines()[0]
            assert first_line not in joined, p.id


def test_exclude_suite_drops_exact_questions_and_quoted_code() -> None:
    suite = ["What is the capital of France?", "Here is a Python function:\n\n```python\ndef f(x):\n    return x\n```\n\nAdd hints."]
    prompts = [
        Prompt("a", "general_qa", "What is the capital of France?"),
        Prompt("b", "code_edit", "Here is a Python function:\n\n```python\ndef f(x):\n    return x\n```\n\nExplain it."),
        Prompt("c", "general_qa", "What is the capital of Peru?"),
    ]
    assert [p.id for p in exclude_suite(prompts, suite)] == ["c"]


def test_followups_continue_the_targets_own_first_answer() -> None:
    records = [
        {"id": "advice/learn/swim", "kind": "advice", "prompt": "I want to learn to swim. Where should I start?",
         "completion": "Start in shallow water. "},
        {"id": "math/0", "kind": "math", "prompt": "1+1?", "completion": "2"},
    ]
    (f,) = followup_prompts(records)
    assert f.id == "followup/advice/learn/swim" and f.kind == "followup"
    chat = f.chat()
    assert [m["role"] for m in chat] == ["user", "assistant", "user"]
    assert chat[0]["content"] == records[0]["prompt"] and chat[1]["content"] == "Start in shallow water."


def test_unknown_kinds_are_named_with_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown selfgen kinds \['chit_chat'\]; choose from"):
        extra_prompts_for(["math", "chit_chat"], suite=lambda: [])
