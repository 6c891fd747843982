"""Which quantized copy of the target should draft for it on this machine? Every variant side by side
with the AR baseline on the same prompts in one run: the bytes the copy adds, its acceptance, its
cost per drafted token c = T_q / T_p (T_p: one AR step of the target, measured in the same run),
tok/s and the speedup vs AR (median over prompts), and whether greedy output equals AR's.

    .venv/bin/python benchmarks/quantized_copy.py [--suite builtin] [--limit 2] [--max-new 128]
        [--variants int4 int4:64 bf16 int8 int4+pruned ...] [--threads 2]

A variant is a `conf/drafter/quantized.yaml` override set: int4[:group] (bits=4), bf16 (bits=16),
int8 (bits=8), fp32 (bits=32, the exact copy), bnb-int8 / bnb-nf4 (backend=bitsandbytes), and a
"+pruned" suffix for the pruned vocabulary shipped for the target (`pruned_vocab=auto`; without
it: the full vocabulary through the target's own lm_head). Methods run interleaved per
prompt (the order rotates per repetition); num_draft_tokens=auto, greedy.
"""

from __future__ import annotations

import argparse
import platform
import statistics
from typing import Any

import torch
from omegaconf import OmegaConf

from specdraft.build import config_hash, drafter_config, make_drafter
from specdraft.costs import time_forwards
from specdraft.decode import SpeculativeDecoder
from specdraft.models import load_target
from specdraft.suites import load_suite
from specdraft.target import TargetModel


def variant_config(name: str) -> Any:
    """The drafter config of a variant name (module docstring)."""
    base, pruned = (name[: -len("+pruned")], True) if name.endswith("+pruned") else (name, False)
    kind, _, group = base.partition(":")
    overrides: dict[str, Any] = {
        "int4": {"bits": 4, "group_size": int(group or 32)},
        "bf16": {"bits": 16},
        "int8": {"bits": 8},
        "fp32": {"bits": 32},
        "bnb-int8": {"bits": 8, "backend": "bitsandbytes"},
        "bnb-nf4": {"bits": 4, "backend": "bitsandbytes", "group_size": int(group or 64)},
    }.get(kind)
    if overrides is None:
        raise SystemExit(f"error: unknown variant {name!r}; see the module docstring.")
    overrides["pruned_vocab"] = "auto" if pruned else None
    return OmegaConf.merge(drafter_config("quantized"), overrides)


def ar_step_seconds(target: TargetModel, ids: list[int], reps: int = 20) -> float:
    """Median seconds of one decode step of the target after `ids` (`costs.time_forwards`)."""
    tokens = torch.tensor([ids], device=target.device)
    times = time_forwards({"ar": target}, tokens, len(ids) - 1, [1], reps)
    return statistics.median(times["ar", 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--suite", default="builtin")
    ap.add_argument("--limit", type=int, default=2, help="prompts per category")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=["int4+pruned", "int4", "int4:64+pruned", "bf16+pruned", "int8+pruned"])
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.target, device="cpu", fast=True)
    prompts: dict[str, list[int]] = {}
    seen: dict[str, int] = {}
    for p in load_suite(args.suite):
        if seen.get(p.category, 0) < args.limit:
            seen[p.category] = seen.get(p.category, 0) + 1
            prompts[p.id] = p.token_ids(target.tokenizer)
    decoders = {"AR": SpeculativeDecoder(target, None, num_draft_tokens=0)}
    memory = {}
    for name in args.variants:
        cfg = variant_config(name)
        drafter = make_drafter(cfg)
        decoders[name] = SpeculativeDecoder(target, drafter, num_draft_tokens="auto", cost_key=config_hash(cfg))
        drafter.bind(target)
        memory[name] = dict(drafter.memory)
    print(f"target {args.target} ({target.weight_bytes / 1e6:.0f} MB of projections + head), "
          f"{platform.machine()}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"suite {args.suite} ({len(prompts)} prompts), {args.max_new} new tokens, greedy, K auto")
    rows: dict[str, dict[str, list[float]]] = {n: {"tps": [], "ratio": [], "acc": [], "c": []} for n in decoders}
    mismatches: dict[str, int] = {n: 0 for n in decoders}
    for pid, ids in prompts.items():
        step = ar_step_seconds(target, ids)
        runs: dict[str, list[Any]] = {n: [] for n in decoders}
        names = list(decoders)
        for rep in range(args.reps + 1):  # the first repetition warms up (and calibrates costs)
            order = names[rep % len(names):] + names[: rep % len(names)]
            for n in order:
                res = decoders[n].generate(ids, args.max_new)
                if rep:
                    runs[n].append(res)
        ar = runs["AR"][0]
        ar_tps = statistics.median(r.stats.tokens_per_s for r in runs["AR"])
        for n, results in runs.items():
            tps = statistics.median(r.stats.tokens_per_s for r in results)
            s = results[0].stats
            rows[n]["tps"].append(tps)
            rows[n]["ratio"].append(tps / ar_tps)
            if s.drafted:
                rows[n]["acc"].append(s.acceptance_rate)
                rows[n]["c"].append(s.draft_s / s.drafted / step)
            mismatches[n] += int(results[0].token_ids[0].tolist() != ar.token_ids[0].tolist())
        print(f"  {pid}: " + ", ".join(f"{n} {statistics.median(r.stats.tokens_per_s for r in v):.1f}"
                                       for n, v in runs.items()) + " tok/s", flush=True)
    print("\n| copy | MB added | acceptance | c = T_q/T_p | tok/s | speedup vs AR (median) | greedy = AR |")
    print("|---|---|---|---|---|---|---|")
    for n, r in rows.items():
        mb = memory[n]["copy_bytes"] / 1e6 if n in memory else 0.0
        acc = f"{statistics.median(r['acc']):.2f}" if r["acc"] else "-"
        c = f"{statistics.median(r['c']):.2f}" if r["c"] else "-"
        print(f"| {n} | {mb:.0f} | {acc} | {c} | {statistics.median(r['tps']):.1f} | "
              f"{statistics.median(r['ratio']):.2f}x | {'yes' if mismatches[n] == 0 else f'NO ({mismatches[n]})'} |")


if __name__ == "__main__":
    main()
