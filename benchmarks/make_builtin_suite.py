"""Write the built-in prompt suites `specdraft/suites/builtin.jsonl` and `quick.jsonl`.

    .venv/bin/python benchmarks/make_builtin_suite.py            # rewrite both files
    .venv/bin/python benchmarks/make_builtin_suite.py --out-dir /tmp/suites

Six categories in the spirit of Spec-Bench, six prompts each, written for a small chat model
(SmolLM2-135M-Instruct: short, plain prompts, each under 700 tokens with the chat template):

- code_edit: a real function or class from the Python standard library (taken with `ast` from the
  module's source) plus an edit request (rename, type hints, docstring, small refactor). The answer
  copies most of the given code: the copy-heavy category where prompt lookup shines.
- code_write: write a small function from a description.
- summarize: a passage of the Python language reference (`pydoc_data/topics.py`, 150-400 words)
  and a request to extract or quote specific facts, so the answer copies from the text.
- qa: short general-knowledge and programming questions.
- chat: multi-turn: two or three earlier user/assistant turns, then a user turn.
- math: word problems asking for step-by-step reasoning.

The texts from the standard library depend on the Python version; the committed files were made
with the version in `GENERATED_WITH`. `quick.jsonl` (for `make demo`) holds the first two prompts
of four categories, byte-identical to their lines in `builtin.jsonl`.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import sys
from pathlib import Path

from pydoc_data.topics import topics

from specdraft.suites import ChatMessage, SuitePrompt, dump_suite

GENERATED_WITH = "3.11.7"
SUITE_DIR = Path(__file__).resolve().parents[1] / "specdraft" / "suites"
QUICK_CATEGORIES = ("code_edit", "summarize", "qa", "chat")
QUICK_PER_CATEGORY = 2
MIN_WORDS, MAX_WORDS = 150, 400

# (module, top-level function or class, edit request)
CODE_EDITS = (
    ("colorsys", "rgb_to_hsv",
     "Add type hints (three floats in, a tuple of three floats out) and a short docstring to "
     "this function. Do not change the body. Return the complete function."),
    ("genericpath", "commonprefix",
     "Rename the function to `common_prefix` and its parameter `m` to `paths` everywhere. "
     "Return the complete updated function."),
    ("html", "escape",
     "Add type hints: `s` is a `str`, `quote` is a `bool`, and the function returns a `str`. "
     "Keep everything else exactly the same and return the full function."),
    ("fnmatch", "filter",
     "Rename the variable `result` to `matches` and the parameter `names` to `candidates`. "
     "Return the complete code."),
    ("contextlib", "nullcontext",
     "Add type hints to every method of this class. Return the full class."),
    ("statistics", "median",
     "Refactor this function so that it returns early for an odd number of data points and "
     "has no `else` branch. Keep the docstring. Return the complete function."),
)

CODE_WRITES = (
    "Write a Python function `is_palindrome(text)` that returns True if the string reads the "
    "same forwards and backwards, ignoring case and spaces.",
    "Write a Python function `fizzbuzz(n)` that returns a list of strings for the numbers 1 to n: "
    "\"Fizz\" for multiples of 3, \"Buzz\" for multiples of 5, \"FizzBuzz\" for multiples of both, "
    "and the number itself otherwise.",
    "Write a Python function `count_words(text)` that returns a dictionary mapping each "
    "lower-cased word in the text to the number of times it appears.",
    "Write a Python function `flatten(nested)` that takes a list of lists and returns one flat "
    "list with all the items in order.",
    "Write a Python function `celsius_to_fahrenheit(celsius)` that converts a temperature and "
    "rounds the result to one decimal place. Include a docstring.",
    "Write a Python class `Stack` with the methods `push(item)`, `pop()`, `peek()` and "
    "`is_empty()`. `pop` and `peek` should raise IndexError when the stack is empty.",
)

# (topic key in pydoc_data.topics, extraction request)
PASSAGES = (
    ("assert",
     "Quote the two code blocks the passage gives as equivalents of the simple and the extended "
     "form of the assert statement. Then say in one sentence when no code is emitted for assert."),
    ("global",
     "List, as bullet points and using the passage's own words, the places where names listed "
     "in a global statement must not be defined."),
    ("for",
     "Quote the sentence that says what happens when the iterator is exhausted. Then summarise "
     "in two sentences what break and continue do inside a for loop."),
    ("booleans",
     "Copy from the passage the list of values that are interpreted as false. Then explain, "
     "quoting the passage, what the expression \"x and y\" returns."),
    ("context-managers",
     "Copy the signatures of the two methods the passage describes and give a one-sentence "
     "summary of each."),
    ("del",
     "Quote the sentence that says what happens when you delete a name, and the sentence about "
     "what deleting a slicing is equivalent to."),
)

QUESTIONS = (
    "What is the capital of France?",
    "What does the Python built-in function `len` return?",
    "What is the difference between a list and a tuple in Python?",
    "Why is the sky blue? Answer in two sentences.",
    "What does HTTP stand for?",
    "Who wrote the play Romeo and Juliet?",
)

# Each conversation alternates user / assistant and ends with a user turn.
CONVERSATIONS = (
    (
        "I want to learn to cook. Where should I start?",
        "Start with a few simple dishes such as scrambled eggs, pasta and rice. Learn basic knife "
        "skills and how to control the heat of your pan.",
        "What is a good first pasta recipe?",
        "Try spaghetti with garlic and olive oil. You need spaghetti, two cloves of garlic, olive "
        "oil, a pinch of chili flakes and some chopped parsley.",
        "How long should I cook the spaghetti, and how do I know it is done?",
    ),
    (
        "Here is my shopping list: milk, eggs, bread, apples.",
        "Got it. Your shopping list is:\n1. Milk\n2. Eggs\n3. Bread\n4. Apples",
        "Please add butter and rice, and show me the whole list again.",
    ),
    (
        "How do I make a list of the squares of the numbers from 1 to 10 in Python?",
        "You can use a loop:\n\n```python\nsquares = []\nfor n in range(1, 11):\n    "
        "squares.append(n * n)\nprint(squares)\n```",
        "Can you rewrite that with a list comprehension?",
    ),
    (
        "Can you write a short email to my team saying the meeting moved to Friday at 10am?",
        "Subject: Meeting moved to Friday\n\nHi team,\n\nThe meeting has moved to Friday at "
        "10am. Please update your calendars.\n\nThanks!",
        "Make it a bit more formal and sign it with my name, Anna Berg.",
    ),
    (
        "I am planning a weekend trip to the mountains. What should I pack?",
        "Pack layers of warm clothing, a rain jacket, good hiking boots, a water bottle, snacks, "
        "sunscreen, a small first aid kit and a map of the area.",
        "It might snow. Should I change anything?",
        "Yes: add a warm hat, gloves, thermal underwear and waterproof trousers, and check the "
        "road and trail conditions before you go.",
        "Thanks. Can you give me the complete packing list as bullet points?",
    ),
    (
        "I want to start running. How often should I run in the first month?",
        "Run three times a week with a rest day between runs. Start with 20 minutes of alternating "
        "one minute of running and two minutes of walking.",
        "My knees hurt a little after running. What should I do?",
    ),
)

WORD_PROBLEMS = (
    "A shop sells pencils at 3 for $1.20. How much do 12 pencils cost? Think step by step.",
    "Tom has 24 apples. He gives a third of them to his sister and 5 to his friend. How many "
    "apples does he have left? Explain each step.",
    "A train travels at 60 km per hour for 2.5 hours. How far does it go? Show your reasoning.",
    "The sum of two numbers is 30 and their difference is 8. What are the two numbers? Solve it "
    "step by step.",
    "A rectangle has a perimeter of 36 cm and its length is twice its width. What is its area? "
    "Show each step.",
    "A class has 28 students. 3 out of every 4 students passed the test. How many students did "
    "not pass? Reason step by step.",
)


def stdlib_source(module_name: str, name: str) -> str:
    """Source of the top-level function or class `name` in the pure-Python module `module_name`.

    Read through `ast` from the module file, so C-accelerated functions still give their Python
    source (and decorators/comments inside the body come with it).
    """
    source = inspect.getsource(importlib.import_module(module_name))
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            segment = ast.get_source_segment(source, node)
            if segment is not None:
                return segment
    raise ValueError(f"{module_name} has no top-level function or class {name!r}; pick another.")


def code_edit_request(module_name: str, name: str, request: str) -> str:
    """The user turn of a code_edit prompt: the stdlib code in a fenced block, then the request."""
    code = stdlib_source(module_name, name)
    kind = "class" if code.startswith("class ") else "function"
    return f"Here is a Python {kind}:\n\n```python\n{code}\n```\n\n{request}"


def passage(topic: str) -> str:
    """The reference text of `topic`, cut at paragraph ends to at most MAX_WORDS words."""
    paragraphs = topics[topic].strip().split("\n\n")
    kept: list[str] = []
    for paragraph in paragraphs:
        if kept and len(" ".join(kept + [paragraph]).split()) > MAX_WORDS:
            break
        kept.append(paragraph)
    text = "\n\n".join(kept)
    words = len(text.split())
    if not MIN_WORDS <= words <= MAX_WORDS:
        raise ValueError(f"topic {topic!r} gives {words} words, outside {MIN_WORDS}-{MAX_WORDS}.")
    return text


def _user(content: str) -> tuple[ChatMessage, ...]:
    return (ChatMessage(role="user", content=content),)


def _conversation(turns: tuple[str, ...]) -> tuple[ChatMessage, ...]:
    roles = ("user", "assistant")
    return tuple(ChatMessage(role=roles[i % 2], content=text) for i, text in enumerate(turns))


def _numbered(category: str, items: list[tuple[ChatMessage, ...]]) -> list[SuitePrompt]:
    return [
        SuitePrompt(id=f"{category}-{i:02d}", category=category, messages=messages)
        for i, messages in enumerate(items, start=1)
    ]


def builtin_suite() -> list[SuitePrompt]:
    """Every prompt of the built-in suite, category by category."""
    code_edit = [_user(code_edit_request(module, name, req)) for module, name, req in CODE_EDITS]
    summarize = [
        _user(f"Read this passage from the Python documentation:\n\n{passage(topic)}\n\n{request}")
        for topic, request in PASSAGES
    ]
    return (
        _numbered("code_edit", code_edit)
        + _numbered("code_write", [_user(text) for text in CODE_WRITES])
        + _numbered("summarize", summarize)
        + _numbered("qa", [_user(text) for text in QUESTIONS])
        + _numbered("chat", [_conversation(turns) for turns in CONVERSATIONS])
        + _numbered("math", [_user(text) for text in WORD_PROBLEMS])
    )


def quick_suite(prompts: list[SuitePrompt]) -> list[SuitePrompt]:
    """The first QUICK_PER_CATEGORY prompts of each of QUICK_CATEGORIES."""
    return [
        p for category in QUICK_CATEGORIES
        for p in [q for q in prompts if q.category == category][:QUICK_PER_CATEGORY]
    ]


def main() -> None:
    """Write builtin.jsonl and quick.jsonl into --out-dir (default: the package's suites folder)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=SUITE_DIR)
    args = parser.parse_args()
    version = ".".join(map(str, sys.version_info[:3]))
    if version != GENERATED_WITH:
        print(f"note: Python {version}, the committed suite was made with {GENERATED_WITH}; "
              "the standard-library texts may differ.", file=sys.stderr)
    prompts = builtin_suite()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    dump_suite(prompts, args.out_dir / "builtin.jsonl")
    dump_suite(quick_suite(prompts), args.out_dir / "quick.jsonl")
    print(f"wrote {len(prompts)} prompts to {args.out_dir / 'builtin.jsonl'} "
          f"and {len(quick_suite(prompts))} to {args.out_dir / 'quick.jsonl'}")


if __name__ == "__main__":
    main()
