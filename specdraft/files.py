"""Files that are replaced whole: a reader, a concurrent job, or a run killed mid-write sees the
old file or the new one, never half of one; and the per-user folder for what is measured or parsed
once and kept across runs (`cache_dir`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    """Where measured costs and parsed tokenizers are kept ($SPECDRAFT_CACHE_DIR or ~/.cache/specdraft)."""
    return Path(os.environ.get("SPECDRAFT_CACHE_DIR") or Path.home() / ".cache" / "specdraft")


def replace_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Let `write` fill a temporary file next to `path` (named by this process, so concurrent
    sweep jobs never share one), then move it onto `path` in one step (os.replace)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomically(path: Path, text: str) -> None:
    """`path` replaced by `text` (see `replace_atomically`)."""
    replace_atomically(path, lambda tmp: tmp.write_text(text))
