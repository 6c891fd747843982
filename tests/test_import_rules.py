"""The import rules of docs/ARCHITECTURE.md, checked on the source: serving code (`specdraft/`
outside `specdraft/train/`, and `drafters/`) never imports `specdraft.train`, not even inside a
function, and `specdraft/` never imports `drafters`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    """Every module an `import` or `from ... import` anywhere in the file names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def serving_files() -> list[Path]:
    core = [p for p in (ROOT / "specdraft").rglob("*.py") if "train" not in p.relative_to(ROOT / "specdraft").parts[:1]]
    return core + sorted((ROOT / "drafters").rglob("*.py"))


def test_serving_code_never_imports_training_code() -> None:
    offenders = {str(p.relative_to(ROOT)): sorted(m for m in imported_modules(p) if m.startswith("specdraft.train"))
                 for p in serving_files()}
    assert not {k: v for k, v in offenders.items() if v}


def test_the_core_never_imports_drafters() -> None:
    offenders = {}
    for p in (ROOT / "specdraft").rglob("*.py"):
        if "train" in p.relative_to(ROOT / "specdraft").parts[:1]:
            continue  # recipes may import the drafters they train
        bad = sorted(m for m in imported_modules(p) if m == "drafters" or m.startswith("drafters."))
        if bad:
            offenders[str(p.relative_to(ROOT))] = bad
    assert not offenders
