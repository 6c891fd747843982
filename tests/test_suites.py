"""Prompt suites: the built-in suites' shape, user files (our forms and MT-bench's multi-turn
question format), tokenization, malformed-line errors."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast

from specdraft.suites import (
    ChatMessage,
    SuitePrompt,
    by_category,
    categories,
    load_suite,
    parse_suite,
)
from tests.helpers import load_script

REQUIRED_CATEGORIES = {"code_edit", "code_write", "summarize", "qa", "chat", "math"}
GENERATOR = Path(__file__).resolve().parents[1] / "benchmarks" / "make_builtin_suite.py"
CHAT_TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<s> assistant {% endif %}"
)
GOOD_CHAT = {"id": "a", "category": "qa", "messages": [{"role": "user", "content": "hello"}]}
GOOD_TURNS = {"question_id": "t", "category": "chat", "turns": ["hello", "world"]}


def _word_tokenizer() -> PreTrainedTokenizerFast:
    """A real (word-level) fast tokenizer with a chat template, built in memory."""
    words = ["<unk>", "<s>", "</s>", "user", "assistant", "system", "hello", "world", "hi", "there"]
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", chat_template=CHAT_TEMPLATE
    )


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_builtin_has_six_categories_of_at_least_five_unique_prompts() -> None:
    prompts = load_suite("builtin")
    groups = by_category(prompts)
    counts = {name: len(group) for name, group in groups.items()}
    assert REQUIRED_CATEGORIES <= set(groups)
    assert all(count >= 5 for count in counts.values()), counts
    assert len({p.id for p in prompts}) == len(prompts)
    for prompt in groups["chat"]:
        assert prompt.messages is not None and len(prompt.messages) >= 3  # earlier turns + new one
        assert [m.role for m in prompt.messages[:2]] == ["user", "assistant"]


def test_quick_is_a_subset_of_builtin_with_two_per_category() -> None:
    builtin = {p.id: p for p in load_suite("builtin")}
    quick = load_suite("quick")
    assert all(p.id in builtin and builtin[p.id] == p for p in quick)
    groups = by_category(quick)
    assert {"code_edit", "summarize", "qa", "chat"} <= set(groups)
    assert all(len(group) == 2 for group in groups.values())


@pytest.mark.skipif(
    not GENERATOR.is_file(), reason="benchmarks/ is not part of an installed package"
)
def test_generator_reproduces_the_committed_suites(tmp_path: Path) -> None:
    module = load_script(GENERATOR)
    if ".".join(map(str, sys.version_info[:3])) != module.GENERATED_WITH:
        pytest.skip(f"the suite's stdlib texts were taken from Python {module.GENERATED_WITH}")
    made = module.builtin_suite()
    assert made == load_suite("builtin")
    assert module.quick_suite(made) == load_suite("quick")


def test_user_file_with_both_forms(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "mine.jsonl", [
        json.dumps({**GOOD_CHAT, "max_new_tokens": 16}),
        "",
        json.dumps({"id": "b", "category": "completion", "prompt": "hello world"}),
        json.dumps({"id": "c", "category": "qa", "messages": [
            {"role": "system", "content": "hi"}, {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi there"}, {"role": "user", "content": "world"},
        ]}),
    ])
    prompts = load_suite(path)
    assert [p.id for p in prompts] == ["a", "b", "c"]
    assert categories(prompts) == ["qa", "completion"]
    assert prompts[0] == SuitePrompt(
        id="a", category="qa", messages=(ChatMessage("user", "hello"),), max_new_tokens=16
    )
    assert prompts[1].prompt == "hello world" and prompts[1].messages is None
    assert [json.loads(line) for line in path.read_text().split("\n") if line] == [
        p.to_json() for p in prompts
    ]
    assert load_suite(str(path)) == prompts


def test_token_ids_apply_the_chat_template_only_to_messages(tmp_path: Path) -> None:
    tokenizer = _word_tokenizer()
    vocab = tokenizer.get_vocab()
    chat = SuitePrompt(id="a", category="qa", messages=(
        ChatMessage("user", "hello"), ChatMessage("assistant", "hi"), ChatMessage("user", "world"),
    ))
    expected = ["<s>", "user", "hello", "</s>", "<s>", "assistant", "hi", "</s>",
                "<s>", "user", "world", "</s>", "<s>", "assistant"]
    assert chat.token_ids(tokenizer) == [vocab[w] for w in expected]
    raw = SuitePrompt(id="b", category="raw", prompt="hello world")
    assert raw.token_ids(tokenizer) == [vocab["hello"], vocab["world"]]
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        chat.token_ids(tokenizer)
    assert raw.token_ids(tokenizer) == [vocab["hello"], vocab["world"]]


MALFORMED = [
    ("{not json", "invalid JSON"),
    ('["a", "b"]', "expected a JSON object"),
    (json.dumps({"category": "qa", "prompt": "x"}), "missing field `id`"),
    (json.dumps({"id": "x", "prompt": "x"}), "missing field `category`"),
    (json.dumps({"id": 7, "category": "qa", "prompt": "x"}), "`id` must be a non-empty string"),
    (json.dumps({"id": "x", "category": "qa"}), "exactly one of `messages`, `prompt` or `turns`"),
    (json.dumps({**GOOD_CHAT, "id": "x", "prompt": "p"}), "exactly one of `messages`, `prompt` or `turns`"),
    (json.dumps({**GOOD_TURNS, "question_id": "x", "prompt": "p"}), "exactly one of `messages`, `prompt` or `turns`"),
    (json.dumps({**GOOD_TURNS, "turns": []}), "`turns` must be a non-empty list of strings"),
    (json.dumps({**GOOD_TURNS, "turns": "hello"}), "`turns` must be a non-empty list of strings"),
    (json.dumps({**GOOD_TURNS, "turns": ["hello", 3]}), "turn 2 of `turns` must be a non-empty string"),
    (json.dumps({**GOOD_TURNS, "turns": ["hello", " "]}), "turn 2 of `turns` must be a non-empty string"),
    (json.dumps({"question_id": "x", "turns": ["hello"]}), "missing field `category`"),
    (json.dumps({"category": "qa", "turns": ["hello"]}), "missing field `id` \\(or `question_id`\\)"),
    (json.dumps({**GOOD_TURNS, "question_id": True}), "`question_id` must be a non-empty string or an integer"),
    (json.dumps({**GOOD_TURNS, "question_id": 8.5}), "`question_id` must be a non-empty string or an integer"),
    (json.dumps({**GOOD_TURNS, "id": "x"}), "one of `id` or `question_id`, not both"),
    (json.dumps({**GOOD_TURNS, "reference": "42"}), "`reference` .* must be a list"),
    (json.dumps({**GOOD_TURNS, "question_id": "a"}), "duplicate id 'a' \\(first on line 1\\)"),
    (json.dumps({"id": "x", "category": "qa", "prompt": ["p"]}), "`prompt` must be a non-empty"),
    (json.dumps({"id": "x", "category": "qa", "messages": "hi"}), "must be a non-empty list"),
    (json.dumps({"id": "x", "category": "qa", "messages": []}), "must be a non-empty list"),
    (json.dumps({"id": "x", "category": "qa", "messages": [{"role": "user"}]}),
     "exactly `role` and `content`"),
    (json.dumps({"id": "x", "category": "qa", "messages": [{"role": "bot", "content": "hi"}]}),
     "unknown role 'bot'"),
    (json.dumps({"id": "x", "category": "qa", "messages": [{"role": "user", "content": 3}]}),
     "non-empty string `content`"),
    (json.dumps({"id": "x", "category": "qa", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}),
     "last message must have role 'user'"),
    (json.dumps({"id": "x", "category": "qa", "prompt": "p", "max_new_tokens": 0}),
     "`max_new_tokens` must be a positive integer"),
    (json.dumps({"id": "x", "category": "qa", "prompt": "p", "max_new_tokens": "9"}),
     "`max_new_tokens` must be a positive integer"),
    (json.dumps({"id": "x", "category": "qa", "prompt": "p", "max_tokens": 9}),
     "unknown field\\(s\\) max_tokens"),
    (json.dumps(GOOD_CHAT), "duplicate id 'a' \\(first on line 1\\)"),
]


@pytest.mark.parametrize(("bad_line", "problem"), MALFORMED, ids=[m[1][:28] for m in MALFORMED])
def test_malformed_line_names_file_and_line(tmp_path: Path, bad_line: str, problem: str) -> None:
    path = _write_lines(tmp_path / "bad.jsonl", [json.dumps(GOOD_CHAT), "", bad_line])
    with pytest.raises(ValueError, match=f"bad.jsonl, line 3: .*{problem}"):
        load_suite(path)


def test_mt_bench_questions_parse_with_int_ids_and_references(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "question.jsonl", [
        json.dumps({"question_id": 81, "category": "writing", "turns": ["hello there", "world"]}),
        json.dumps({"question_id": 111, "category": "math", "turns": ["hi"], "reference": ["4", "2"]}),
        json.dumps({**GOOD_CHAT, "id": "81b"}),  # forms mix in one file
        json.dumps({"question_id": "p", "category": "raw", "prompt": "hello", "max_new_tokens": 8}),
    ])
    prompts = load_suite(path)
    assert [p.id for p in prompts] == ["81", "111", "81b", "p"]
    assert prompts[0] == SuitePrompt(id="81", category="writing", turns=("hello there", "world"))
    assert [p.num_turns for p in prompts] == [2, 1, 1, 1]
    assert [prompts[0].turn_id(2), prompts[1].turn_id(1), prompts[2].turn_id(1)] == ["81#t2", "111#t1", "81b"]
    assert load_suite(_write_lines(tmp_path / "again.jsonl",
                                   [json.dumps(p.to_json()) for p in prompts])) == prompts  # round trip
    with pytest.raises(ValueError, match="duplicate id '81'"):  # an int id and its string are one id
        load_suite(_write_lines(tmp_path / "dup.jsonl", [
            json.dumps({"question_id": 81, "category": "c", "turns": ["x"]}),
            json.dumps({"id": "81", "category": "c", "prompt": "x"})]))


def test_turns_build_the_conversation_with_earlier_answers() -> None:
    tokenizer = _word_tokenizer()
    vocab = tokenizer.get_vocab()
    prompt = SuitePrompt(id="t", category="chat", turns=("hello", "world"))
    assert prompt.conversation() == (ChatMessage("user", "hello"),)
    assert prompt.conversation(["hi there"]) == (
        ChatMessage("user", "hello"), ChatMessage("assistant", "hi there"), ChatMessage("user", "world"))
    second = ["<s>", "user", "hello", "</s>", "<s>", "assistant", "hi", "there", "</s>",
              "<s>", "user", "world", "</s>", "<s>", "assistant"]
    assert prompt.token_ids(tokenizer, ["hi there"]) == [vocab[w] for w in second]
    assert prompt.token_ids(tokenizer) == [vocab[w] for w in ["<s>", "user", "hello", "</s>", "<s>", "assistant"]]
    with pytest.raises(ValueError, match="has 2 turn\\(s\\), so at most 1 earlier answer"):
        prompt.conversation(["a", "b"])
    with pytest.raises(ValueError, match="at most 0 earlier answer"):
        SuitePrompt(id="r", category="raw", prompt="hello").token_ids(tokenizer, ["hi"])


def test_every_malformed_line_is_reported_at_once(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "bad.jsonl", [
        "{not json", json.dumps(GOOD_CHAT), json.dumps({"id": "x", "prompt": "p"}), json.dumps(GOOD_CHAT)])
    with pytest.raises(ValueError) as err:
        load_suite(path)
    assert [line.split(": ")[0].rsplit(", ", 1)[1] for line in str(err.value).splitlines()] == [
        "line 1", "line 3", "line 4"]
    assert "missing field `category`" in str(err.value) and "duplicate id 'a'" in str(err.value)


def test_unknown_suite_and_empty_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="neither a built-in suite"):
        load_suite("no-such-suite")
    with pytest.raises(ValueError, match="holds no prompts"):
        load_suite(_write_lines(tmp_path / "empty.jsonl", ["", "  "]))


def test_prompt_needs_exactly_one_of_messages_or_prompt() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        SuitePrompt(id="x", category="qa")
    with pytest.raises(ValueError, match="exactly one of `messages`, `prompt` or `turns`"):
        SuitePrompt(id="x", category="qa", prompt="p", turns=("t",))


@pytest.mark.slow
def test_builtin_prompts_fit_the_default_target() -> None:
    from specdraft.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m")
    lengths = {p.id: len(p.token_ids(tokenizer)) for p in load_suite("builtin")}
    assert max(lengths.values()) < 700, lengths
    assert statistics.median(lengths.values()) > 30, lengths  # prompts are real text, not stubs
    # copy-heavy prompts carry a real text or code block to copy from
    copy_heavy = ("code_edit", "summarize")
    long_ones = [lengths[p.id] for p in load_suite("builtin") if p.category in copy_heavy]
    assert min(long_ones) > 150, lengths


@pytest.mark.slow  # the default target's tokenizer (GGUF, cached in the process)
def test_the_general_suite_has_its_categories_and_long_contexts() -> None:
    """benchmarks/check_general_suite.py: 9 categories of >= 8 prompts, two-turn chats, summaries of
    >= 1000 and retrieval prompts of >= 1500 first-turn tokens."""
    from specdraft.models import load_tokenizer

    module = load_script(Path(__file__).parents[1] / "benchmarks" / "check_general_suite.py")
    table, problems = module.check(module.DEFAULT_SUITE, load_tokenizer("smollm2-135m"))
    assert not problems and len(table) == 2 + len(module.CATEGORIES)
    assert {p.category for p in load_suite("general")} == set(module.CATEGORIES)


def test_validation_suite_takes_held_out_first_turns_per_kind_in_id_order() -> None:
    """benchmarks/validation_suite.py: one greedy first turn per held-out conversation, the first
    `magpie` Magpie conversations and `per_kind` of every other kind by id, as `messages` lines the
    suite loader reads (system prompt kept)."""
    module = load_script(Path(__file__).parents[1] / "benchmarks" / "validation_suite.py")

    def record(conv: str, kind: str, turn: int = 1, mode: str = "greedy") -> dict:
        return {"id": f"{conv}#t{turn}#{mode}", "conversation": conv, "turn": turn, "mode": mode, "kind": kind,
                "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"ask {conv}"}]}

    records = [record("m/2", "magpie"), record("m/1", "magpie"), record("m/1", "magpie", mode="sample"),
               record("m/3", "magpie", turn=2), record("m/0", "magpie"),
               record("c/9", "translate"), record("c/8", "translate"), record("c/7", "summarise")]
    lines = module.validation_lines(records, magpie=2, per_kind=1)
    assert [(line["id"], line["category"]) for line in lines] == [
        ("m/0", "magpie"), ("m/1", "magpie"), ("c/7", "summarise"), ("c/8", "translate")]
    prompts = parse_suite([json.dumps(line) for line in lines], "validation")
    assert prompts[0].messages is not None and prompts[0].messages[0].role == "system"
