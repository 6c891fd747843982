"""One prepared check for a machine with a GPU (issues 4 and 6), in well under 5 minutes:

1. T_p(k) for k = 1..16 new positions at context 512, fast stack and plain HF forward side by side,
   as ratios to T_p(1) of the same stack (CUDA-synchronised timings);
2. greedy exactness on the device: every drafter's speculative output against plain greedy decoding
   with the Hugging Face model's own forward and cache (no specdraft code);
   (on CUDA the default target replays its verify forwards as CUDA graphs, so this checks them);
3. every drafter's acceptance and speedup vs the AR baseline (same loop, K = 0), including the
   quantized drafter with the real bitsandbytes CUDA kernels (int8 and nf4).

    .venv/bin/python benchmarks/gpu_check.py                 # cuda if available, else cpu
    .venv/bin/python benchmarks/gpu_check.py --device cpu --target tiny_random --drafters ngram

Writes report.json to --out and exits 1 if any greedy output differs. The test suite runs it on CPU
with a tiny target (tests/test_gpu_check.py) so it never rots; the CUDA-only parts are the device
and the synchronisation, nothing else branches on it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from specdraft.build import drafter_config, make_drafter
from specdraft.check import reference_greedy
from specdraft.costs import cuda_sync, time_forwards
from specdraft.decode import SpeculativeDecoder
from specdraft.models import load_target, tiny_random_target
from specdraft.suites import load_suite
from specdraft.target import TargetModel

ALL_DRAFTERS = ["ngram", "draft_model", "quantized", "quantized_int8", "early_exit", "medusa"]


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    cuda_sync(device)
    t0 = time.perf_counter()
    out = fn()
    cuda_sync(device)
    return out, time.perf_counter() - t0


@torch.inference_mode()
def verify_costs(targets: dict[str, TargetModel], context: int, max_k: int, reps: int) -> dict[str, list[float]]:
    """Median seconds of a forward over k = 1..max_k new positions after `context`, per stack."""
    any_target = next(iter(targets.values()))
    ids = (torch.arange(context + max_k) * 7919 % any_target.vocab_size)[None].to(any_target.device)
    times = time_forwards(targets, ids, context, range(1, max_k + 1), reps)
    return {n: [statistics.median(times[n, k]) for k in range(1, max_k + 1)] for n in targets}


def drafter_cfg(name: str) -> Any:
    if name == "quantized_int8":  # `quantized` is 4-bit (nf4 through bitsandbytes on CUDA)
        return OmegaConf.merge(drafter_config("quantized"), {"bits": 8})
    return drafter_config(name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--target", default="smollm2-135m", help="a model alias/path, or tiny_random")
    ap.add_argument("--drafters", nargs="+", default=ALL_DRAFTERS)
    ap.add_argument("--prompts", type=int, default=3, help="prompts of the quick suite")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-k", type=int, default=16)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="outputs/gpu_check")
    args = ap.parse_args(argv)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.target == "tiny_random":
        tiny = tiny_random_target(vocab_size=49152, tokenizer="smollm2-135m", max_position_embeddings=2048)
        target = TargetModel(tiny.model.to(device), tiny.tokenizer, tiny.eos_token_ids)
    else:
        target = load_target(args.target, device=str(device))
    stacks = {"fast": target}  # the default: fast stack, + CUDA graphs on a GPU
    if target.cuda_graphs:
        stacks = {"fast+graphs": target,
                  "fast": TargetModel(target.model, target.tokenizer, target.eos_token_ids, cuda_graphs=False)}
    stacks["plain"] = TargetModel(target.model, target.tokenizer, target.eos_token_ids, fast=False)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report: dict[str, Any] = {"device": name, "torch": torch.__version__, "target": args.target,
                              "fast_stack": target.fast, "cuda_graphs": target.cuda_graphs,
                              "max_new_tokens": args.max_new_tokens}
    print(f"device {name}, target {args.target}, fast stack {target.fast}, CUDA graphs {target.cuda_graphs}, "
          f"torch {torch.__version__}")

    costs = verify_costs(stacks, args.context, args.max_k, args.reps)
    report["verify_cost_s"] = costs
    print(f"\nT_p(k) / T_p(1), context {args.context}:")
    for stack, secs in costs.items():
        print(f"  {stack:11s} T_p(1) = {secs[0] * 1000:.2f} ms | " + " ".join(f"{s / secs[0]:.2f}" for s in secs))
    print(f"  fast/plain at k=1: {costs['fast'][0] / costs['plain'][0]:.2f}")

    prompts = [p.token_ids(target.tokenizer) for p in load_suite("quick")[: args.prompts]]
    refs = [reference_greedy(target, p, args.max_new_tokens, target.eos_token_ids) for p in prompts]
    ar = SpeculativeDecoder(target, None)
    ar_s = []
    for p in prompts:
        ar.generate(p, args.max_new_tokens)  # warm-up (CUDA graphs are captured on first use)
        _, dt = timed(lambda p=p: ar.generate(p, args.max_new_tokens), device)
        ar_s.append(dt)
    ar_tokens = [len(r) for r in refs]
    results: dict[str, Any] = {}
    mismatches = 0
    print(f"\n{'drafter':14s} greedy=plain  speedup  acceptance  mean accepted length")
    for dname in args.drafters:
        try:
            dec = SpeculativeDecoder(target, make_drafter(drafter_cfg(dname)), "auto")
        except (ImportError, RuntimeError, ValueError, OSError) as err:  # e.g. no bitsandbytes here
            results[dname] = {"error": f"{type(err).__name__}: {err}"}
            print(f"{dname:14s} not run: {results[dname]['error']}")
            continue
        exact, speedups, acc, mal = [], [], [], []
        for p, ref, t_ar, n_ar in zip(prompts, refs, ar_s, ar_tokens, strict=True):
            dec.generate(p, args.max_new_tokens)  # warm-up
            out, dt = timed(lambda p=p: dec.generate(p, args.max_new_tokens), device)
            toks = out.token_ids[0].tolist()
            exact.append(toks == ref)
            speedups.append((len(toks) / dt) / (n_ar / t_ar))
            acc.append(out.stats.acceptance_rate)
            mal.append(out.stats.mean_accepted_length)
        mismatches += exact.count(False)
        results[dname] = {"greedy_exact": all(exact), "speedup_median": statistics.median(speedups),
                          "speedups": speedups, "acceptance": statistics.mean(acc),
                          "mean_accepted_length": statistics.mean(mal)}
        print(f"{dname:14s} {'yes' if all(exact) else 'NO':12s} {statistics.median(speedups):6.2f}x "
              f"{statistics.mean(acc):10.2f}  {statistics.mean(mal):6.2f}")
    report["ar_tokens_per_s"] = [n / t for n, t in zip(ar_tokens, ar_s, strict=True)]
    report["drafters"] = results
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1))
    print(f"\nreport: {out_dir / 'report.json'}; greedy mismatches: {mismatches}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
