"""Long-context tasks built from an offline corpus: the Python standard library's docs and source.

Users paste documents and ask for summaries, extractions, explanations, translations and answers
grounded in passages; a drafter trained only on short chat turns has never seen a long context.
These tasks put 500-3000 tokens of real text (the `pydoc_data` reference topics, module pages made
of docstrings, source code) in front of varied instructions. Each document chunk is used by one task
only, so the near-duplicate filter (`specdraft.train.dedup`) keeps them all.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from pydoc_data.topics import topics

from specdraft.train.selfgen_prompts import parsed_modules

SKIP_DIRS = ("test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "tkinter", "turtledemo",
             "__pycache__", "ensurepip", "venv")
LANGUAGES = ("French", "German", "Spanish", "Italian", "Portuguese", "Dutch", "Chinese", "Japanese")


@dataclass(frozen=True)
class Document:
    """One chunk of offline text: `kind` is "prose" (docs) or "code" (source)."""

    key: str
    title: str
    kind: str
    text: str


@dataclass(frozen=True)
class Task:
    """One first user turn built from documents; `kind` names the task (summarise, extract, ...)."""

    key: str
    kind: str
    text: str


def chunks(text: str, max_chars: int, sep: str = "\n\n") -> list[str]:
    """`text` cut at `sep` boundaries into pieces of at most about `max_chars` characters."""
    out: list[str] = []
    cur = ""
    parts = text.split(sep)
    if sep != "\n" and any(len(p) > max_chars for p in parts):  # a piece too long: cut it at lines
        parts = [q for p in parts for q in (chunks(p, max_chars, "\n") if len(p) > max_chars else [p])]
    parts = [p[i : i + max_chars] for p in parts for i in range(0, max(len(p), 1), max_chars)]
    for part in parts:
        if cur and len(cur) + len(part) > max_chars:
            out.append(cur.strip())
            cur = ""
        cur += part + sep
    if cur.strip():
        out.append(cur.strip())
    return out


def stdlib_sources() -> list[Path]:
    """Every standard-library source file outside tests, tools and GUI demos, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if not set(p.relative_to(root).parts[:-1]) & set(SKIP_DIRS))


def _module_page(name: str, tree: ast.Module) -> str:
    """A documentation page of a module: its docstring and each public definition's docstring."""
    parts = [f"Module {name}\n\n{ast.get_docstring(tree) or ''}".strip()]
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 40:
                head = f"{node.name}({ast.unparse(node.args)})" if isinstance(node, ast.FunctionDef) else f"class {node.name}"
                parts.append(f"{head}\n    {doc}")
    return "\n\n".join(parts)


def documents(min_chars: int = 1500, max_chars: int = 10000, code_per_prose: float = 2.0) -> list[Document]:
    """Prose chunks (reference topics, module pages) and code chunks (top-level definitions) of about
    min_chars..max_chars characters (roughly 400-3000 tokens), in a fixed order; at most
    `code_per_prose` code chunks per prose chunk (the library has far more source than docs)."""
    docs: list[Document] = []
    for key in sorted(topics):
        for i, c in enumerate(chunks(topics[key], max_chars)):
            if len(c) >= min_chars:
                docs.append(Document(f"topic/{key}/{i}", key.replace("-", " "), "prose", c))
    root = Path(sysconfig.get_paths()["stdlib"])
    for path, source, tree in parsed_modules(stdlib_sources()):
        name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for i, c in enumerate(chunks(_module_page(name, tree), max_chars)):
            if len(c) >= min_chars:
                docs.append(Document(f"page/{name}/{i}", name, "prose", c))
        for i, c in enumerate(chunks(source, max_chars, sep="\n\n\n")):
            if len(c) >= min_chars:
                docs.append(Document(f"code/{name}/{i}", name, "code", c))
    prose = [d for d in docs if d.kind == "prose"]
    code = [d for d in docs if d.kind == "code"]
    keep = max(1, int(code_per_prose * len(prose)))
    return prose + code[:: max(1, -(-len(code) // keep))]


PROSE_INSTRUCTIONS = {
    "summarise": (
        "Summarise the following text in {n} sentences.",
        "Give me a short summary of this documentation, as {n} bullet points.",
        "I don't have time to read all of this. What are the main points?",
        "Write a one-paragraph summary of the text below for a beginner.",
        "TL;DR of the following, please.",
    ),
    "extract": (
        "List every term that the text below defines, each with a one-line definition.",
        "Extract the rules described in this text as a numbered list.",
        "Make a table of the functions or statements mentioned below and what each one does.",
        "Which examples appear in this text? List them with a short explanation each.",
        "Pull out all the warnings, exceptions and error conditions the text mentions.",
    ),
    "explain": (
        "Explain the text below in simple words, as if to a new programmer.",
        "What is the most important idea in this documentation, and why does it matter?",
        "Write three quiz questions with answers that test understanding of this text.",
        "Rewrite this documentation as a short tutorial with an example.",
    ),
}
CODE_INSTRUCTIONS = (
    "Explain what this code does, step by step.",
    "Find possible bugs or edge cases in this code.",
    "Write a short docstring for each function or class in this code.",
    "Summarise the purpose of this module in a few sentences.",
    "How could this code be made easier to read? Show an improved version of one part.",
    "Write unit tests with pytest for the main function in this code.",
)
PASSAGE_QUESTIONS = (
    "Using only the passages above, explain what {a} is and how it is used. Cite the passage numbers.",
    "Based on the passages, how does {a} differ from {b}? Cite the passages you use.",
    "Answer from the passages only: what should a programmer know about {a}? Cite them like [1].",
    "Which passage talks about {a}, and what does it say? If none does, say so.",
)


def _wrap(rng: random.Random, instruction: str, body: str) -> str:
    """The instruction before or after the document (both are common in real requests)."""
    return f"{instruction}\n\n{body}" if rng.random() < 0.6 else f"{body}\n\n{instruction}"


def corpus_tasks(seed: int = 0, passage_tasks: int = 400) -> list[Task]:
    """One task per document chunk (summarise / extract / explain for prose, code tasks for source),
    translations of single paragraphs, and questions over 3-6 passages; shuffled with `seed`."""
    rng = random.Random(seed)
    tasks: list[Task] = []
    paragraphs: list[tuple[str, str]] = []  # (title, paragraph) for translations and passages
    for doc in documents():
        if doc.kind == "code":
            body = f"```python\n{doc.text}\n```"
            tasks.append(Task(f"corpus/{doc.key}", "explain_code", _wrap(rng, rng.choice(CODE_INSTRUCTIONS), body)))
            continue
        kind = rng.choice(sorted(PROSE_INSTRUCTIONS))
        instruction = rng.choice(PROSE_INSTRUCTIONS[kind]).format(n=rng.choice((2, 3, 5)))
        tasks.append(Task(f"corpus/{doc.key}", kind, _wrap(rng, instruction, doc.text)))
        paragraphs += [(doc.title, p) for p in doc.text.split("\n\n") if 300 <= len(p) <= 1500]
    rng.shuffle(paragraphs)
    n_translate = len(paragraphs) // 3
    for i, (_, p) in enumerate(paragraphs[:n_translate]):
        lang = rng.choice(LANGUAGES)
        tasks.append(Task(f"corpus/translate/{i}", "translate", _wrap(rng, f"Translate this into {lang}:", p)))
    pool = paragraphs[n_translate:]
    for i in range(min(passage_tasks, len(pool) // 3)):
        picked = rng.sample(pool, rng.randint(3, 6))
        body = "\n\n".join(f"[{j + 1}] {p}" for j, (_, p) in enumerate(picked))
        a, b = picked[0][0], picked[-1][0]
        tasks.append(Task(f"corpus/passages/{i}", "passages_qa", f"{body}\n\n{rng.choice(PASSAGE_QUESTIONS).format(a=a, b=b)}"))
    rng.shuffle(tasks)
    return tasks
