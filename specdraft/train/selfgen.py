"""Self-distillation data: broad conversations the target writes and answers itself, offline.

A drafter imitates the target best on text the target itself writes, on requests as varied as its
users'. With no dataset at hand, the target makes both halves:

- user turns: Magpie-style (`specdraft.train.magpie`): the chat template up to the start of a user
  turn (with a varied system prompt) and the target samples the user's message, several turns
  deep, each next turn after its own answer; plus long-context tasks over the standard library's
  docs and source (`specdraft.train.corpus_tasks`) and, on request, the templated prompts of the
  first data (`specdraft.train.selfgen_prompts`);
- every first turn is deduplicated, exact and near (`specdraft.train.dedup`, word 3-grams), also
  against every prompt of the shipped suites (they stay held out), and user turns and answers are
  filtered (`specdraft.train.data_quality`: length, refusals, degenerate repetition; a looping
  answer keeps its text up to the loop, marked "truncated", and its chat ends there);
- answers: the target's greedy answer (which the conversation continues from) and, for a share of
  the turns, a sampled one (temperature 1: the distribution `sampling=sample` decodes);
- the split is by conversation (a hash of its id), never by answer: every turn and sample of one
  conversation is in the same split.

Output (`out_dir`): `shards/shard-NNNNN.jsonl.gz` (gzipped; one record per answer: {"id", "conversation",
"turn", "mode", "split", "kind", "source", "system", "messages", "prompt", "prompt_ids",
"completion", "completion_ids", "finished", "truncated", "writer_dtype"}) and `shard-NNNNN.json` (its counts), written
atomically per shard; `report.json` / `report.md`, the diversity report. A run stops at the shard
that reaches both `token_budget` answer tokens and `min_prompts` answered user turns (or at
`max_minutes`); rerun with `overwrite=true` to resume:
finished shards are kept and their prompts stay in the duplicate index, so a resumed run writes what
one uninterrupted run writes. Generation is batched (`specdraft.batch_decode`: left padded, on the
target's fast stack).

    specdraft-selfgen out_dir=data/smollm2-135m/selfgen_broad overwrite=true     (conf/selfgen.yaml)
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from specdraft.batch_decode import decode_batch
from specdraft.console import hydra_cli
from specdraft.files import replace_atomically
from specdraft.models import load_target, load_tokenizer
from specdraft.sampling import SamplingConfig
from specdraft.shipped import ARTIFACTS_DIR
from specdraft.suites import BUILTIN_SUITES, chat_prompt_ids, load_suite
from specdraft.target import TargetModel
from specdraft.train.corpus_tasks import corpus_tasks
from specdraft.train.data_quality import (
    answer_problem,
    diversity_report,
    loop_start,
    prompt_problem,
    report_markdown,
)
from specdraft.train.dedup import DuplicateIndex
from specdraft.train.magpie import SYSTEM_PROMPTS, system_messages, user_turn_prefix
from specdraft.outputs import prepare_output_dir
from specdraft.train.selfgen_prompts import KINDS, build_prompts, extra_prompts_for, split_of

SELFGEN_DIR = ARTIFACTS_DIR / "smollm2-135m" / "selfgen"  # the shipped answers of smollm2-135m
SELFGEN_FILE = "selfgen.jsonl"
SPLITS = ("train", "eval")
SOURCES = ("magpie", "corpus", "templated")


# ------------------------------------------------------------------------------------ generation
@dataclass(frozen=True)
class Decoding:
    """How one generation call decodes: temperature 0 is greedy."""

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0


Generate = Callable[[Sequence[Sequence[int]], Decoding, int], list[tuple[list[int], bool]]]


@dataclass(frozen=True)
class Writer:
    """What writes the text: the tokenizer, the end-of-turn ids, a batched `generate(prompts,
    decoding, seed)` -> per prompt (new ids up to and including the first stop id, whether it stopped)
    and the dtype the target wrote in (recorded with every answer: "bfloat16" writes faster where the
    CPU multiplies bfloat16 natively, and its greedy tokens differ from float32's at a few positions)."""

    tokenizer: Any
    stop_ids: Sequence[int]
    generate: Generate
    dtype: str = "float32"


def batched(target: TargetModel, batch_size: int, batch_tokens: int) -> Generate:
    """`generate` on the target: rows shortest first, in batches of at most `batch_size` rows and
    `batch_tokens` padded positions (prompt + new tokens), through `specdraft.batch_decode`."""
    def generate(prompts: Sequence[Sequence[int]], decoding: Decoding, seed: int) -> list[tuple[list[int], bool]]:
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[tuple[list[int], bool]] = [([], False)] * len(prompts)
        start = 0
        while start < len(order):
            end = start + 1
            while (end < len(order) and end - start < batch_size
                   and (end - start + 1) * (len(prompts[order[end]]) + decoding.max_new_tokens) <= batch_tokens):
                end += 1
            sampling = SamplingConfig(temperature=decoding.temperature, top_p=decoding.top_p, seed=seed + start)
            rows = decode_batch(target, [prompts[i] for i in order[start:end]], decoding.max_new_tokens, sampling,
                                target.eos_token_ids)
            for i, row in zip(order[start:end], rows, strict=True):
                out[i] = row
            start = end
        return out

    return generate


# ------------------------------------------------------------------------------------ conversations
@dataclass
class Conversation:
    """One chat being written: its first user turn is given (corpus, templated) or sampled (magpie)."""

    id: str
    source: str
    kind: str
    system: str | None
    depth: int  # user turns to write
    first_turn: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)  # system + turns so far


def stable_seed(*parts: object) -> int:
    """A seed from `parts` that is the same in every process (Python's own hash of a str is not)."""
    return int.from_bytes(hashlib.sha1(repr(parts).encode()).digest()[:4], "big")


@dataclass(frozen=True)
class SelfgenSettings:
    """What `run_selfgen` makes (the fields of conf/selfgen.yaml, less target, paths and threads)."""

    token_budget: int = 2_000_000
    min_prompts: int = 20_000  # the run also goes on until this many distinct prompts (user turns) are answered
    shard_size: int = 256
    sources: Mapping[str, float] = field(default_factory=lambda: {"magpie": 0.8, "corpus": 0.2})
    turn_weights: Sequence[float] = (0.55, 0.3, 0.15)  # P(1 user turn), P(2), P(3)
    sample_fraction: float = 0.25  # turns that also get a sampled answer
    user_temperature: float = 1.0
    user_top_p: float = 0.95
    answer_temperature: float = 1.0
    max_user_tokens: int = 128
    max_answer_tokens: int = 256
    min_loop_prefix: int = 32  # a looping answer is kept up to its loop if at least this many tokens precede it
    max_prompt_tokens: int = 3584
    near_duplicate: float = 0.7  # Jaccard of word 3-gram sets at which two first turns are duplicates
    eval_fraction: float = 0.05
    batch_size: int = 128
    batch_tokens: int = 65536
    seed: int = 0
    max_minutes: float | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.sources) - set(SOURCES))
        if unknown or not self.sources or min(self.sources.values()) < 0 or sum(self.sources.values()) <= 0:
            raise ValueError(f"sources must map some of {list(SOURCES)} to weights >= 0 with a positive sum, "
                             f"got {dict(self.sources)}.")
        if not self.turn_weights or min(self.turn_weights) < 0 or sum(self.turn_weights) <= 0:
            raise ValueError(f"turn_weights must be weights >= 0 of 1, 2, ... user turns, got {list(self.turn_weights)}.")
        if self.token_budget < 1 or self.shard_size < 1 or self.batch_size < 1:
            raise ValueError("token_budget, shard_size and batch_size must be >= 1.")
        if not 0.0 <= self.sample_fraction <= 1.0 or not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"sample_fraction must be in [0, 1] and eval_fraction in [0, 1), got "
                             f"{self.sample_fraction} and {self.eval_fraction}.")


def fixed_pools(sources: Mapping[str, float], seed: int) -> dict[str, list[tuple[str, str, str]]]:
    """(id, kind, first user turn) of the sources whose first turns are given, in a fixed order."""
    pools: dict[str, list[tuple[str, str, str]]] = {}
    if sources.get("corpus", 0) > 0:
        pools["corpus"] = [(t.key, t.kind, t.text) for t in corpus_tasks(seed)]
    if sources.get("templated", 0) > 0:
        prompts = extra_prompts_for(KINDS, seed) + build_prompts(10**6, seed)
        random.Random(seed).shuffle(prompts)
        pools["templated"] = [(f"templated/{p.id}", p.kind, p.text) for p in prompts if not p.history]
    return pools


def shard_conversations(index: int, s: SelfgenSettings, pools: Mapping[str, list[tuple[str, str, str]]]) -> list[Conversation]:
    """The conversations of shard `index`: each fixed source (corpus, templated) fills its share of
    the shard with the next slice of its pool (slice `index`, so no state carries over between
    shards and every item is used once); magpie fills the rest, also once a pool is used up."""
    rng = random.Random(f"{s.seed}/{index}")
    total = sum(s.sources.values())
    slots: list[tuple[str, str, str] | None] = []
    for source, pool in pools.items():
        per_shard = round(s.shard_size * s.sources[source] / total)
        slots += [(source, *item) for item in pool[index * per_shard : (index + 1) * per_shard]]
    slots = slots[: s.shard_size]
    slots += [None] * (s.shard_size - len(slots))
    rng.shuffle(slots)
    convs = []
    for i, slot in enumerate(slots):
        depth = rng.choices(range(1, len(s.turn_weights) + 1), weights=s.turn_weights)[0]
        system = rng.choice(SYSTEM_PROMPTS)
        if slot is None:
            convs.append(Conversation(f"magpie/{index:05d}/{i:03d}", "magpie", "magpie", system, depth))
        else:
            source, key, kind, text = slot  # type: ignore[misc]
            convs.append(Conversation(key, source, kind, system, depth, text))
    return convs


def suite_index(s: SelfgenSettings) -> DuplicateIndex:
    """A duplicate index that already holds every user turn of the shipped suites (kept out of the data)."""
    index = DuplicateIndex(threshold=s.near_duplicate)
    for name in BUILTIN_SUITES:
        for sp in load_suite(name):
            for j, text in enumerate(sp.user_texts()):
                index.add(f"suite:{name}/{sp.id}/{j}", text)
    return index


def screen_answer(tok: Any, ids: list[int], done: bool, min_loop_prefix: int
                  ) -> tuple[list[int], str, bool, bool, str | None]:
    """(ids, text, finished, truncated, problem) of one answer: the answer as it is, or, when it
    loops, its ids up to the loop (`loop_start`) if at least `min_loop_prefix` of them precede it and
    they pass the filters themselves; problem is the reason to drop it, or None."""
    text = tok.decode(ids, skip_special_tokens=True)
    problem = answer_problem(text, len(ids))
    if problem == "repetitive":
        cut = loop_start(ids)
        if cut is not None and cut >= min_loop_prefix:
            head = tok.decode(ids[:cut], skip_special_tokens=True)
            if answer_problem(head, cut) is None:
                return ids[:cut], head, False, True, None
    return ids, text, done, False, problem


@dataclass
class ShardResult:
    records: list[dict[str, Any]]
    rejected: Counter[str]


def write_shard(writer: Writer, convs: list[Conversation], index: DuplicateIndex, s: SelfgenSettings,
                shard: int) -> ShardResult:
    """Write every conversation of one shard turn by turn, batched across conversations."""
    tok, generate = writer.tokenizer, writer.generate
    rng = random.Random(f"{s.seed}/{shard}/answers")
    rejected: Counter[str] = Counter()
    records: list[dict[str, Any]] = []
    for c in convs:
        c.messages = system_messages(c.system)
    live = list(convs)
    for turn in range(1, max(c.depth for c in convs) + 1):
        live = [c for c in live if c.depth >= turn]
        # 1. the user's turn: given, or sampled by the target from the template up to a user turn
        sampled = [c for c in live if turn > 1 or c.first_turn is None]
        users = generate([user_turn_prefix(tok, c.messages) for c in sampled],
                         Decoding(s.max_user_tokens, s.user_temperature, s.user_top_p),
                         stable_seed(s.seed, shard, turn, "user"))
        texts = {id(c): (tok.decode(ids, skip_special_tokens=True).strip(), len(ids), done)
                 for c, (ids, done) in zip(sampled, users, strict=True)}
        kept, prompt_ids = [], []
        for c in live:
            text, n, done = texts.get(id(c), (c.first_turn or "", 1, True))
            problem = prompt_problem(text, n, done) if id(c) in texts else None
            if problem is None and turn == 1:
                dup = index.add_if_new(c.id, text)
                problem = None if dup is None else ("suite_overlap" if dup[1].startswith("suite:") else f"duplicate_{dup[0]}")
            if problem is None:
                c.messages.append({"role": "user", "content": text})
                ids = chat_prompt_ids(tok, c.messages)
                if len(ids) > s.max_prompt_tokens:
                    problem = "too_long"
            if problem is not None:
                rejected[f"user_turn_{turn}:{problem}"] += 1
                continue
            kept.append(c)
            prompt_ids.append(ids)
        live, prompts = kept, prompt_ids
        if not live:
            break
        # 2. the answers: greedy (the conversation goes on from it) and, for some turns, a sample
        greedy = generate(prompts, Decoding(s.max_answer_tokens), 0)
        extra = [i for i in range(len(live)) if rng.random() < s.sample_fraction]
        sampled_answers = generate([prompts[i] for i in extra], Decoding(s.max_answer_tokens, s.answer_temperature),
                                   stable_seed(s.seed, shard, turn, "answer"))
        answers = [(i, "greedy", a) for i, a in enumerate(greedy)]
        answers += [(i, "sample", a) for i, a in zip(extra, sampled_answers, strict=True)]
        ended: set[int] = set()
        asked = [list(c.messages) for c in live]  # the conversation each answer replies to
        for i, mode, (ids, done) in answers:
            c = live[i]
            ids, text, done, truncated, problem = screen_answer(tok, ids, done, s.min_loop_prefix)
            if problem is not None:
                rejected[f"answer:{problem}"] += 1
                if mode == "greedy":
                    ended.add(i)
                continue
            records.append({
                "id": f"{c.id}#t{turn}" + ("" if mode == "greedy" else "~s"), "conversation": c.id, "turn": turn,
                "mode": mode, "split": split_of(c.id, s.eval_fraction), "kind": c.kind, "source": c.source,
                "system": c.system, "messages": asked[i], "prompt": asked[i][-1]["content"],
                "prompt_ids": prompts[i], "completion": text, "completion_ids": ids, "finished": done,
                "truncated": truncated, "writer_dtype": writer.dtype,
            })
            if mode == "greedy" and truncated:
                ended.add(i)  # a chat does not go on from a cut answer
            elif mode == "greedy":
                c.messages.append({"role": "assistant", "content": text.strip()})
        live = [c for i, c in enumerate(live) if i not in ended]
    return ShardResult(records, rejected)


# ------------------------------------------------------------------------------------ the run
SHARD_SUFFIX = ".jsonl.gz"  # gzip: a run's shards are small enough to keep in git and resume anywhere


def shard_paths(out: Path) -> list[Path]:
    """The finished shards of a run (gzipped or plain jsonl), in order."""
    return sorted([*(out / "shards").glob("shard-*.jsonl"), *(out / "shards").glob("shard-*.jsonl.gz")],
                  key=lambda p: p.name)


def shard_counts_path(shard: Path) -> Path:
    """`shard-NNNNN.json`, the counts written beside a shard."""
    return shard.with_name(shard.name.split(".")[0] + ".json")


def read_lines(path: Path) -> list[str]:
    """The lines of a text file, gunzipped if it ends in .gz."""
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode().splitlines()


def _atomic_write(path: Path, text: str) -> None:
    """`path` replaced by `text`, gzipped if it ends in .gz (mtime=0: the same records give the same
    bytes, so a resumed run's shards are byte-identical)."""
    data = text.encode()
    data = gzip.compress(data, mtime=0) if path.suffix == ".gz" else data
    replace_atomically(path, lambda tmp: tmp.write_bytes(data))


def run_selfgen(target: str | TargetModel = "smollm2-135m", *, out_dir: str | Path,
                settings: SelfgenSettings = SelfgenSettings(), overwrite: bool = False,
                progress: bool = True, writer: Writer | None = None) -> Path:
    """Generate (or resume) the conversations; returns `out_dir`. See the module docstring.
    writer: what writes the text (default: the target, batched; tests pass a scripted one)."""
    s = settings
    out = prepare_output_dir(out_dir, overwrite, "out_dir")
    (out / "shards").mkdir(exist_ok=True)
    index = suite_index(s)
    records: list[dict[str, Any]] = []
    rejected: Counter[str] = Counter()
    done = shard_paths(out)
    for path in done:  # resume: the finished shards' first turns go back into the index, in order
        recs = _read_records(path)
        for r in recs:
            if r["turn"] == 1 and r["mode"] == "greedy":
                index.add(r["conversation"], r["prompt"])
        records += recs
        rejected.update(json.loads(shard_counts_path(path).read_text())["rejected"])
    tokens = sum(len(r["completion_ids"]) for r in records)
    prompts = {(r["conversation"], r["turn"]) for r in records}
    pools = fixed_pools(s.sources, s.seed)
    if writer is None:
        target = load_target(target, device="cpu") if isinstance(target, str) else target
        dtype = str(next(target.model.parameters()).dtype).removeprefix("torch.")
        writer = Writer(target.tokenizer, target.eos_token_ids, batched(target, s.batch_size, s.batch_tokens), dtype)
    from tqdm import tqdm

    bar = tqdm(total=s.token_budget, initial=min(tokens, s.token_budget), unit="tok", desc="selfgen",
               disable=not progress, file=sys.stderr, mininterval=10)
    t0 = time.time()
    shard = len(done)
    while ((tokens < s.token_budget or len(prompts) < s.min_prompts)
           and (s.max_minutes is None or time.time() - t0 < 60 * s.max_minutes)):
        t_shard = time.time()
        result = write_shard(writer, shard_conversations(shard, s, pools), index, s, shard)
        n = sum(len(r["completion_ids"]) for r in result.records)
        path = out / "shards" / f"shard-{shard:05d}{SHARD_SUFFIX}"
        _atomic_write(shard_counts_path(path), json.dumps({
            "shard": shard, "answers": len(result.records), "answer_tokens": n,
            "seconds": round(time.time() - t_shard, 1), "rejected": dict(result.rejected)}))
        _atomic_write(path, "".join(json.dumps(r) + "\n" for r in result.records))  # last: marks the shard done
        records += result.records
        prompts |= {(r["conversation"], r["turn"]) for r in result.records}
        rejected.update(result.rejected)
        tokens += n
        bar.update(max(0, min(n, s.token_budget - bar.n)))
        shard += 1
        report = diversity_report(records, rejected)
        _atomic_write(out / "report.json", json.dumps(report, indent=1))
        _atomic_write(out / "report.md", report_markdown(report) + "\n")
    bar.close()
    return out


# ------------------------------------------------------------------------------------ loading
def _read_records(p: Path) -> list[dict]:
    files = shard_paths(p) if p.is_dir() else [p]
    return [json.loads(line) for f in files for line in read_lines(f) if line.strip()]


def selfgen_sources(path: str | Path | Sequence[str | Path]) -> list[str | Path]:
    """A recipe's self-distillation data setting as a list: one selfgen.jsonl / out_dir, or several."""
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    if not paths:
        raise ValueError("the list of self-distillation data sources is empty; name at least one "
                         "selfgen.jsonl or specdraft-selfgen out_dir.")
    return paths


def load_selfgen_records(split: str = "train", path: str | Path | Sequence[str | Path] | None = None) -> list[dict]:
    """The records of one split ("train" or "eval") of a selfgen.jsonl or of a run's `out_dir`, or
    of several of them in the order given (e.g. the broad data first, then the shipped templated file)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
    if path is not None and not isinstance(path, (str, Path)):  # a list of sources (a Hydra ListConfig too)
        return [r for one in selfgen_sources(path) for r in load_selfgen_records(split, one)]
    p = Path(path) if path is not None else SELFGEN_DIR / SELFGEN_FILE
    if not (p.is_file() or (p.is_dir() and shard_paths(p))):
        raise ValueError(
            f"self-distillation data {str(p)!r} does not exist; create it with "
            "`specdraft-selfgen` (or pass a selfgen.jsonl or the out_dir of a specdraft-selfgen run)."
        )
    return [r for r in _read_records(p) if r["split"] == split]


def load_selfgen_texts(split: str = "train", path: str | Path | Sequence[str | Path] | None = None) -> list[str]:
    """Prompt + answer texts of one split (chat-formatted as the target saw them), for recipes
    that tokenize text themselves."""
    tok = load_tokenizer("smollm2-135m")
    return [tok.decode(r["prompt_ids"] + r["completion_ids"]) for r in load_selfgen_records(split, path)]


def load_selfgen_sequences(split: str = "train", path: str | Path | Sequence[str | Path] | None = None) -> list[tuple[Tensor, int]]:
    """(token ids [T] int64, prompt length) per record: the exact ids the target generated."""
    return [
        (torch.tensor(r["prompt_ids"] + r["completion_ids"], dtype=torch.long), len(r["prompt_ids"]))
        for r in load_selfgen_records(split, path)
    ]


def settings_from(cfg: DictConfig) -> SelfgenSettings:
    """The SelfgenSettings of a composed conf/selfgen.yaml."""
    d = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(d, dict)
    names = set(SelfgenSettings.__dataclass_fields__)
    unknown = set(d) - names - {"target", "out_dir", "overwrite", "threads", "progress"}
    if unknown:
        raise ValueError(f"unknown selfgen setting(s) {sorted(unknown)}; see conf/selfgen.yaml.")
    return SelfgenSettings(**{k: v for k, v in d.items() if k in names})


@hydra_cli("selfgen")
def main(cfg: DictConfig) -> None:
    """`specdraft-selfgen` / `python -m specdraft.train.selfgen` (Hydra, conf/selfgen.yaml):
    generate the self-distillation conversations (resumable with overwrite=true)."""
    torch.set_num_threads(int(cfg.threads))
    settings = settings_from(cfg)
    prepare_output_dir(cfg.out_dir, bool(cfg.overwrite), "out_dir")  # before the target loads
    out = run_selfgen(instantiate(cfg.target), out_dir=cfg.out_dir, settings=settings,
                      overwrite=bool(cfg.overwrite), progress=bool(cfg.progress))
    print(f"[selfgen] wrote {out}", flush=True)
    print((out / "report.md").read_text() if (out / "report.md").is_file() else "", flush=True)


if __name__ == "__main__":
    main()
