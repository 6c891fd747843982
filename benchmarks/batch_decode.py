"""Plain batched decoding: specdraft.batch_decode against Hugging Face `generate`, side by side.

    .venv/bin/python benchmarks/batch_decode.py [--batch-sizes 1 8 32] [--new-tokens 64] [--threads 2]

The same chat prompts (ragged lengths: the built-in suite's first turns, cycled) and the same token budget for
every batch size; each row decodes greedily to exactly --new-tokens tokens (no stop token, so both sides do the
same work). Prints total tok/s of ours and of `generate` (left padded, attention mask), their ratio, and each
one's throughput relative to its own batch 1: what a batch amortises on this machine. Numbers: RESULTS.md.
"""

from __future__ import annotations

import argparse
import time

import torch

from specdraft.batch_decode import decode_batch
from specdraft.models import load_target
from specdraft.sampling import SamplingConfig
from specdraft.suites import load_suite


def hf_generate(model: torch.nn.Module, prompts: list[list[int]], new: int, pad: int) -> int:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)  # [B, W] left padded
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             pad_token_id=pad)
    return int(out[:, width:].numel())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.batch_sizes[0] != 1:
        ap.error("--batch-sizes must start with 1 (the other sizes are compared with batch 1).")
    torch.set_num_threads(args.threads)
    target = load_target("smollm2-135m", device="cpu")
    tok = target.tokenizer
    firsts = [sp.token_ids(tok) for sp in load_suite("builtin")]
    greedy = SamplingConfig(temperature=0.0)
    print("| batch | ours tok/s | HF generate tok/s | ours / HF | ours vs our batch 1 | HF vs HF batch 1 |")
    print("|---|---|---|---|---|---|")
    base: dict[str, float] = {}
    for b in args.batch_sizes:
        prompts = [firsts[i % len(firsts)] for i in range(b)]
        decode_batch(target, prompts[:1], 4, greedy, [])  # warm-up
        t0 = time.perf_counter()
        rows = decode_batch(target, prompts, args.new_tokens, greedy, [])
        ours = sum(len(r) for r, _ in rows) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        n = hf_generate(target.model, prompts, args.new_tokens, int(tok.pad_token_id))
        hf = n / (time.perf_counter() - t0)
        base.setdefault("ours", ours)
        base.setdefault("hf", hf)
        print(f"| {b} | {ours:.1f} | {hf:.1f} | {ours / hf:.2f}x | {ours / base['ours']:.2f}x | {hf / base['hf']:.2f}x |",
              flush=True)


if __name__ == "__main__":
    main()
