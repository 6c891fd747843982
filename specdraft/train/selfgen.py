"""Self-distillation data: the target's own greedy answers to chat-like prompts built offline.

A draft imitates the target best on text the target itself would write: its own generations are far
more predictable than human text (stdlib source), and they look like what the drafter meets at
inference (chat answers). Prompts are built from offline text only (the `pydoc_data` reference
topics and standard-library docstrings): "Explain ...", "Summarise ...", "Write a function that ...".

Output, reusable by every recipe (draft model, Medusa heads, early-exit adapter):
  <out_dir>/selfgen.jsonl   one line per prompt: {"id", "split", "kind", "prompt", "prompt_ids",
                            "completion", "completion_ids"} (chat-templated prompt ids)
  <cache_dir>/topk-*.pt     optional: the target's top-k logits at every generated position,
                            captured during generation for free (a teacher cache for distillation)

Generation is batched (Hugging Face `generate`, left padding; batch 16-32 is far faster per token
than batch 1 on CPU) and resumable: prompts already in the JSONL are skipped.

    python -m specdraft.train.selfgen --num-prompts 1200 --batch-size 24 --max-new-tokens 160
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import random
import sysconfig
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from transformers import LogitsProcessor, LogitsProcessorList

ARTIFACT_DIR = Path(__file__).resolve().parent.parent / "artifacts" / "smollm2-135m" / "selfgen"
SELFGEN_FILE = "selfgen.jsonl"
SPLITS = ("train", "eval")


@dataclass(frozen=True)
class Prompt:
    """One chat-like request built from offline text."""

    id: str
    kind: str  # explain | summarise | function | module | qa, and selfgen_prompts' kinds
    text: str  # the (last) user message
    history: tuple[tuple[str, str], ...] = ()  # earlier (role, content) turns, oldest first

    def chat(self) -> list[dict[str, str]]:
        """The conversation as chat-template messages, ending with this prompt's user turn."""
        return [{"role": r, "content": c} for r, c in self.history] + [{"role": "user", "content": self.text}]

    @property
    def split(self) -> str:
        """Stable train/eval split by hash of the id (eval ~ 8%)."""
        h = int.from_bytes(hashlib.sha1(self.id.encode()).digest()[:4], "big") / 2**32
        return "eval" if h < 0.08 else "train"


# ------------------------------------------------------------------------------------ prompts
def _first_sentence(doc: str, max_chars: int = 160) -> str:
    line = " ".join(doc.strip().split("\n\n")[0].split())
    sent = line.split(". ")[0].rstrip(".")
    return sent[:max_chars]


def stdlib_files() -> list[Path]:
    """The standard library's top-level modules (*.py), sorted by name."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def parsed_modules(paths: Iterable[Path]) -> Iterator[tuple[Path, str, ast.Module]]:
    """(path, source, syntax tree) of every file that reads and parses (others are skipped)."""
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
            yield path, text, ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue


def _stdlib_docstrings(max_files: int = 400) -> Iterator[tuple[str, str, str]]:
    """(module, function name, first docstring sentence) for public stdlib functions."""
    files = [p for p in stdlib_files() if not p.name.startswith("_")][:max_files]
    for path, _, tree in parsed_modules(files):
        mod_doc = ast.get_docstring(tree)
        if mod_doc:
            yield path.stem, "", _first_sentence(mod_doc)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 20:
                    yield path.stem, node.name, _first_sentence(doc)


def build_prompts(num_prompts: int, seed: int = 0) -> list[Prompt]:
    """A shuffled mix of chat/QA requests built from pydoc topics and stdlib docstrings."""
    from pydoc_data.topics import topics

    prompts: list[Prompt] = []
    for key in sorted(topics):
        title = key.replace("-", " ")
        body = " ".join(topics[key].split())
        prompts.append(Prompt(f"explain/{key}", "explain", f"Explain {title} in Python."))
        prompts.append(Prompt(f"qa/{key}", "qa", f"What is {title} in Python, and when would I use it?"))
        prompts.append(
            Prompt(f"summarise/{key}", "summarise", f"Summarise this in two sentences:\n\n{body[:500]}")
        )
    for mod, name, sentence in _stdlib_docstrings():
        if not name:
            prompts.append(Prompt(f"module/{mod}", "module", f"What is the Python module {mod} for?"))
            continue
        lowered = sentence[:1].lower() + sentence[1:]
        prompts.append(
            Prompt(f"function/{mod}.{name}", "function", f"Write a Python function that does this: {lowered}.")
        )
    # shuffle within each kind, then interleave kinds round-robin so that any prefix is balanced
    by_kind: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_kind.setdefault(p.kind, []).append(p)
    rng = random.Random(seed)
    queues = [rng.sample(v, len(v)) for _, v in sorted(by_kind.items())]
    mixed = [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)]
    return mixed[:num_prompts]


# ------------------------------------------------------------------------------------ generation
class TopKRecorder(LogitsProcessor):
    """Records the top-k raw logits of every generation step (scores are returned unchanged)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.values: list[Tensor] = []  # per step [B, k] float16
        self.indices: list[Tensor] = []  # per step [B, k] int32

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        top = torch.topk(scores.float(), self.k, dim=-1)
        self.values.append(top.values.half())
        self.indices.append(top.indices.int())
        return scores


def generate_batch(
    model: torch.nn.Module,
    tokenizer: object,
    prompts: list[Prompt],
    max_new_tokens: int,
    top_k: int,
    eos_token_ids: list[int],
) -> list[dict]:
    """Greedy answers for one batch, with the teacher's top-k logits per generated position."""
    enc = [
        tokenizer.apply_chat_template(p.chat(), add_generation_prompt=True, tokenize=True)  # type: ignore[attr-defined]
        for p in prompts
    ]
    enc = [e["input_ids"] if isinstance(e, dict) or hasattr(e, "keys") else e for e in enc]
    pad = int(tokenizer.pad_token_id)  # type: ignore[attr-defined]
    width = max(len(e) for e in enc)
    ids = torch.full((len(enc), width), pad, dtype=torch.long)  # [B, T] left padded
    mask = torch.zeros_like(ids)
    for i, e in enumerate(enc):
        ids[i, width - len(e) :] = torch.tensor(e)
        mask[i, width - len(e) :] = 1
    recorder = TopKRecorder(top_k)
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            logits_processor=LogitsProcessorList([recorder]),
        )
    gen = out[:, width:]  # [B, N]
    values = torch.stack(recorder.values, dim=1)  # [B, N, k]
    indices = torch.stack(recorder.indices, dim=1)  # [B, N, k]
    eos = set(eos_token_ids) | {pad}
    rows = []
    for i, p in enumerate(prompts):
        toks = gen[i].tolist()
        n = len(toks)
        for j, t in enumerate(toks):
            if t in eos or t == pad:
                n = j + 1
                break
        rows.append(
            {
                "id": p.id,
                "split": p.split,
                "kind": p.kind,
                "prompt": p.text,
                "prompt_ids": list(enc[i]),
                "completion": tokenizer.decode(toks[:n], skip_special_tokens=True),  # type: ignore[attr-defined]
                "completion_ids": toks[:n],
                "topk_values": values[i, :n],
                "topk_indices": indices[i, :n],
            }
        )
    return rows


def run_selfgen(
    target_name: str = "smollm2-135m",
    out_dir: str | Path = ARTIFACT_DIR,
    cache_dir: str | Path | None = None,
    num_prompts: int = 1200,
    batch_size: int = 24,
    max_new_tokens: int = 160,
    top_k: int = 32,
    seed: int = 0,
    max_seconds: float | None = None,
    kinds: tuple[str, ...] = (),
) -> Path:
    """Generate (or resume) the self-distillation JSONL; top-k teacher shards go to cache_dir.

    `kinds` empty: the first `num_prompts` of `build_prompts`. Otherwise every templated prompt of
    those kinds (`selfgen_prompts`; "followup" = a next turn after each generated "advice" or "revise"
    answer, so generate "advice" first), shortest first, so that a batch wastes little padding."""
    from specdraft.models import load_target

    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError("batch_size and max_new_tokens must be >= 1.")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / SELFGEN_FILE
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    done = {r["id"] for r in records}
    if kinds:
        from specdraft.train.selfgen_prompts import extra_prompts_for, followup_prompts

        pool = extra_prompts_for(kinds, seed)
        if "followup" in kinds:
            pool += followup_prompts(records, seed)
        todo = sorted((p for p in pool if p.id not in done), key=lambda p: len(p.text) + sum(len(c) for _, c in p.history))
    else:
        todo = [p for p in build_prompts(num_prompts, seed) if p.id not in done]
    target = load_target(target_name, device="cpu")
    print(f"[selfgen] {len(todo)} prompts to generate ({len(done)} already done)", flush=True)
    t0 = time.time()
    tokens = 0
    for b in range(0, len(todo), batch_size):
        batch = sorted(todo[b : b + batch_size], key=lambda p: len(p.text))
        rows = generate_batch(
            target.model, target.tokenizer, batch, max_new_tokens, top_k, target.eos_token_ids
        )
        if cache_dir is not None:
            Path(cache_dir).mkdir(parents=True, exist_ok=True)
            shard = {r["id"]: (r["topk_values"], r["topk_indices"]) for r in rows}
            torch.save(shard, Path(cache_dir) / f"topk-{len(done) + b:06d}.pt")
        with path.open("a") as f:
            for r in rows:
                f.write(json.dumps({k: v for k, v in r.items() if not k.startswith("topk")}) + "\n")
        tokens += sum(len(r["completion_ids"]) for r in rows)
        rate = tokens / (time.time() - t0)
        print(f"[selfgen] {len(done) + b + len(batch)}/{len(done) + len(todo)} prompts, {tokens} tokens, {rate:.0f} tok/s", flush=True)
        if max_seconds is not None and time.time() - t0 > max_seconds:
            break
    return path


# ------------------------------------------------------------------------------------ loading
def load_selfgen_records(split: str = "train", path: str | Path | None = None) -> list[dict]:
    """The JSONL records of one split ("train" or "eval")."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
    p = Path(path) if path is not None else ARTIFACT_DIR / SELFGEN_FILE
    if not p.is_file():
        raise ValueError(
            f"self-distillation data {str(p)!r} does not exist; create it with "
            "`python -m specdraft.train.selfgen`."
        )
    recs = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return [r for r in recs if r["split"] == split]


def load_selfgen_texts(split: str = "train", path: str | Path | None = None) -> list[str]:
    """Prompt + answer texts of one split (chat-formatted as the target saw them), for recipes
    that tokenize text themselves."""
    from specdraft.models import load_tokenizer

    tok = load_tokenizer("smollm2-135m")
    return [tok.decode(r["prompt_ids"] + r["completion_ids"]) for r in load_selfgen_records(split, path)]


def load_selfgen_sequences(split: str = "train", path: str | Path | None = None) -> list[tuple[Tensor, int]]:
    """(token ids [T] int64, prompt length) per record: the exact ids the target generated."""
    return [
        (torch.tensor(r["prompt_ids"] + r["completion_ids"], dtype=torch.long), len(r["prompt_ids"]))
        for r in load_selfgen_records(split, path)
    ]


def main() -> None:
    """`python -m specdraft.train.selfgen`: generate the self-distillation data (resumable)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--out-dir", default=str(ARTIFACT_DIR))
    ap.add_argument("--cache-dir", default=None, help="where to save the teacher's top-k logits")
    ap.add_argument("--num-prompts", type=int, default=1200)
    ap.add_argument("--batch-size", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--top-k", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-seconds", type=float, default=None)
    ap.add_argument("--kinds", default="", help="comma-separated templated kinds (selfgen_prompts), e.g. "
                    "general_qa,advice,email,math,code_edit,code_write,docread,revise,followup")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    run_selfgen(
        args.target, args.out_dir, args.cache_dir, args.num_prompts, args.batch_size,
        args.max_new_tokens, args.top_k, args.seed, args.max_seconds,
        tuple(k for k in args.kinds.split(",") if k),
    )


if __name__ == "__main__":
    main()
