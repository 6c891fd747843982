"""What a trained artifact records about the target it was made for, and the check on loading it.

Every artifact (distilled draft, exit adapter, Medusa heads) stores a record of its target under
`RECORD_KEY` in its own config JSON (draft.json, adapter_config.json, medusa_config.json):

    {"name_or_path": "smollm2-135m", "hidden_size": 576, "vocab_size": 49152, "num_layers": 30,
     "tokenizer_hash": "<12 hex digits of the tokenizer vocabulary's sha256>"}

Loading an artifact onto another target then fails with one sentence naming both targets, before
any weight is loaded (instead of a torch size mismatch). Each artifact compares only what matters
for it (`DRAFT_KEYS`, `HEADS_KEYS`, `EXIT_KEYS`); artifacts saved before records existed are
checked on what their tensor shapes tell (`from_shapes`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdraft.vocab import PrunedVocab

if TYPE_CHECKING:
    from specdraft.target import TargetModel

RECORD_KEY = "target_model"  # the record's key in an artifact's config JSON
FIELDS = ("hidden_size", "vocab_size", "num_layers", "tokenizer_hash")  # what can be compared
DRAFT_KEYS = ("hidden_size", "vocab_size", "tokenizer_hash")  # a draft shares embeddings and token ids
HEADS_KEYS = ("hidden_size", "vocab_size")  # heads read the last hidden state, project onto lm_head
EXIT_KEYS = ("hidden_size", "vocab_size", "num_layers")  # an exit adapter sits after layer E of N
_LABELS = {"hidden_size": "hidden size {}", "vocab_size": "vocab {}", "num_layers": "{} layers",
           "tokenizer_hash": "tokenizer {}"}


def tokenizer_hash(tokenizer: object | None) -> str | None:
    """A short hash of a tokenizer's vocabulary (every token text and its id), None without one."""
    if tokenizer is None:
        return None
    vocab = tokenizer.get_vocab()  # type: ignore[attr-defined]  # {token text: id}
    text = json.dumps(sorted(vocab.items(), key=lambda kv: (kv[1], kv[0])), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def target_name(target: TargetModel) -> str:
    """A readable name of a loaded target: the alias it was loaded by (e.g. smollm2-135m), else its
    hub id or directory, else "an unnamed <model type> model" (e.g. a random test model)."""
    from specdraft.models import ALIASES

    path = str(target.config.name_or_path or "")
    if not path:
        return f"an unnamed {target.config.model_type} model"
    for alias, source in ALIASES.items():
        try:
            if source().path == path:
                return alias
        except ValueError:  # the alias's package is not installed: it cannot be this target
            continue
    return path


def target_info(target: TargetModel, name: str | None = None, with_tokenizer: bool = True) -> dict[str, Any]:
    """The record of `target` that artifacts made for it store. name: how the recipe named the
    target (its config's name_or_path); default `target_name`. with_tokenizer=False leaves out the
    tokenizer hash (hashing a large vocabulary takes a moment)."""
    info: dict[str, Any] = {
        "name_or_path": name or target_name(target),
        "hidden_size": target.hidden_size,
        "vocab_size": target.vocab_size,
        "num_layers": target.num_layers,
    }
    digest = tokenizer_hash(target.tokenizer) if with_tokenizer else None
    if digest is not None:
        info["tokenizer_hash"] = digest
    return info


def describe(info: Mapping[str, Any], keys: Sequence[str] = FIELDS) -> str:
    """'hidden size 576, vocab 49152, 30 layers (smollm2-135m)' for the fields of `info` in keys."""
    parts = [_LABELS[k].format(info[k]) for k in keys if info.get(k) is not None]
    name = info.get("name_or_path")
    return ", ".join(parts) + (f" ({name})" if name else "")


def check_target(recorded: Mapping[str, Any], target: TargetModel, artifact: str,
                 keys: Sequence[str] = FIELDS, fix: str = "", made: str = "was trained for") -> None:
    """Raise ValueError naming both targets when `target` differs from the recorded one in any of
    `keys` that both sides know (a partial record checks what it has): "<artifact> <made> a target
    with ...; this target has ...". fix: the sentence that says what to use instead."""
    mine = target_info(target, with_tokenizer="tokenizer_hash" in keys and bool(recorded.get("tokenizer_hash")))
    differs = [k for k in keys if recorded.get(k) is not None and mine.get(k) is not None
               and recorded[k] != mine[k]]
    if not differs:
        return
    shown = [k for k in keys if recorded.get(k) is not None and mine.get(k) is not None]
    raise ValueError(
        f"{artifact} {made} a target with {describe(recorded, shown)}; this target has "
        f"{describe(mine, shown)}." + (f" {fix}" if fix else "")
    )


def read_record(config_file: str | Path) -> dict[str, Any] | None:
    """The target record saved in an artifact's config JSON, or None (an artifact saved before
    records existed)."""
    path = Path(config_file)
    if not path.is_file():
        return None
    record = json.loads(path.read_text()).get(RECORD_KEY)
    return dict(record) if isinstance(record, Mapping) else None


def from_shapes(weights_file: str | Path, hidden: Callable[[str], bool], vocab: Callable[[str], bool] | None = None,
                vocab_file: str | Path | None = None) -> dict[str, Any]:
    """A partial record of an artifact saved without one, read from tensor shapes (no weight is
    loaded): hidden size = the last dimension of the first tensor whose name `hidden` accepts;
    vocab size = the first dimension of the first tensor `vocab` accepts, else the vocabulary size
    of the pruned-vocabulary JSON `vocab_file` (if it exists)."""
    from safetensors import safe_open

    info: dict[str, Any] = {}
    with safe_open(str(weights_file), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            shape = f.get_slice(name).get_shape()
            if "hidden_size" not in info and hidden(name):
                info["hidden_size"] = int(shape[-1])
            if vocab is not None and "vocab_size" not in info and vocab(name):
                info["vocab_size"] = int(shape[0])
    if "vocab_size" not in info and vocab_file is not None:
        info.update(pruned_vocab_record(vocab_file))
    return info


def pruned_vocab_record(vocab_file: str | Path) -> dict[str, int]:
    """{"vocab_size": V} of the target a pruned vocabulary file was cut from; {} without the file."""
    return {"vocab_size": PrunedVocab.load(vocab_file).vocab_size} if Path(vocab_file).is_file() else {}


CACHE_RECORD = "target.json"  # a cache folder's record of the target whose outputs it holds


def guard_cache(cache_dir: str | Path | None, target: TargetModel, key: str = "cache_dir") -> None:
    """Make a cache folder of target outputs (hidden states, teacher logits) know its target: the
    first use writes `CACHE_RECORD` into it; a later use with another target is a ValueError (its
    shards would be read as this target's). None = no cache."""
    if cache_dir is None:
        return
    folder = Path(cache_dir).expanduser()
    record_file = folder / CACHE_RECORD
    mine = target_info(target)
    if record_file.is_file():
        check_target(json.loads(record_file.read_text()), target, f"the cache {key}={str(cache_dir)!r}",
                     FIELDS, fix=f"Pass another {key} for this target (or delete that folder).",
                     made="holds the outputs of")
        return
    folder.mkdir(parents=True, exist_ok=True)
    record_file.write_text(json.dumps(mine, indent=2) + "\n")
