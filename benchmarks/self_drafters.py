"""Self-drafters side by side: quantized copies (int8 / nf4 / torch int8) and early exit at a few
exit layers (with / without the shipped adapter, shared KV vs recomputing), against plain
autoregressive decoding and Hugging Face's `assistant_early_exit`, on the default target, greedy.

    python benchmarks/self_drafters.py --max-new-tokens 48 --out benchmarks/self_drafters.md

Every greedy output is checked token for token against the autoregressive one. Speed is wall
time on this machine's CPU with torch threads as given (noisy when other jobs share the cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from drafters.early_exit import EarlyExitDrafter
from drafters.quantized import QuantizedDrafter
from specdraft.decode import SpeculativeDecoder
from specdraft.models import load_target
from specdraft.target import TargetModel

PROMPTS = [
    "Explain what a Python list comprehension is, with one short example.",
    "Rewrite this function to use a for loop instead of recursion:\n\ndef fact(n):\n"
    "    return 1 if n <= 1 else n * fact(n - 1)",
    "Write a haiku about the sea.",
]


@dataclass
class Row:
    """Totals of one configuration over all prompts."""

    name: str
    tokens: int = 0
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    verify_s: float = 0.0
    verify_full_s: float = 0.0  # verify forwards that scored the full K draft tokens
    verify_full_rounds: int = 0
    draft_s: float = 0.0
    identical: bool = True
    ar_tps: float = 0.0  # autoregressive tok/s measured right before this row (same load)
    extra: dict = field(default_factory=dict)

    def cells(self) -> list[str]:
        tps = self.tokens / self.seconds
        alpha = f"{self.accepted / self.drafted:.3f}" if self.drafted else "-"
        verify = f"{1000 * self.verify_full_s / self.verify_full_rounds:.1f}" if self.verify_full_rounds else "-"
        draft_ms = f"{1000 * self.draft_s / self.drafted:.1f}" if self.drafted else "-"
        return [self.name, alpha, f"{self.tokens / self.rounds:.2f}" if self.rounds else "-", draft_ms,
                verify, f"{tps:.1f}", f"{self.ar_tps:.1f}", f"{tps / self.ar_tps:.2f}x",
                "yes" if self.identical else "NO"]


def encode(target: TargetModel, text: str) -> list[int]:
    """Chat-formatted prompt ids."""
    msgs = [{"role": "user", "content": text}]
    ids = target.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def run_specdraft(name: str, target: TargetModel, drafter, prompts: list[list[int]], ref: list[list[int]] | None,
                  k: int, max_new: int) -> tuple[Row, list[list[int]]]:  # noqa: ANN001
    """Generate every prompt with one drafter (None = AR) and total the stats."""
    row, outs = Row(name), []
    dec = SpeculativeDecoder(target, drafter, k)
    for i, prompt in enumerate(prompts):
        res = dec.generate(prompt, max_new, stop_token_ids=[])
        toks = res.token_ids[0].tolist()
        outs.append(toks)
        s = res.stats
        row.tokens += s.new_tokens
        row.seconds += s.total_s
        row.drafted += s.drafted
        row.accepted += s.accepted
        row.rounds += s.rounds
        row.verify_s += s.verify_s
        full = s.verify_s_by_k.get(k if drafter is not None else 0)
        if full:
            row.verify_full_s += full[0]
            row.verify_full_rounds += int(full[1])
        row.draft_s += s.draft_s
        if ref is not None and toks != ref[i]:
            row.identical = False
    print(f"{name}: {row.tokens / row.seconds:.1f} tok/s, alpha "
          f"{row.accepted / max(row.drafted, 1):.3f}, identical={row.identical}", flush=True)
    return row, outs


def run_hf_early_exit(target: TargetModel, exit_layer: int, prompts: list[list[int]], ref: list[list[int]],
                      max_new: int) -> Row:
    """Hugging Face's own self-speculation: generate(assistant_early_exit=E), greedy."""
    row = Row(f"HF assistant_early_exit={exit_layer}")
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([prompt])
        t0 = time.perf_counter()
        out = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                    min_new_tokens=max_new, do_sample=False, assistant_early_exit=exit_layer,
                                    pad_token_id=0)
        row.seconds += time.perf_counter() - t0
        toks = out[0, len(prompt):].tolist()
        row.tokens += len(toks)
        row.identical &= toks == ref[i]
    print(f"{row.name}: {row.tokens / row.seconds:.1f} tok/s identical={row.identical}", flush=True)
    return row


def verify_shared_vs_recompute(target: TargetModel, prompt: list[int], draft: list[int], exit_layer: int,
                               reps: int) -> tuple[float, float]:
    """Median ms of the verify forward over [newest] + draft after early-exit drafting, reusing the
    draft's layers < E (shared KV) vs recomputing them, interleaved in one process."""
    times: dict[bool, list[float]] = {True: [], False: []}
    newest = prompt[-1:]
    for rep in range(reps + 1):  # the first repetition warms up and is not counted
        for share in (True, False):
            target.reset()
            target.forward(torch.tensor([prompt[:-1]]), num_logits=0)
            for tok in newest + draft[:-1]:
                target.forward_prefix(torch.tensor([[tok]]), exit_layer)
            if not share:
                target.discard_prefix()
            t0 = time.perf_counter()
            target.forward(torch.tensor([newest + draft]))
            if rep > 0:
                times[share].append(1000 * (time.perf_counter() - t0))
    return statistics.median(times[True]), statistics.median(times[False])


def main() -> None:
    """Run every configuration and write the Markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--num-draft-tokens", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--exit-layers", default="2,4,6,8,12")
    ap.add_argument("--quantized", default="int8,nf4,torch-int8")
    ap.add_argument("--verify-reps", type=int, default=15)
    ap.add_argument("--out", default="benchmarks/self_drafters.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target("smollm2-135m", device="cpu")
    prompts = [encode(target, p) for p in PROMPTS]
    k, n = args.num_draft_tokens, args.max_new_tokens
    run_specdraft("warm-up", target, None, prompts[:1], None, k, 8)

    ar, ref = run_specdraft("autoregressive", target, None, prompts, None, k, n)
    ar.ar_tps = ar.tokens / ar.seconds
    rows = [ar]

    def measured(row: Row) -> Row:
        """Attach the AR speed of a fresh AR run next to `row` (the load on a shared CPU drifts)."""
        again, _ = run_specdraft("autoregressive (again)", target, None, prompts, None, k, n)
        row.ar_tps = again.tokens / again.seconds
        return row

    quant = {"int8": dict(bits=8), "nf4": dict(bits=4, quant_type="nf4"),
             "torch-int8": dict(bits=8, backend="torch")}
    for name in filter(None, args.quantized.split(",")):
        drafter = QuantizedDrafter(**quant[name])
        row, _ = run_specdraft(f"quantized {name}", target, drafter, prompts, ref, k, n)
        row.extra = drafter.memory
        rows.append(measured(row))
    shipped = Path(__file__).resolve().parent.parent / "specdraft/artifacts/smollm2-135m/early_exit"
    adapter_layer = json.loads((shipped / "adapter_config.json").read_text())["exit_layer"] if shipped.is_dir() else None
    for e in map(int, filter(None, args.exit_layers.split(","))):
        rows.append(measured(run_specdraft(f"early exit E={e}", target, EarlyExitDrafter(e), prompts, ref, k, n)[0]))
        if e == adapter_layer:
            for share in (True, False):
                label = f"early exit E={e} + adapter" + ("" if share else " (recompute, no shared KV)")
                drafter = EarlyExitDrafter(adapter=shipped, share_kv=share)
                rows.append(measured(run_specdraft(label, target, drafter, prompts, ref, k, n)[0]))
    hf_layers = sorted({int(x) for x in args.exit_layers.split(",") if x} & {4, 6})
    rows += [measured(run_hf_early_exit(target, e, prompts, ref, n)) for e in hf_layers]

    head = ["drafter", "acceptance", "tokens/round", "draft ms/token", "verify ms (K drafted)", "tok/s",
            "AR tok/s (adjacent)", "speedup vs AR", "greedy output = AR"]
    lines = ["# Self-drafters on the default target (CPU)", "",
             f"Command: `python benchmarks/self_drafters.py --max-new-tokens {n} --num-draft-tokens {k} "
             f"--threads {args.threads} --exit-layers {args.exit_layers} --quantized {args.quantized} "
             f"--verify-reps {args.verify_reps}`", "",
             f"{len(prompts)} chat prompts x {n} new tokens, greedy, K={k} draft tokens per round, "
             f"torch threads={args.threads}, float32 target on a shared 2-core CPU (timings are noisy; each "
             "row's speedup is against an autoregressive run made right before it). `verify ms` is the "
             "target forward over [newest] + K draft tokens (AR row: one token).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    mem = [r for r in rows if r.extra]
    if mem:
        lines += ["", "Quantized copy memory (bytes the copy adds vs the target's parameters; the lm_head and "
                  "embeddings are shared):", ""]
        lines += [f"- {r.name}: {r.extra['copy_bytes'] / 2**20:.1f} MiB vs {r.extra['target_bytes'] / 2**20:.1f} MiB"
                  for r in mem]
    lines += ["", f"Verify forward over [newest] + K={k} draft tokens after early-exit drafting, median of "
              f"{args.verify_reps} interleaved repetitions (prompt 1, its AR continuation as the draft):", "",
              "| exit layer E | shared KV (layers < E reused) ms | recompute ms | saved | compute share "
              "reused E/L x K/(K+1) |", "|---|---|---|---|---|"]
    for e in map(int, filter(None, args.exit_layers.split(","))):
        shared, recompute = verify_shared_vs_recompute(target, prompts[0], ref[0][:k], e, args.verify_reps)
        share = e / target.num_layers * k / (k + 1)
        lines.append(f"| {e} | {shared:.1f} | {recompute:.1f} | {1 - shared / recompute:.1%} | {share:.1%} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
