"""What `specdraft-bench` checks before it loads a model: its settings, its suite, every prompt's
length against the target's context and its output folder, every problem in one ValueError.

A bench runs for minutes after a model load of seconds: a bad setting or a too-long prompt in
position 2 must not cost the load and the finished prompt 1, and a user should fix all problems
in one go. Each check returns its problems as sentences (empty = fine); `raise_problems` joins
them. Prompt lengths need the tokenizer and the context length: `preview_target` reads both
without the weights for the two loaders the shipped target configs use; the bench checks the
lengths again on the loaded target, before any generation, so other loaders are covered too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from specdraft import llamacpp, models
from specdraft.build import drafter_label
from specdraft.draft_length import check_max_draft_tokens, check_num_draft_tokens
from specdraft.prefix_cache import check_prefix_cache_tokens
from specdraft.suites import SuitePrompt, categories, load_suite

NO_TOKENIZER = ("the target has no tokenizer, and the bench tokenises its suite; use a target config "
                "with one (e.g. target.tokenizer=smollm2-135m for target=tiny_random).")


def raise_problems(problems: Sequence[str]) -> None:
    """One ValueError listing every problem (one per line), or nothing when there is none."""
    if len(problems) == 1:
        raise ValueError(f"specdraft-bench ran nothing: {problems[0]}")
    if problems:
        raise ValueError(f"specdraft-bench ran nothing; {len(problems)} problems:\n"
                         + "\n".join(f"- {p}" for p in problems))


def values(value: Any) -> list[Any]:
    """A config list as a list; a single value (`bench.categories=qa`) is a list of one, null none."""
    if isinstance(value, (list, tuple, ListConfig)):
        return list(value)
    return [] if value is None else [value]


def names(value: Any) -> list[str]:
    """`values` as strings (categories, drafters, peers)."""
    return [str(v) for v in values(value)]


def is_int_at_least(value: Any, minimum: int) -> bool:
    """An integer (not a bool) >= minimum."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def int_problem(key: str, value: Any, minimum: int, meaning: str) -> str | None:
    """The sentence for a setting that must be an integer >= minimum, or None when it is one."""
    if is_int_at_least(value, minimum):
        return None
    return f"{key}={value!r} must be an integer >= {minimum} ({meaning})."


def setting_problems(
    cfg: DictConfig, known_peers: Sequence[str], drafter_config: Callable[[str], Any],
    llamacpp_peers: Sequence[str] = (),
) -> list[str]:
    """The bench's own numbers and names: repetitions, warmup, max_new_tokens, limit, threads,
    peers and drafters (drafter_config raises ValueError for an unknown drafter name);
    llamacpp_peers: the peers that run llama.cpp (`llamacpp_problems`)."""
    bench = cfg.bench
    checks = [
        ("bench.repetitions", bench.repetitions, 1, "the timed runs per prompt and method whose median is reported"),
        ("bench.warmup", bench.warmup, 0, "untimed runs first; 0 = none"),
        ("max_new_tokens", cfg.max_new_tokens, 1, "tokens generated per prompt"),
    ]
    if bench.limit is not None:
        checks.append(("bench.limit", bench.limit, 1, "prompts per category; null = all of them"))
    if bench.threads is not None:
        checks.append(("bench.threads", bench.threads, 1, "torch threads; null = torch's default"))
    checks.append(("bench.bandwidth_bytes", bench.bandwidth_bytes, 0,
                   "bytes of the streaming read that measures the read bandwidth; 0 = skip the roofline"))
    if "llamacpp_lookup" in names(bench.peers):
        checks.append(("bench.llamacpp_lookup_draft_max", bench.llamacpp_lookup_draft_max, 1,
                       "tokens llama-lookup drafts per round"))
    if "hf_prompt_lookup" in names(bench.peers):
        checks += [("bench.hf_prompt_lookup_num_tokens", k, 1, "draft tokens of HF prompt lookup")
                   for k in values(bench.hf_prompt_lookup_num_tokens)]
    problems = [p for p in (int_problem(*c) for c in checks) if p]
    unknown_peers = [p for p in names(bench.peers) if p not in known_peers]
    if unknown_peers:
        problems.append(f"unknown peer(s) {', '.join(map(repr, unknown_peers))} in bench.peers; "
                        f"choose from {', '.join(known_peers)}.")
    problems += llamacpp_problems(cfg, [p for p in names(bench.peers) if p in llamacpp_peers])
    labels = []
    for name in names(bench.drafters):
        try:
            drafter_config(name)
        except ValueError as err:
            problems.append(f"bench.drafters: {err}")
        else:
            labels.append(drafter_label(name))
    if len(set(labels)) < len(labels):
        problems.append(f"bench.drafters names a drafter twice ({', '.join(names(bench.drafters))}); a config file "
                        "goes by its file name in the results, so give every entry its own name.")
    for check, value in ((check_num_draft_tokens, cfg.num_draft_tokens), (check_max_draft_tokens, cfg.max_draft_tokens),
                         (check_prefix_cache_tokens, cfg.get("prefix_cache_tokens", 0))):
        try:
            check(value)
        except ValueError as err:
            problems.append(str(err))
    return problems


LLAMACPP_TARGET = "smollm2-135m"  # the target whose GGUF `make llamacpp` converts


def llamacpp_problems(cfg: DictConfig, requested: Sequence[str]) -> list[str]:
    """Requested llama.cpp peers need the tools and models of `make llamacpp`, which are the
    default target's weights: another target would compare different models."""
    if not requested:
        return []
    problems = []
    reason = llamacpp.available()
    if reason is not None:
        problems.append(f"bench.peers {', '.join(requested)}: {reason}.")
    missing = OmegaConf.is_missing(cfg.target, "name_or_path")
    target = "" if missing else str(cfg.target.get("name_or_path") or "")
    if target.lower() != LLAMACPP_TARGET:
        problems.append(f"bench.peers {', '.join(requested)} run the GGUF of the default target "
                        f"({LLAMACPP_TARGET}) that `make llamacpp` converts, but the target is "
                        f"{target or cfg.target.get('_target_')!r}; use target=smollm2_135m with them.")
    return problems


def suite_problems(cfg: DictConfig) -> tuple[list[SuitePrompt], list[str]]:
    """The selected prompts (bench.categories, then at most bench.limit per category) and the
    problems of the suite and the selection; no prompts when the suite itself is broken."""
    suite = cfg.suite
    if OmegaConf.is_missing(suite, "path"):
        return [], ["suite.path is not set; pass suite.path=/your/prompts.jsonl (one JSON prompt per line)."]
    source = suite.path or suite.name
    if not source:
        return [], ["no suite given; pass suite=builtin, suite=quick or suite=file suite.path=FILE."]
    try:
        prompts = load_suite(source)
    except ValueError as err:
        return [], [str(err)]
    wanted = names(cfg.bench.categories)
    known = categories(prompts)
    unknown = [c for c in wanted if c not in known]
    if unknown:
        noun = "category" if len(unknown) == 1 else "categories"
        return [], [f"unknown {noun} {', '.join(map(repr, unknown))} in bench.categories; "
                    + f"suite {source!r} has {', '.join(known)}."]
    limit = cfg.bench.limit if is_int_at_least(cfg.bench.limit, 1) else None
    return select_prompts(prompts, wanted, limit), []


def select_prompts(prompts: Sequence[SuitePrompt], wanted: Sequence[str], limit: int | None) -> list[SuitePrompt]:
    """The prompts of the wanted categories (all when none named), at most `limit` per category,
    in suite order."""
    per_category: dict[str, int] = defaultdict(int)
    kept = []
    for p in prompts:
        if wanted and p.category not in wanted:
            continue
        if limit is None or per_category[p.category] < limit:
            kept.append(p)
            per_category[p.category] += 1
    return kept


def context_problems(
    prompts: Sequence[SuitePrompt], tokenizer: Any, max_context: int, max_new_tokens: int | None
) -> list[str]:
    """Every prompt that cannot run: it does not tokenise, or its tokens plus its new tokens (the
    prompt's own max_new_tokens, else `max_new_tokens`; None = not known) exceed the context. A
    multi-turn prompt is measured at its last turn: all its user turns with empty answers, plus a
    full budget of new tokens for every turn (the answers are not known before they are generated)."""
    if tokenizer is None:
        return [NO_TOKENIZER]
    problems = []
    for p in prompts:
        try:
            length = len(p.token_ids(tokenizer, [""] * (p.num_turns - 1)))
        except ValueError as err:
            problems.append(str(err))
            continue
        new = p.max_new_tokens or max_new_tokens or 0
        turns = p.num_turns
        needed = length + turns * new
        if length == 0:
            problems.append(f"prompt {p.id!r} tokenises to no tokens; give it some text.")
        elif needed > max_context:
            tokens = (f"{length} prompt tokens + {new} new tokens" if turns == 1 else
                      f"{length} prompt tokens over its {turns} turns + {turns} x {new} new tokens")
            problems.append(
                f"prompt {p.id!r} ({p.category}): {tokens} = {needed}, beyond the target's context of "
                f"{max_context}; shorten the prompt or lower max_new_tokens (or the prompt's own "
                "max_new_tokens), or leave it out of the suite."
            )
    return problems


def output_problems(out_dir: Path, outputs: Sequence[str], overwrite: bool) -> list[str]:
    """A run folder that already holds a bench's results (e.g. a fixed hydra.run.dir) is not
    overwritten unless bench.overwrite=true."""
    found = [name for name in outputs if (out_dir / name).exists()]
    if not found or overwrite:
        return []
    return [f"{out_dir} already holds {', '.join(found)} from an earlier run; pass bench.overwrite=true "
            + "to replace them, or choose another hydra.run.dir."]


@dataclass(frozen=True)
class TargetPreview:
    """What the prompt-length check needs of a target, read without loading its weights."""

    tokenizer: Any  # None when the target config has none
    max_context: int


def preview_target(cfg: DictConfig) -> tuple[TargetPreview | None, list[str]]:
    """Tokenizer and context length of a target config without its weights, for the loaders the
    target configs use: `load_target` (name_or_path: tokenizer and model config of that model) and
    `tiny_random_target` (tokenizer, max_position_embeddings). None when the config does not say
    (the bench then checks the loaded target); problems when what it names cannot be loaded."""
    if OmegaConf.is_missing(cfg, "name_or_path"):
        return None, ["target.name_or_path is not set; pass target.name_or_path=<hub id, directory or .gguf>."]
    try:
        if "max_position_embeddings" in cfg:
            max_context = int(cfg.max_position_embeddings)
        elif cfg.get("name_or_path"):
            max_context = model_context(str(cfg.name_or_path))
        else:
            return None, []
        if "tokenizer" in cfg:
            tokenizer = models.load_tokenizer(str(cfg.tokenizer)) if cfg.tokenizer else None
        elif cfg.get("name_or_path") and cfg.get("with_tokenizer", True):
            tokenizer = models.load_tokenizer(str(cfg.name_or_path))
        else:
            return None, []
    except (ValueError, OSError) as err:
        return None, [f"cannot read the target's tokenizer or config: {err}"]
    return TargetPreview(tokenizer, max_context), []


def model_context(name_or_path: str) -> int:
    """The longest sequence the model supports, from its config alone (what TargetModel.max_context
    reads from the loaded model)."""
    config = models.load_model_config(name_or_path)
    return int(getattr(config, "max_position_embeddings", 1 << 30))
