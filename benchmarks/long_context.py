"""Decode cost per token against context length, for AR and the n-gram drafter, on the fast layer
stack and the plain Hugging Face stack side by side, plus the peak memory of a short and a long
n-gram generation.

    .venv/bin/python benchmarks/long_context.py [--target smollm2-135m] [--threads 2]
        [--contexts 128 512 1024 2048 4096] [--new-tokens 64] [--num-draft-tokens 5]
        [--stacks fast plain] [--rss-lengths 300 3000] [--profile]

Every context is real text in the chat template: the user messages of the built-in suite,
concatenated and repeated as filler, then the same short passage and an instruction to repeat it
(so the n-gram drafter has something to copy, and the continuation - what is copied, how much is
accepted - is the same at every length). The n-gram draft length is fixed (5) unless `--num-draft-tokens auto`:
auto follows wall-clock costs, so on a busy machine its choices (and the ratio) drift.
Each (context, stack, drafter) is one greedy generation of
`--new-tokens` tokens with stop tokens disabled; the decode rate is new tokens / (total - prefill),
so prefill is reported apart. Ratios are tok/s(longest context) / tok/s(shortest), measured in the
same run. Peak RSS is measured in a separate child process per generation length (getrusage of the
whole process, model load included, and the growth of the peak during the generation alone).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from drafters.ngram import NGramDrafter
from specdraft.cpu_info import cpu_description
from specdraft.decode import SpeculativeDecoder
from specdraft.models import load_target
from specdraft.suites import load_suite
from specdraft.target import TargetModel

PASSAGE_TOKENS = 64  # the passage to repeat: the same tokens, right before the instruction, at every length
INSTRUCTION = "\n\nRepeat the passage above, word for word."
_SPLIT = "\x00"  # stands for the text inside the rendered chat template


def context_ids(tokenizer: object, length: int) -> list[int]:
    """`length` token ids in the chat template: the suite's text repeated as filler (its tail, cut
    to fit), then the same passage (the suite's first PASSAGE_TOKENS tokens) and INSTRUCTION."""
    texts = [m.content for p in load_suite("builtin") for m in (p.messages or ()) if m.role == "user"]
    encode = tokenizer.encode  # type: ignore[attr-defined]
    text = encode("\n\n".join(texts), add_special_tokens=False)
    passage = encode("\n\nPassage:\n", add_special_tokens=False) + text[:PASSAGE_TOKENS]
    rendered = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        [{"role": "user", "content": _SPLIT + INSTRUCTION}], add_generation_prompt=True, tokenize=False
    )
    before, after = rendered.split(_SPLIT)
    head, tail = encode(before, add_special_tokens=False), encode(after, add_special_tokens=False)
    room = length - len(head) - len(passage) - len(tail)  # filler tokens
    if room < 0:
        raise ValueError(f"context length {length} is too short; use at least {length - room}.")
    filler = text
    while len(filler) < room:
        filler = filler + filler
    return head + filler[len(filler) - room :] + passage + tail


@dataclass(frozen=True)
class Decoded:
    """One generation's decode rate (prefill excluded) and what it did."""

    tok_s: float
    prefill_s: float
    tokens_per_round: float


def decode_once(decoder: SpeculativeDecoder, prompt: list[int], new_tokens: int) -> Decoded:
    """Greedy generation of exactly `new_tokens` tokens after `prompt` (stop tokens disabled)."""
    stats = decoder.generate(prompt, new_tokens, stop_token_ids=[]).stats
    decode_s = stats.total_s - stats.prefill_s
    return Decoded(stats.new_tokens / decode_s, stats.prefill_s, stats.mean_accepted_length)


def make_decoder(target: TargetModel, drafter: str, num_draft_tokens: int | str) -> SpeculativeDecoder:
    if drafter == "ar":
        return SpeculativeDecoder(target, None)
    return SpeculativeDecoder(target, NGramDrafter(), num_draft_tokens=num_draft_tokens)


def rss_child(args: argparse.Namespace) -> None:
    """Run one n-gram generation of args.rss_child tokens; print peak RSS as a JSON line."""
    target = load_target(args.target, device="cpu", fast=True)
    prompt = context_ids(target.tokenizer, 128)
    decoder = make_decoder(target, "ngram", args.num_draft_tokens)
    decode_once(decoder, prompt, 8)  # warm-up (and the K policy's cost curve)
    # Linux: writing 5 to clear_refs resets the peak (VmHWM) so the generation's own peak is seen.
    try:
        Path("/proc/self/clear_refs").write_text("5")
        hwm_reset = True
    except OSError:
        hwm_reset = False
    before = _status_kb("VmRSS")
    result = decode_once(decoder, prompt, args.rss_child)
    report = {
        "tokens": args.rss_child,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_mb": before / 1024,
        "generation_peak_mb": _status_kb("VmHWM") / 1024 if hwm_reset else None,
        "tok_s": result.tok_s,
    }
    print(json.dumps(report))


def _status_kb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1])
    return float("nan")


def measure_rss(args: argparse.Namespace) -> list[dict]:
    """One child process per generation length, so their peaks are independent."""
    reports = []
    for n in args.rss_lengths:
        cmd = [sys.executable, __file__, "--rss-child", str(n), "--target", args.target,
               "--threads", str(args.threads), "--num-draft-tokens", str(args.num_draft_tokens)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the RSS child for {n} tokens failed:\n{done.stderr[-2000:]}")
        reports.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return reports


def profile_longest(target: TargetModel, prompt: list[int], rounds: int) -> None:
    """Top operators of target forwards at the longest context, prefill excluded: k = 1 (an AR
    round) and k = 6 (verifying 5 drafts, cropped back as after a rejection)."""
    ids = torch.tensor([prompt])  # [1, L]
    target.reset()
    target.forward(ids[:, :-1], num_logits=0)
    length = target.cache_length
    for k in (1, 6):
        block = ids[:, -1:].repeat(1, k)  # [1, k]
        target.forward(block)  # warm-up
        target.crop(length)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(rounds):
                target.forward(block)
                target.crop(length)
        print(f"\nTop operators, fast stack, k={k} after {length} cached positions ({rounds} forwards):")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))


def check_args(args: argparse.Namespace) -> None:
    """Refuse settings that cannot give a measurement (ValueError naming the fix)."""
    if args.num_draft_tokens != "auto":
        if not str(args.num_draft_tokens).isdigit():
            raise ValueError(f"--num-draft-tokens must be an integer >= 0 or auto, got {args.num_draft_tokens!r}.")
        args.num_draft_tokens = int(args.num_draft_tokens)
    if args.threads < 1 or args.new_tokens < 1:
        raise ValueError("--threads and --new-tokens must be >= 1.")
    if min(args.contexts) < 128 or min(args.rss_lengths, default=1) < 1:
        raise ValueError("every --contexts length must be >= 128 (room for the template and the passage) "
                         "and every --rss-lengths value >= 1.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 1024, 2048, 4096])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--num-draft-tokens", default="5",
                    help="n-gram draft length: an int (default 5: the same drafts whatever the load) or auto")
    ap.add_argument("--stacks", nargs="+", default=["fast", "plain"], choices=["fast", "plain"])
    ap.add_argument("--rss-lengths", type=int, nargs="*", default=[300, 3000])
    ap.add_argument("--profile", action="store_true", help="profile the decode at the longest context")
    ap.add_argument("--rss-child", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    check_args(args)  # before any model loads
    torch.set_num_threads(args.threads)
    if args.rss_child:
        rss_child(args)
        return

    load_before = os.getloadavg()
    t_start = time.perf_counter()
    fast = load_target(args.target, device="cpu", fast=True)
    targets = {"fast": fast, "plain": TargetModel(fast.model, fast.tokenizer, fast.eos_token_ids, fast=False)}
    targets = {name: targets[name] for name in args.stacks}
    contexts = sorted(args.contexts)
    if contexts[-1] + args.new_tokens > fast.max_context:
        raise ValueError(f"context {contexts[-1]} + {args.new_tokens} new tokens exceeds the target's {fast.max_context}.")
    prompts = {length: context_ids(fast.tokenizer, length) for length in contexts}
    drafters = ["ar", "ngram"]
    decoders = {(s, d): make_decoder(t, d, args.num_draft_tokens) for s, t in targets.items() for d in drafters}
    for decoder in decoders.values():  # warm-up: first-call kernels, the K policy's cost curve
        decode_once(decoder, prompts[contexts[0]], 16)

    results: dict[tuple[str, str, int], Decoded] = {}
    for length in contexts:  # contexts outermost: the stacks and drafters of one context run back to back
        for key, decoder in decoders.items():
            results[(*key, length)] = decode_once(decoder, prompts[length], args.new_tokens)
            print(f"  {key[0]} {key[1]} {length}: {results[(*key, length)].tok_s:.1f} tok/s", file=sys.stderr, flush=True)

    print(f"target {args.target}, CPU {cpu_description()}, torch {torch.__version__}, threads "
          f"{torch.get_num_threads()}, {args.new_tokens} new tokens per generation, greedy, n-gram "
          f"num_draft_tokens={args.num_draft_tokens}")
    print("\nDecode tok/s (prefill excluded) by context length; n-gram tokens per round in brackets:\n")
    print("| stack | drafter | " + " | ".join(str(c) for c in contexts) + f" | ratio {contexts[-1]}/{contexts[0]} |")
    print("|---|---|" + "---|" * (len(contexts) + 1))
    for stack, drafter in decoders:
        row = [results[stack, drafter, c] for c in contexts]
        cells = [f"{r.tok_s:.1f}" + (f" ({r.tokens_per_round:.2f})" if drafter != "ar" else "") for r in row]
        print(f"| {stack} | {drafter} | " + " | ".join(cells) + f" | {row[-1].tok_s / row[0].tok_s:.2f} |")
    print("\nPrefill seconds (the AR run's) by context length:\n")
    print("| stack | " + " | ".join(str(c) for c in contexts) + " |")
    print("|---|" + "---|" * len(contexts))
    for stack in targets:
        print(f"| {stack} | " + " | ".join(f"{results[stack, 'ar', c].prefill_s:.2f}" for c in contexts) + " |")

    if args.profile:
        profile_longest(fast, prompts[contexts[-1]], 10)

    if args.rss_lengths:
        print("\nn-gram generation after a 128-token prompt, one child process per length (MB):\n")
        print("| new tokens | peak RSS (process) | RSS before generating | peak during generation | tok/s |")
        print("|---|---|---|---|---|")
        reports = measure_rss(args)
        for r in reports:
            during = "n/a" if r["generation_peak_mb"] is None else f"{r['generation_peak_mb']:.0f}"
            print(f"| {r['tokens']} | {r['peak_rss_mb']:.0f} | {r['rss_before_mb']:.0f} | {during} | {r['tok_s']:.1f} |")
        if len(reports) >= 2:
            long, short = reports[-1], reports[0]
            line = (f"\npeak RSS ratio {long['tokens']}/{short['tokens']} tokens: process "
                    f"{long['peak_rss_mb'] / short['peak_rss_mb']:.2f} (the model load's peak included)")
            if long["generation_peak_mb"] and short["generation_peak_mb"]:
                line += f", during the generation {long['generation_peak_mb'] / short['generation_peak_mb']:.2f}"
            print(line)

    load_after = os.getloadavg()
    print(f"\nload average (1, 5, 15 min) before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; "
          f"{time.perf_counter() - t_start:.0f} s in all")
    print("rerun: .venv/bin/python " + " ".join(["benchmarks/long_context.py", *sys.argv[1:]]))


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:  # a bad setting: one line, like the console scripts
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
