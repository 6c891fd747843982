"""The templated self-distillation prompts: the kinds they promise, none of the built-in suite."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from specdraft.train.selfgen_prompts import (
    FOLLOWUPS_BY_SKILL,
    KINDS,
    SECOND_REVISIONS,
    Prompt,
    build_extra_prompts,
    exclude_suite,
    extra_prompts_for,
    followup_prompts,
    suite_user_texts,
)


@pytest.fixture(scope="module")
def prompts() -> list[Prompt]:
    """build_extra_prompts(seed=0), built once for the module (about 10 s here)."""
    return build_extra_prompts(seed=0)


def test_every_kind_is_built_with_unique_ids_and_both_splits(prompts: list[Prompt]) -> None:
    kinds = Counter(p.kind for p in prompts)
    assert set(kinds) == set(KINDS)
    assert kinds["math"] == 240 and kinds["code_edit"] == 200
    assert len({p.id for p in prompts}) == len(prompts)
    assert {p.split for p in prompts} == {"train", "eval"}
    assert build_extra_prompts(seed=0) == prompts  # deterministic: resumable generation relies on it


def test_no_prompt_is_a_builtin_suite_prompt_or_quotes_its_code() -> None:
    suite = suite_user_texts("builtin")
    joined = "\n".join(suite)
    for p in extra_prompts_for(list(KINDS)):
        assert p.text not in suite
        assert all(c not in suite for _, c in p.history), p.id
        if p.kind == "code_edit":
            first_line = p.text.split("```python\n", 1)[1].splitlines()[0]
            assert first_line not in joined, p.id
    follow_ups = list(FOLLOWUPS_BY_SKILL) + [q for qs in SECOND_REVISIONS.values() for q in qs]
    assert not set(follow_ups) & set(suite)  # follow-up turns are not filtered later: none may be a suite text


def test_exclude_suite_drops_exact_questions_and_quoted_code() -> None:
    suite = ["What is the capital of France?", "Here is a Python function:\n\n```python\ndef f(x):\n    return x\n```\n\nAdd hints."]
    prompts = [
        Prompt("a", "general_qa", "What is the capital of France?"),
        Prompt("b", "code_edit", "Here is a Python function:\n\n```python\ndef f(x):\n    return x\n```\n\nExplain it."),
        Prompt("c", "general_qa", "What is the capital of Peru?"),
    ]
    assert [p.id for p in exclude_suite(prompts, suite)] == ["c"]
    earlier = Prompt("d", "revise", "Make it shorter.", history=(("user", suite[0]), ("assistant", "Paris.")))
    assert exclude_suite([earlier], suite) == []  # a suite question as an earlier turn clashes too


def test_revise_chats_end_with_a_request_to_change_a_written_answer(prompts: list[Prompt]) -> None:
    revise = [p for p in prompts if p.kind == "revise"]
    assert len(revise) == 250
    for p in revise:
        chat = p.chat()
        assert [m["role"] for m in chat] == ["user", "assistant", "user"], p.id
        assert chat[1]["content"] and not re.search(r"\{[a-z]+\}", chat[1]["content"] + chat[2]["content"]), p.id
    lists = [p for p in revise if p.id.startswith("revise/list/")]
    first = lists[0].chat()
    items = first[0]["content"].split(": ", 1)[1].rstrip(".").split(", ")
    assert all(f"{k + 1}. {i[0].upper() + i[1:]}" in first[1]["content"] for k, i in enumerate(items))


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


def test_followups_of_revise_chats_rebuild_the_earlier_turns(prompts: list[Prompt]) -> None:
    first = next(p for p in prompts if p.id.startswith("revise/code/"))
    records = [{"id": first.id, "kind": "revise", "prompt": first.text, "completion": "```python\nx = 1\n```\n"}]
    (f,) = followup_prompts(records)
    chat = f.chat()
    assert [m["role"] for m in chat] == ["user", "assistant", "user", "assistant", "user"]
    assert chat[:3] == first.chat() and chat[3]["content"] == "```python\nx = 1\n```"
    assert followup_prompts([{**records[0], "id": "revise/unknown"}]) == []  # no longer built: skipped
