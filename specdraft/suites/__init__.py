"""Prompt suites: the JSONL files that `specdraft-bench`, `make demo` and the GPU check run.

A suite is a JSONL file, one prompt per line, in one of two forms:

    {"id": "qa-01", "category": "qa", "messages": [{"role": "user", "content": "..."}]}
    {"id": "raw-01", "category": "completion", "prompt": "def fibonacci(n):"}

plus an optional positive integer "max_new_tokens". `messages` go through the tokenizer's chat
template (with the generation prompt appended); a raw `prompt` is encoded as it is. Built-in suites
ship as package data in `specdraft/suites/` ("builtin": 6 categories x 6 prompts in the spirit of
Spec-Bench, written by `benchmarks/make_builtin_suite.py`; "quick": its first two prompts of four
categories, for `make demo`); any other name is read as a file path. The shipped drafters' training
prompts were built in the builtin suite's categories, so for them it is in-distribution: judge a
trained drafter on a held-out suite of your own as well (docs/ARCHITECTURE.md, evaluation).
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

BUILTIN_SUITES = ("builtin", "quick")
ROLES = ("system", "user", "assistant")
_REQUIRED = ("id", "category")
_OPTIONAL = ("messages", "prompt", "max_new_tokens")


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
    """One prompt of a suite: exactly one of `messages` (a chat) or `prompt` (raw text) is set."""

    id: str
    category: str
    messages: tuple[ChatMessage, ...] | None = None
    prompt: str | None = None
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError(
                f"prompt {self.id!r} must have exactly one of `messages` or `prompt`; set one."
            )

    def token_ids(self, tokenizer: Any) -> list[int]:
        """Prompt token ids: chat template + generation prompt for messages, else plain encode."""
        if self.prompt is not None:
            return list(tokenizer.encode(self.prompt))
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"prompt {self.id!r} is a chat but the tokenizer has no chat template; use a "
                "chat model's tokenizer or write the prompt as raw text in a `prompt` field."
            )
        text = tokenizer.apply_chat_template(
            [m.as_dict() for m in self.messages or ()], add_generation_prompt=True, tokenize=False
        )
        # The rendered template already holds every special token it needs.
        return list(tokenizer.encode(text, add_special_tokens=False))

    def to_json(self) -> dict[str, Any]:
        """The JSONL record of this prompt (inverse of parsing; `None` fields are left out)."""
        record: dict[str, Any] = {"id": self.id, "category": self.category}
        if self.messages is not None:
            record["messages"] = [m.as_dict() for m in self.messages]
        else:
            record["prompt"] = self.prompt
        if self.max_new_tokens is not None:
            record["max_new_tokens"] = self.max_new_tokens
        return record


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


def parse_record(record: Any) -> SuitePrompt:
    """Validate one decoded JSON line and build its `SuitePrompt`; ValueError says what is wrong."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    unknown = sorted(set(record) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise ValueError(
            f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(_REQUIRED + _OPTIONAL)}"
        )
    for key in _REQUIRED:
        if key not in record:
            raise ValueError(f"missing field `{key}`")
        if not isinstance(record[key], str) or not record[key].strip():
            raise ValueError(f"field `{key}` must be a non-empty string")
    has_messages, has_prompt = "messages" in record, "prompt" in record
    if has_messages == has_prompt:
        raise ValueError("give exactly one of `messages` or `prompt`")
    max_new = record.get("max_new_tokens")
    bad_int = not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 1
    if max_new is not None and bad_int:
        raise ValueError("`max_new_tokens` must be a positive integer")
    prompt = record.get("prompt")
    if has_prompt and (not isinstance(prompt, str) or not prompt.strip()):
        raise ValueError("field `prompt` must be a non-empty string")
    return SuitePrompt(
        id=record["id"],
        category=record["category"],
        messages=_parse_messages(record["messages"]) if has_messages else None,
        prompt=prompt if has_prompt else None,
        max_new_tokens=max_new,
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
    """Load a built-in suite by name ("builtin", "quick") or a user's JSONL file by path."""
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
        for prompt in prompts:
            handle.write(json.dumps(prompt.to_json(), ensure_ascii=False) + "\n")


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
