"""Greedy acceptance of quantized copies of the default target on the built-in suite, per setting.

    .venv/bin/python benchmarks/quant_agreement.py --max-new-tokens 64 > benchmarks/runs/quant_agreement.txt

In greedy speculative decoding every draft token is proposed after a prefix that equals the
target's own greedy output (earlier drafts were kept only where they matched it), so the
probability that a reached draft position is accepted, alpha, is exactly the copy's top-1
agreement with the target's greedy token, teacher-forced on the target's greedy continuation. That
needs one forward of each copy per prompt instead of a slow speculative run per setting, so many
bitsandbytes settings can be compared on all 30 built-in prompts. `alpha` below is that
agreement; E[N] at K=3 and accepted/drafted at K=3 follow from it under the i.i.d. model.
"""

from __future__ import annotations

import argparse
import logging
import time

import torch

from drafters.quantized import memory_report, quantized_copy
from specdraft.decode import SpeculativeDecoder
from specdraft.models import load_target
from specdraft.suites import load_suite

SETTINGS = {  # name -> quantized_copy keyword arguments
    "int8 threshold=6 (default)": dict(bits=8, int8_threshold=6.0),
    "int8 threshold=4": dict(bits=8, int8_threshold=4.0),
    "int8 threshold=2": dict(bits=8, int8_threshold=2.0),
    "int8 threshold=0 (pure int8)": dict(bits=8, int8_threshold=0.0),
    "nf4 blocksize=64 (default)": dict(bits=4, quant_type="nf4"),
    "nf4 blocksize=32": dict(bits=4, quant_type="nf4", blocksize=32),
    "fp4 blocksize=64": dict(bits=4, quant_type="fp4"),
    "torch dynamic int8": dict(bits=8, backend="torch"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated names from SETTINGS")
    ap.add_argument("--k", type=int, default=3, help="K for the derived accepted/drafted column")
    args = ap.parse_args()
    logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)  # a line per matmul
    target = load_target("smollm2-135m", device="cpu")
    decoder = SpeculativeDecoder(target, None)
    seqs, answer_starts = [], []
    t0 = time.perf_counter()
    for prompt in load_suite("builtin"):
        ids = prompt.token_ids(target.tokenizer)
        out = decoder.generate(ids, args.max_new_tokens).token_ids[0].tolist()
        seqs.append(torch.tensor([ids + out]))
        answer_starts.append(len(ids))
    n_tokens = sum(s.shape[1] - a for s, a in zip(seqs, answer_starts))
    print(f"{len(seqs)} prompts, {n_tokens} greedy answer tokens ({time.perf_counter() - t0:.0f} s)", flush=True)
    k = args.k
    print(f"| setting | alpha (top-1 agreement) | E[N] at K={k} | accepted/drafted at K={k} | copy MiB |")
    print("|---|---|---|---|---|")
    for name in args.settings.split(","):
        copy = quantized_copy(target.model, **SETTINGS[name])
        hits = 0
        with torch.inference_mode():
            for seq, start in zip(seqs, answer_starts):
                pred = copy(input_ids=seq[:, :-1]).logits[0, start - 1 :].argmax(-1)  # [answer]
                hits += int((pred == seq[0, start:]).sum())
        alpha = hits / n_tokens
        e_n = sum(alpha**j for j in range(k + 1))
        mib = memory_report(target.model, copy)["copy_bytes"] / 2**20
        print(f"| {name} | {alpha:.3f} | {e_n:.2f} | {(e_n - 1) / k:.3f} | {mib:.1f} |", flush=True)


if __name__ == "__main__":
    main()
