"""How fast and how faithfully the target writes self-distillation data in bfloat16 instead of float32.

    .venv/bin/python benchmarks/writer_dtype.py [--data data/smollm2-135m/selfgen_broad] [--repetitions 2]

`specdraft-selfgen target.dtype=bfloat16` writes with a bfloat16 copy of the target. This measures, on the
held-out prompts of a selfgen run (the data's own mix of short chats and long-context tasks):

- speed: `decode_batch` (selfgen's generator) for a batch of short prompts and a batch of long ones, float32 and
  bfloat16 interleaved (the order alternates every repetition; this machine is shared and noisy), greedy, exactly
  --new-tokens each (no stop token); new tokens per second, median over repetitions, and their ratio;
- fidelity: teacher-forced on the held-out answers the float32 target wrote, how often the bfloat16 model's greedy
  choice is the float32 model's (what the data's tokens would differ by), and how many greedy tokens the two
  write alike from each short prompt before they first differ.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdraft.batch_decode import decode_batch
from specdraft.cpu_info import cpu_description
from specdraft.models import load_target
from specdraft.sampling import SamplingConfig
from specdraft.train.selfgen import load_selfgen_records

DTYPES = ("float32", "bfloat16")


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="data/smollm2-135m/selfgen_broad", help="a specdraft-selfgen out_dir")
    ap.add_argument("--short-rows", type=int, default=32, help="held-out prompts under 512 tokens in the short batch")
    ap.add_argument("--long-rows", type=int, default=8, help="held-out prompts of 1000-2500 tokens in the long batch")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repetitions", type=int, default=2)
    ap.add_argument("--agreement-answers", type=int, default=40, help="held-out answers scored teacher-forced")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if min(args.short_rows, args.long_rows, args.new_tokens, args.repetitions, args.agreement_answers) < 1:
        ap.error("--short-rows, --long-rows, --new-tokens, --repetitions and --agreement-answers must be >= 1.")
    torch.set_num_threads(args.threads)
    records = [r for r in load_selfgen_records("eval", args.data) if r["mode"] == "greedy"]
    short = [r["prompt_ids"] for r in records if len(r["prompt_ids"]) < 512][: args.short_rows]
    long = [r["prompt_ids"] for r in records if 1000 <= len(r["prompt_ids"]) <= 2500][: args.long_rows]
    if not short or not long:
        raise ValueError(f"{args.data} has too few held-out prompts: {len(short)} short, {len(long)} long.")
    targets = {d: load_target("smollm2-135m", device="cpu", dtype=d) for d in DTYPES}
    greedy = SamplingConfig(temperature=0.0)
    print(f"# {cpu_description()}, {args.threads} threads, torch {torch.__version__}; {len(short)} short prompts "
          f"({sum(map(len, short))} positions), {len(long)} long ({sum(map(len, long))}), {args.new_tokens} new tokens each")
    rates: dict[tuple[str, str], list[float]] = {}
    rows: dict[str, list[list[int]]] = {}
    for rep in range(args.repetitions):
        for d in (DTYPES if rep % 2 == 0 else DTYPES[::-1]):
            for name, prompts in (("short", short), ("long", long)):
                t0 = time.perf_counter()
                out = decode_batch(targets[d], prompts, args.new_tokens, greedy, [])
                rates.setdefault((d, name), []).append(sum(len(r) for r, _ in out) / (time.perf_counter() - t0))
                if name == "short":
                    rows[d] = [r for r, _ in out]
    print("| batch | float32 tok/s | bfloat16 tok/s | bfloat16 / float32 |")
    print("|---|---|---|---|")
    for name in ("short", "long"):
        f32, b16 = (statistics.median(rates[(d, name)]) for d in DTYPES)
        print(f"| {name} | {f32:.1f} | {b16:.1f} | {b16 / f32:.2f}x |", flush=True)
    same = [common_prefix(a, b) for a, b in zip(rows["float32"], rows["bfloat16"], strict=True)]
    print(f"greedy rows from the short prompts: {sum(s == args.new_tokens for s in same)} of {len(same)} identical; "
          f"median {statistics.median(same):.0f} of {args.new_tokens} tokens alike before the first difference")
    match = total = 0
    answers = [r for r in records if r.get("writer_dtype", "float32") == "float32"][: args.agreement_answers]
    with torch.inference_mode():
        for r in answers:
            ids = torch.tensor(r["prompt_ids"] + r["completion_ids"])[:1536]  # [T]
            start = len(r["prompt_ids"]) - 1
            if start + 1 >= len(ids):
                continue
            choice = {d: targets[d].model(ids[None]).logits[0, start:-1].argmax(-1) for d in DTYPES}  # [A]
            match += int((choice["float32"] == choice["bfloat16"]).sum())
            total += int(choice["float32"].numel())
    print(f"teacher-forced on {len(answers)} held-out float32-written answers ({total} positions): the bfloat16 "
          f"model's greedy choice is the float32 model's at {match / max(total, 1):.4f} of them")


if __name__ == "__main__":
    main()
