"""Offline data: the training corpus that exists on every machine, and user text files.

Corpus: the Python standard library's source (`sysconfig.get_paths()["stdlib"]`) and its
English reference text (`pydoc_data/topics.py`), plus any user text / JSONL files. The split into
train / eval is by a stable hash of the document name, so it never changes between runs or machines
with the same Python version.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor

SPLITS = ("train", "eval")


def _split_of(name: str, eval_fraction: float) -> str:
    digest = hashlib.sha1(name.encode()).digest()
    return "eval" if int.from_bytes(digest[:4], "big") / 2**32 < eval_fraction else "train"


def stdlib_documents() -> Iterator[tuple[str, str]]:
    """(name, text) for every .py file of the standard library (tests and site-packages excluded)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("site-packages/", "test/", "idlelib/idle_test/")) or "/tests/" in rel:
            continue
        try:
            yield f"stdlib/{rel}", path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue


def pydoc_documents() -> Iterator[tuple[str, str]]:
    """(name, text) for every topic of the English reference shipped in `pydoc_data.topics`."""
    from pydoc_data.topics import topics

    for key in sorted(topics):
        yield f"pydoc/{key}", topics[key]


def user_documents(paths: Sequence[str | Path]) -> Iterator[tuple[str, str]]:
    """(name, text) from user files: .jsonl lines with a "text" field, anything else as plain text."""
    for p in map(Path, paths):
        if not p.is_file():
            raise ValueError(f"corpus file {str(p)!r} does not exist; check the path.")
        if p.suffix == ".jsonl":
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    text = json.loads(line)["text"]
                except (json.JSONDecodeError, KeyError, TypeError) as err:
                    raise ValueError(
                        f"{p}:{i}: expected a JSON object with a \"text\" field ({err})."
                    ) from err
                yield f"{p.name}:{i}", text
        else:
            yield p.name, p.read_text(encoding="utf-8")


def corpus_documents(
    split: str = "train",
    sources: Sequence[str] = ("stdlib", "pydoc"),
    extra_files: Sequence[str | Path] = (),
    eval_fraction: float = 0.05,
) -> list[tuple[str, str]]:
    """Documents of one split. sources: any of "stdlib", "pydoc"; extra_files: user files."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
    readers = {"stdlib": stdlib_documents, "pydoc": pydoc_documents}
    unknown = set(sources) - set(readers)
    if unknown:
        raise ValueError(f"unknown corpus source(s) {sorted(unknown)}; choose from {sorted(readers)}.")
    docs = [d for s in sources for d in readers[s]()] + list(user_documents(extra_files))
    return [(name, text) for name, text in docs if _split_of(name, eval_fraction) == split]


def token_blocks(
    tokenizer: object,
    documents: Sequence[tuple[str, str]],
    block_size: int,
    max_tokens: int | None = None,
) -> Tensor:
    """Tokenize documents, join them with EOS, and cut into blocks [N, block_size] (int64)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    ids: list[int] = []
    for _, text in documents:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])  # type: ignore[operator]
        if eos is not None:
            ids.append(int(eos))
        if max_tokens is not None and len(ids) >= max_tokens:
            break
    if max_tokens is not None:
        ids = ids[:max_tokens]
    n = len(ids) // block_size
    if n == 0:
        raise ValueError(
            f"the corpus has {len(ids)} tokens, fewer than one block of {block_size}; "
            "add text or lower block_size."
        )
    return torch.tensor(ids[: n * block_size], dtype=torch.long).view(n, block_size)
