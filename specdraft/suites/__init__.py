"""Prompt suites: the JSONL files that `specdraft-bench`, `make demo` and the GPU check run.

A suite is a JSONL file, one prompt per line, in one of three forms:

    {"id": "qa-01", "category": "qa", "messages": [{"role": "user", "content": "..."}]}
    {"id": "raw-01", "category": "completion", "prompt": "def fibonacci(n):"}
    {"question_id": 81, "category": "writing", "turns": ["user turn 1", "user turn 2"]}

plus an optional positive integer "max_new_tokens" (per turn). `messages` go through the tokenizer's
chat template (with the generation prompt appended); a raw `prompt` is encoded as it is. `turns` is
the MT-bench / Spec-Bench question.jsonl format, so those files run as they are: the model answers
turn 1, its answer is appended as an assistant message, then it answers turn 2 on the whole
conversation, and so on (`SuitePrompt.conversation`). The id is `id` (a string) or `question_id`
(a string or an integer, kept as a string) in every form; MT-bench's "reference" answers are
accepted and ignored. A file may mix forms. Built-in suites
ship as package data in `specdraft/suites/` ("builtin": 6 categories x 6 prompts in the spirit of
Spec-Bench, written by `benchmarks/make_builtin_suite.py`; "quick": its first two prompts of four
categories, for `make demo`; "general": a hand-written held-out suite in the `turns` form;
"repeated": hand-written workloads that repeat themselves, the same instruction over several
inputs and tool calls under one shared tool schema, for drafters that remember earlier requests);
any other name is read as a file path. The shipped drafters' training prompts were built in the
builtin suite's categories, so for them it is in-distribution: judge a trained drafter on a
held-out suite ("general", or your own) as well (docs/ARCHITECTURE.md, evaluation).
Malformed lines raise one `ValueError` naming the file, each bad line's number and its problem, so a
user's own suite fails, whole, before any model is loaded.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

BUILTIN_SUITES = ("builtin", "quick", "general", "repeated")
ROLES = ("system", "user", "assistant")
ID_FIELDS = ("id", "question_id")  # ours, MT-bench's
BODY_FIELDS = ("messages", "prompt", "turns")  # exactly one per line
_OPTIONAL = ("max_new_tokens", "reference")  # "reference": MT-bench's reference answers, ignored
_ALLOWED = (*ID_FIELDS, "category", *BODY_FIELDS, *_OPTIONAL)


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation: `role` is system, user or assistant."""

    role: str
    content: str

    def as_dict(self) -> dict[str, str]:
        """The `{"role", "content"}` mapping that chat templates and the JSONL format use."""
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class SuitePrompt:
    """One prompt of a suite: exactly one of `messages` (a chat), `prompt` (raw text) or `turns`
    (user turns of a multi-turn conversation, each answered by the model in turn) is set."""

    id: str
    category: str
    messages: tuple[ChatMessage, ...] | None = None
    prompt: str | None = None
    max_new_tokens: int | None = None
    turns: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if sum(body is not None for body in (self.messages, self.prompt, self.turns)) != 1:
            raise ValueError(
                f"prompt {self.id!r} must have exactly one of `messages`, `prompt` or `turns`; set one."
            )

    @property
    def num_turns(self) -> int:
        """How many answers the model generates: one per user turn, 1 for `messages` and `prompt`."""
        return len(self.turns) if self.turns is not None else 1

    def turn_id(self, turn: int) -> str:
        """The id of turn `turn` (1-based) in results: `<id>#t<turn>` for `turns`, else the id."""
        return self.id if self.turns is None else f"{self.id}#t{turn}"

    def conversation(self, answers: Sequence[str] = ()) -> tuple[ChatMessage, ...] | None:
        """The chat the model answers next: `messages`, or for `turns` the user turns up to turn
        len(answers) + 1 with the model's earlier `answers` between them as assistant messages;
        None for a raw `prompt`."""
        if len(answers) >= self.num_turns:
            raise ValueError(
                f"prompt {self.id!r} has {self.num_turns} turn(s), so at most {self.num_turns - 1} "
                f"earlier answer(s), not {len(answers)}."
            )
        if self.turns is None:
            return self.messages
        messages = []
        for turn, answer in zip(self.turns, [*answers, None]):
            messages.append(ChatMessage("user", turn))
            if answer is not None:
                messages.append(ChatMessage("assistant", answer))
        return tuple(messages)

    def token_ids(self, tokenizer: Any, answers: Sequence[str] = ()) -> list[int]:
        """Prompt token ids: chat template + generation prompt for a chat (`conversation(answers)`:
        the first turn when no answers are given), else plain encode."""
        messages = self.conversation(answers)
        if messages is None:
            return list(tokenizer.encode(self.prompt))
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"prompt {self.id!r} is a chat but the tokenizer has no chat template; use a "
                "chat model's tokenizer or write the prompt as raw text in a `prompt` field."
            )
        return chat_prompt_ids(tokenizer, [m.as_dict() for m in messages])

    def user_texts(self) -> list[str]:
        """Every user message of this prompt (all turns), e.g. to keep them out of training data."""
        if self.turns is not None:
            return list(self.turns)
        return [m.content for m in self.messages or () if m.role == "user"]

    def to_json(self) -> dict[str, Any]:
        """The JSONL record of this prompt (inverse of parsing; `None` fields are left out)."""
        record: dict[str, Any] = {"id": self.id, "category": self.category}
        if self.messages is not None:
            record["messages"] = [m.as_dict() for m in self.messages]
        elif self.turns is not None:
            record["turns"] = list(self.turns)
        else:
            record["prompt"] = self.prompt
        if self.max_new_tokens is not None:
            record["max_new_tokens"] = self.max_new_tokens
        return record


def chat_prompt_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Token ids of a chat with the generation prompt appended, as every prompt here is encoded."""
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    # The rendered template already holds every special token it needs.
    return list(tokenizer.encode(text, add_special_tokens=False))


def _line_error(source: str, line_no: int, problem: str) -> str:
    return f"{source}, line {line_no}: {problem}"


def _parse_messages(value: Any) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise ValueError("`messages` must be a non-empty list of {\"role\", \"content\"} objects")
    messages = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or set(item) != {"role", "content"}:
            raise ValueError(f"message {i} must be an object with exactly `role` and `content`")
        role, content = item["role"], item["content"]
        if role not in ROLES:
            raise ValueError(f"message {i} has unknown role {role!r}; use {', '.join(ROLES)}")
        if not isinstance(content, str) or not content.strip():
            raise ValueError(f"message {i} needs a non-empty string `content`")
        messages.append(ChatMessage(role=role, content=content))
    if messages[-1].role != "user":
        raise ValueError("the last message must have role 'user' (the model answers it)")
    return tuple(messages)


def _parse_turns(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ValueError("`turns` must be a non-empty list of strings (the user's turns)")
    for i, turn in enumerate(value, start=1):
        if not isinstance(turn, str) or not turn.strip():
            raise ValueError(f"turn {i} of `turns` must be a non-empty string")
    return tuple(value)


def _parse_id(record: dict[str, Any]) -> str:
    """`id` (a non-empty string) or MT-bench's `question_id` (a non-empty string or an integer)."""
    given = [key for key in ID_FIELDS if key in record]
    if len(given) != 1:
        raise ValueError("missing field `id` (or `question_id`)" if not given
                         else "give one of `id` or `question_id`, not both")
    value = record[given[0]]
    if given[0] == "question_id" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        kinds = "a non-empty string or an integer" if given[0] == "question_id" else "a non-empty string"
        raise ValueError(f"field `{given[0]}` must be {kinds}")
    return value


def parse_record(record: Any) -> SuitePrompt:
    """Validate one decoded JSON line and build its `SuitePrompt`; ValueError says what is wrong."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    unknown = sorted(set(record) - set(_ALLOWED))
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(_ALLOWED)}")
    prompt_id = _parse_id(record)
    if "category" not in record:
        raise ValueError("missing field `category`")
    if not isinstance(record["category"], str) or not record["category"].strip():
        raise ValueError("field `category` must be a non-empty string")
    bodies = [key for key in BODY_FIELDS if key in record]
    if len(bodies) != 1:
        raise ValueError("give exactly one of `messages`, `prompt` or `turns`")
    if "reference" in record and not isinstance(record["reference"], list):
        raise ValueError("`reference` (reference answers, ignored) must be a list")
    max_new = record.get("max_new_tokens")
    bad_int = not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 1
    if max_new is not None and bad_int:
        raise ValueError("`max_new_tokens` must be a positive integer")
    prompt = record.get("prompt")
    if "prompt" in record and (not isinstance(prompt, str) or not prompt.strip()):
        raise ValueError("field `prompt` must be a non-empty string")
    return SuitePrompt(
        id=prompt_id,
        category=record["category"],
        messages=_parse_messages(record["messages"]) if "messages" in record else None,
        prompt=prompt,
        max_new_tokens=max_new,
        turns=_parse_turns(record["turns"]) if "turns" in record else None,
    )


def parse_suite(lines: Iterable[str], source: str) -> list[SuitePrompt]:
    """Parse JSONL lines (blank lines skipped); errors name `source` and the 1-based line number.

    Every malformed line is reported, one per line of the ValueError's message, so a user fixes
    the whole file in one go."""
    prompts: list[SuitePrompt] = []
    problems: list[str] = []
    first_line: dict[str, int] = {}
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            problems.append(_line_error(source, line_no, f"invalid JSON ({err.msg}); fix the line"))
            continue
        try:
            prompt = parse_record(record)
        except ValueError as err:
            problems.append(_line_error(source, line_no, f"{err}; fix the line"))
            continue
        if prompt.id in first_line:
            problems.append(_line_error(
                source, line_no,
                f"duplicate id {prompt.id!r} (first on line {first_line[prompt.id]}); "
                "ids must be unique",
            ))
            continue
        first_line[prompt.id] = line_no
        prompts.append(prompt)
    if problems:
        raise ValueError("\n".join(problems))
    if not prompts:
        raise ValueError(f"{source} holds no prompts; add one JSON object per line.")
    return prompts


def load_suite(name_or_path: str | Path) -> list[SuitePrompt]:
    """Load a built-in suite by name (BUILTIN_SUITES) or a user's JSONL file by path."""
    key = str(name_or_path)
    if key in BUILTIN_SUITES:
        resource = resources.files(__name__).joinpath(f"{key}.jsonl")
        return parse_suite(resource.read_text(encoding="utf-8").splitlines(), f"suite {key!r}")
    path = Path(key).expanduser()
    if not path.is_file():
        raise ValueError(
            f"suite {key!r} is neither a built-in suite ({', '.join(BUILTIN_SUITES)}) nor an "
            "existing file; pass a built-in name or the path of a JSONL file."
        )
    with path.open(encoding="utf-8") as handle:
        return parse_suite(handle, str(path))


def dump_suite(prompts: Sequence[SuitePrompt], path: str | Path) -> None:
    """Write prompts as JSONL (one object per line, UTF-8, non-ASCII kept readable)."""
    with Path(path).open("w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(prompt.to_json(), ensure_ascii=False) + "\n" for prompt in prompts)


def by_category(prompts: Iterable[SuitePrompt]) -> dict[str, list[SuitePrompt]]:
    """Group prompts by category, categories in order of first appearance."""
    groups: dict[str, list[SuitePrompt]] = {}
    for prompt in prompts:
        groups.setdefault(prompt.category, []).append(prompt)
    return groups


def categories(prompts: Iterable[SuitePrompt]) -> list[str]:
    """The distinct categories of `prompts`, in order of first appearance."""
    return list(by_category(prompts))


def suite_summary(prompts: Iterable[SuitePrompt]) -> Mapping[str, int]:
    """Number of prompts per category (what the bench prints before it starts)."""
    return {name: len(group) for name, group in by_category(prompts).items()}
