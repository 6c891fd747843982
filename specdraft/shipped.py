"""Where the trained artifacts shipped with specdraft live, and the one rule that names them.

Shipped artifacts sit in `specdraft/artifacts/<target alias>/<artifact>/` (e.g.
`smollm2-135m/draft`, `smollm2-135m/early_exit`, `smollm2-135m/medusa`,
`smollm2-135m/medusa_recurrent`) and are named `<target alias>/<artifact>`. A drafter whose
artifact kind has one default per target (the exit adapter, Medusa heads) also accepts the bare
target alias (`smollm2-135m` -> `smollm2-135m/<default>`). A path to a directory always works.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specdraft.target import TargetModel

ARTIFACTS_DIR = Path(__file__).resolve().parent / "artifacts"


def shipped_names() -> list[str]:
    """Every shipped artifact as `<target alias>/<artifact>`."""
    return sorted(f"{d.parent.name}/{d.name}" for d in ARTIFACTS_DIR.glob("*/*") if d.is_dir())


def resolve_artifact(spec: str | Path, default: str | None = None) -> Path | None:
    """The directory `spec` names, or None if it names none.

    spec: a directory path, a shipped name `<alias>/<artifact>`, or (with `default`) a bare target
    alias meaning `<alias>/<default>`.
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    text = str(spec).strip("/")
    if text and (ARTIFACTS_DIR / text).is_dir() and "/" in text:
        return ARTIFACTS_DIR / text
    if default is not None and "/" not in text and (ARTIFACTS_DIR / text / default).is_dir():
        return ARTIFACTS_DIR / text / default
    return None


def require_artifact(spec: str | Path, kind: str, default: str | None = None) -> Path:
    """`resolve_artifact`, or a ValueError that says what exists and how to make one."""
    found = resolve_artifact(spec, default)
    if found is None:
        raise ValueError(
            f"{kind} {str(spec)!r} is neither a directory nor a shipped artifact; shipped: "
            f"{', '.join(shipped_names())}. Train your own with the specdraft-train-* commands."
        )
    return found


def artifact_label(path: str | Path) -> str:
    """How messages name an artifact directory: `<alias>/<artifact>` when shipped, else its path."""
    resolved = Path(path).expanduser().resolve()
    if resolved.parent.parent == ARTIFACTS_DIR:
        return f"{resolved.parent.name}/{resolved.name}"
    return str(path)


def shipped_pruned_vocab(target: TargetModel) -> Path | None:
    """The pruned vocabulary of the first shipped artifact (in name order) made for `target` (its
    config JSON records this target: same sizes and tokenizer), or None. Lets a drafter without an
    artifact of its own (the quantized copy) use the subset made for its target."""
    from specdraft.formats.target_info import check_target, read_record
    from specdraft.vocab import VOCAB_FILE

    for vocab_file in sorted(ARTIFACTS_DIR.glob(f"*/*/{VOCAB_FILE}")):
        records = [read_record(f) for f in sorted(vocab_file.parent.glob("*.json")) if f.name != VOCAB_FILE]
        record = next((r for r in records if r), None)
        if record is None or not record.get("tokenizer_hash"):
            continue
        try:
            check_target(record, target, str(vocab_file.parent))
        except ValueError:
            continue
        return vocab_file
    return None
