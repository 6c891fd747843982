"""The bench's batch-size sweep (`bench.batch_sizes`): how the speedup changes with batch size.

At batch size 1 a decode step streams every weight to score one position, so scoring k more
(a draft) costs little; b prompts decoded at once (`SpeculativeDecoder.generate_batch`) already
score b positions per step, so the k extra positions of each row cost more (the verify curve at
batch b, `costs.verify_curve(target, k, batch_size=b)`, rises faster), and a batch drafts one K
for all its live rows. The sweep measures what is left of each drafter's speedup at each b, next
to the theory's prediction at that b, so a gap between the two points at the batch itself.

For each b of bench.batch_sizes, bench.batches_per_size batches of b consecutive suite prompts
(the first turn of a multi-turn prompt; batch j starts at prompt j*b, wrapping around the suite)
run through the AR baseline and every drafter of the run (`learn=False`), and through Hugging
Face's `generate` batched with left padding when bench.peers lists hf_generate, interleaved on
each batch like the per-prompt bench (the order rotating per repetition), bench.warmup untimed
repetitions first. Per method and b (`summarize_method`):

    throughput   new tokens of all rows / seconds of all batches of one repetition, median over
                 repetitions; speedup = throughput / AR's at the same b (HF: its ratio to our AR)
    decode       the same with each batch's prefill left out (`decode_throughput`; our decoders
                 only): long prompts make the prefill, which no drafter changes, a large share
    predicted    `predicted_batch_speedup`: the theory at batch b from the acceptance pooled over
                 rows, the K mix the batch chose and the verify curve measured at b
    latency      median over rows of a row's latency (batch start until the row finished)
    acceptance   accepted / drafted over all rows; mean accepted length = tokens per row-round;
                 mean K = the K chosen per batched round, averaged over rounds

`run_sweep` writes batch_results.json (rewritten after every batch size, `"partial": true` until
the last) and speedup_vs_batch.png; `render_markdown` is the "## Batch sizes" section of results.md.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from matplotlib.figure import Figure
from omegaconf import DictConfig
from torch import Tensor
from tqdm import tqdm

from specdraft import bench_checks, costs, machine_load, theory
from specdraft.files import write_text_atomically
from specdraft.sampling import SamplingConfig
from specdraft.stats import GenerationStats
from specdraft.suites import SuitePrompt
from specdraft.target import TargetModel

if TYPE_CHECKING:
    from specdraft.decode import BatchStats, SpeculativeDecoder

OUTPUTS = ("batch_results.json", "speedup_vs_batch.png")  # what the sweep writes into the run folder
DEFAULTS: dict[str, Any] = {"batch_sizes": [], "batches_per_size": 2}  # = conf/bench.yaml's bench: (tested)
HF_PEER = "hf_generate"  # the one peer that runs batched (plain decoding, an AR reference)


class SweepMethod(Protocol):
    """What the sweep reads of a bench method (`specdraft.bench.Method`)."""

    name: str
    decoder: SpeculativeDecoder | None
    baseline: str


# ----------------------------------------------------------------------------- settings
def setting(cfg: DictConfig, key: str) -> Any:
    """bench.<key>, or its default (DEFAULTS) when the config has none."""
    return cfg.bench.get(key, DEFAULTS[key])


def batch_sizes(cfg: DictConfig) -> list[int]:
    """The checked bench.batch_sizes (`setting_problems`); empty = no sweep."""
    return [int(b) for b in bench_checks.values(setting(cfg, "batch_sizes"))]


def setting_problems(cfg: DictConfig) -> list[str]:
    """The sweep's settings as `bench_checks.setting_problems` reports them: every batch size an
    integer >= 1, listed once; bench.batches_per_size an integer >= 1 (when there is a sweep)."""
    sizes = bench_checks.values(setting(cfg, "batch_sizes"))
    checks = [("bench.batch_sizes", b, 1, "prompts decoded together; e.g. bench.batch_sizes=[1,2,4,8], "
               "[] = no batch-size sweep") for b in sizes]
    if sizes:
        checks.append(("bench.batches_per_size", setting(cfg, "batches_per_size"), 1,
                       "batches of b consecutive suite prompts timed per batch size b"))
    problems = [p for p in (bench_checks.int_problem(*c) for c in checks) if p]
    ints = [b for b in sizes if bench_checks.is_int_at_least(b, 1)]
    repeated = sorted({b for b in ints if ints.count(b) > 1})
    if repeated:
        problems.append(f"bench.batch_sizes lists {', '.join(map(str, repeated))} more than once; list each "
                        "batch size once, e.g. bench.batch_sizes=[1,2,4,8].")
    return problems


def draw_batches(num_prompts: int, batch_size: int, count: int) -> list[list[int]]:
    """Prompt indices of `count` batches of `batch_size` consecutive prompts: batch j starts at
    prompt j * batch_size and wraps around the suite (a batch larger than the suite repeats prompts)."""
    if num_prompts < 1:
        raise ValueError("the batch-size sweep needs at least one prompt; check bench.categories / bench.limit.")
    return [[(j * batch_size + i) % num_prompts for i in range(batch_size)] for j in range(count)]


def sweep_methods(methods: Sequence[SweepMethod], ar: str) -> list[SweepMethod]:
    """The methods the sweep runs: AR and every drafter on the bench's target (the [plain] stack
    variants and the peers other than hf_generate do not run batched)."""
    return [m for m in methods if (m.decoder is not None and m.baseline == ar) or m.name == HF_PEER]


# ----------------------------------------------------------------------------- one batched run
@dataclass(frozen=True)
class BatchRun:
    """One batched generation of one method: seconds of the whole call, each row's new token ids,
    and for our decoders each row's stats (`GenerationStats`, row.total_s = its latency) and the
    batch's (`BatchStats`); a peer has neither."""

    seconds: float
    rows: list[list[int]]
    row_stats: list[GenerationStats] = field(default_factory=list)
    stats: BatchStats | None = None

    @property
    def new_tokens(self) -> int:
        return sum(len(r) for r in self.rows)

    @property
    def latencies(self) -> list[float]:
        """Each row's seconds from the batch's start until it finished (a peer returns every row at the end)."""
        return [s.total_s for s in self.row_stats] if self.row_stats else [self.seconds] * len(self.rows)


def run_batch(method: SweepMethod, target: TargetModel, prompts: list[list[int]], max_new: int,
              sampling: SamplingConfig) -> BatchRun:
    """One batched generation of `prompts` by `method` (our decoder's `generate_batch`, else
    Hugging Face generate)."""
    if method.decoder is None:
        return hf_generate_batch(target, prompts, max_new, sampling)
    res = method.decoder.generate_batch(prompts, max_new, sampling=sampling, learn=False)
    return BatchRun(res.stats.total_s, [r.token_ids[0].tolist() for r in res.results],
                    [r.stats for r in res.results], res.stats)


def left_padded(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Token ids [B, W] with each prompt at the right end and pad_id before it (W = the longest
    prompt), and the attention mask [B, W]: 1 on prompt tokens, 0 on padding."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # [B, W]
    mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [B, W]
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids, mask


def cut_at_stop(row: Sequence[int], stop_ids: Sequence[int]) -> list[int]:
    """A row's new tokens up to and including its first stop token (Hugging Face pads a finished
    row with the pad id, here the EOS, until the whole batch is done)."""
    stops = set(stop_ids)
    end = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
    return list(row[:end])


def hf_generate_batch(target: TargetModel, prompts: list[list[int]], max_new: int,
                      sampling: SamplingConfig) -> BatchRun:
    """Hugging Face `generate` on the batch, left padded with an attention mask (pad id = the
    first EOS), the same budget and sampling settings; seeded inside a fork of the RNG like the
    per-prompt peer, so the caller's RNG is left as it was."""
    pad_id = (target.eos_token_ids or [0])[0]
    ids, mask = left_padded(prompts, pad_id)
    kwargs: dict[str, Any] = {"max_new_tokens": max_new, "attention_mask": mask.to(target.device),
                              "eos_token_id": target.eos_token_ids or None, "pad_token_id": pad_id}
    if sampling.greedy:
        kwargs["do_sample"] = False
    else:
        kwargs.update(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or None,
                      top_p=sampling.top_p)
    devices = [target.device] if target.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.inference_mode():
        torch.manual_seed(sampling.seed)
        t0 = time.perf_counter()
        out = target.model.generate(ids.to(target.device), **kwargs)  # [B, W + N]
        seconds = time.perf_counter() - t0
    rows = [cut_at_stop(row, target.eos_token_ids) for row in out[:, ids.shape[1]:].tolist()]
    return BatchRun(seconds, rows)


def time_batches(
    methods: Sequence[SweepMethod], target: TargetModel, batches: Sequence[list[list[int]]],
    max_new: Sequence[int], sampling: SamplingConfig, warmup: int, reps: int, on_run: Callable[[], None],
) -> dict[str, list[list[BatchRun]]]:
    """runs[method][repetition][batch]: every method on every batch, interleaved (the order
    rotating per repetition to cancel drift, as the per-prompt bench does), `warmup` untimed
    repetitions first; on_run() after each generation."""
    runs: dict[str, list[list[BatchRun]]] = {m.name: [[] for _ in range(reps)] for m in methods}
    for prompts, new in zip(batches, max_new):
        for rep in range(warmup + reps):
            shift = rep % len(methods)
            for method in [*methods[shift:], *methods[:shift]]:
                run = run_batch(method, target, prompts, new, sampling)
                if rep >= warmup:
                    runs[method.name][rep - warmup].append(run)
                on_run()
    return runs


# ----------------------------------------------------------------------------- metrics
def throughput(runs: Sequence[BatchRun]) -> float:
    """Tokens per second of one repetition: new tokens of every row of its batches / their seconds."""
    seconds = sum(r.seconds for r in runs)
    return sum(r.new_tokens for r in runs) / seconds if seconds > 0 else 0.0


def decode_throughput(runs: Sequence[BatchRun]) -> float | None:
    """Tokens per second of one repetition after the prefill: new tokens / (seconds - prefill
    seconds) of its batches; None for a peer (no prefill measured)."""
    if not runs or any(r.stats is None for r in runs):
        return None
    seconds = sum(r.seconds - r.stats.prefill_s for r in runs if r.stats is not None)
    return sum(r.new_tokens for r in runs) / seconds if seconds > 0 else None


def pooled_acceptance_per_position(rows: Sequence[GenerationStats]) -> list[float]:
    """P(draft position i accepted | reached) over all rows: sum of accepted_i / sum of reached_i.
    Pooling the counts, not averaging each row's rates, weighs every draft token the same: a row
    that reached position i once does not count as much as one that reached it fifty times."""
    width = max((len(s.reached_per_position) for s in rows), default=0)
    accepted, reached = [0] * width, [0] * width
    for s in rows:
        for i, (a, r) in enumerate(zip(s.accepted_per_position, s.reached_per_position)):
            accepted[i] += a
            reached[i] += r
    return [a / r if r else 0.0 for a, r in zip(accepted, reached)]


def plain_step_seconds(ar_runs: Sequence[BatchRun]) -> float:
    """Seconds of one batched plain decode step at this batch size: the AR baseline's time after
    the prefill over its rounds, pooled over its batches (0.0 when it ran no round)."""
    stats = [r.stats for r in ar_runs if r.stats is not None]
    rounds = sum(s.rounds for s in stats)
    return sum(s.total_s - s.prefill_s for s in stats) / rounds if rounds else 0.0


def draft_seconds_per_token(rows: Sequence[GenerationStats]) -> float:
    """The rows' drafting seconds per drafted token, pooled (0.0 when nothing was drafted)."""
    drafted = sum(s.drafted for s in rows)
    return sum(s.draft_s for s in rows) / drafted if drafted else 0.0


def predicted_batch_speedup(runs: Sequence[BatchRun], curve: Sequence[float], ar_step_s: float) -> float | None:
    """`theory.predicted_speedup` at batch size b of what these batched runs did, the way
    `bench.run_predicted_speedup` does it at batch 1: the acceptance profile pooled over every row
    (`pooled_acceptance_per_position`), the rows' drafting seconds per drafted token, the mix of
    K the batch chose per round (BatchStats.drafted_per_round), T_v(k) = ar_step_s * curve[k]
    with the verify curve measured at b and ar_step_s one batched AR step (`plain_step_seconds`),
    and the runs' own prefills. It models every row emitting the pooled E[N](k) tokens per round;
    a batch whose rows accept unevenly waits for its slowest row, which the measured speedup
    shows and this does not. None when nothing ran or a K used lies beyond the curve."""
    stats = [r.stats for r in runs if r.stats is not None]
    rows = [s for r in runs for s in r.row_stats]
    mix = Counter(k for s in stats for k in s.drafted_per_round)
    if not mix or ar_step_s <= 0 or max(mix) >= len(curve):
        return None
    t_v = [ar_step_s * c for c in curve]
    return theory.predicted_speedup(pooled_acceptance_per_position(rows), draft_seconds_per_token(rows), t_v,
                                    dict(mix), sum(s.prefill_s for s in stats), ar_step_s)


def summarize_method(
    name: str, runs: list[list[BatchRun]], ar_runs: list[list[BatchRun]], curve: Sequence[float],
    ar_step_s: float, greedy: bool,
) -> dict[str, Any]:
    """One method's record at one batch size (runs[repetition][batch]; see the module docstring);
    greedy_match: every row of the first timed repetition equals AR's row (None when sampling)."""
    tps = statistics.median(throughput(rep) for rep in runs)
    ar_tps = statistics.median(throughput(rep) for rep in ar_runs)
    flat = [r for rep in runs for r in rep]
    rec: dict[str, Any] = {
        "method": name,
        "tokens_per_s": tps,
        "speedup": tps / ar_tps if ar_tps > 0 else None,
        "latency_s": statistics.median(x for r in flat for x in r.latencies),
        "new_tokens": sum(r.new_tokens for r in runs[0]),
        "greedy_match": all(r.rows == a.rows for r, a in zip(runs[0], ar_runs[0])) if greedy else None,
    }
    rows = [s for r in flat for s in r.row_stats]
    stats = [r.stats for r in flat if r.stats is not None]
    if not rows or not stats:  # a peer: throughput and greedy match only
        return rec
    decode = [decode_throughput(rep) for rep in runs]
    ar_decode = [decode_throughput(rep) for rep in ar_runs]
    if all(d is not None for d in decode + ar_decode):
        rec["decode_tokens_per_s"] = statistics.median(d for d in decode if d is not None)
        rec["decode_speedup"] = rec["decode_tokens_per_s"] / statistics.median(d for d in ar_decode if d is not None)
    drafted, rounds = sum(s.drafted for s in rows), sum(s.rounds for s in rows)
    k_per_round = [k for s in stats for k in s.drafted_per_round]
    t_q = draft_seconds_per_token(rows)
    predicted = predicted_batch_speedup(flat, curve, ar_step_s)
    rec.update(
        acceptance_rate=sum(s.accepted for s in rows) / drafted if drafted else 0.0,
        acceptance_per_position=pooled_acceptance_per_position(rows),
        mean_accepted_length=sum(s.new_tokens for s in rows) / rounds if rounds else 0.0,
        mean_k=sum(k_per_round) / len(k_per_round) if k_per_round else 0.0,
        rounds_per_batch=len(k_per_round) / len(flat),
        live_rows_per_round=_mean([n for s in stats for n in s.live_rows_per_round]),
        prefill_s=statistics.median(s.prefill_s for s in stats),
        c=t_q / ar_step_s if (drafted and ar_step_s > 0) else None,
        predicted_speedup=predicted,
        efficiency=rec["speedup"] / predicted if (predicted and rec["speedup"]) else None,
    )
    return rec


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def summarize_size(
    batch_size: int, methods: Sequence[SweepMethod], ar: str, runs: dict[str, list[list[BatchRun]]],
    batches: list[list[int]], max_new: list[int], curve: Sequence[float], greedy: bool,
) -> dict[str, Any]:
    """The record of one batch size: its batches (prompt indices), the verify curve and AR step
    measured at it, and every method's `summarize_method`; a greedy row that differs from AR's
    is reported loudly."""
    ar_flat = [r for rep in runs[ar] for r in rep]
    ar_step = plain_step_seconds(ar_flat)
    records = {m.name: summarize_method(m.name, runs[m.name], runs[ar], curve, ar_step, greedy) for m in methods}
    for name, rec in records.items():
        if rec["greedy_match"] is False:
            print(f"\n!!! GREEDY MISMATCH: {name} at batch size {batch_size} differs from the autoregressive "
                  "rows !!!", file=sys.stderr)
    return {"batch_size": batch_size, "batches": batches, "max_new_tokens": max_new, "verify_curve": list(curve),
            "ar_step_s": ar_step, "methods": records}


# ----------------------------------------------------------------------------- the sweep
def run_sweep(
    cfg: DictConfig, target: TargetModel, methods: Sequence[SweepMethod], prompts: Sequence[SuitePrompt],
    out_dir: Path, ar: str, curve_tokens: int,
) -> dict[str, Any]:
    """Time every batch size of bench.batch_sizes (see the module docstring) and write
    batch_results.json after each one (partial until the last) and, with bench.plots, the plot.
    methods: the bench's (`sweep_methods` picks those that run batched); ar: the baseline's name;
    curve_tokens: the longest draft the run's verify curves must cover (measured at every batch
    size before any timing). Returns the batch_results.json object."""
    chosen = sweep_methods(methods, ar)
    decoder = next(m.decoder for m in chosen if m.name == ar and m.decoder is not None)
    sampling = decoder.sampling
    ids = [p.token_ids(target.tokenizer) for p in prompts]  # the first turn of a multi-turn prompt
    budgets = [p.max_new_tokens or int(cfg.max_new_tokens) for p in prompts]
    sizes, count = batch_sizes(cfg), int(setting(cfg, "batches_per_size"))
    reps, warmup = int(cfg.bench.repetitions), int(cfg.bench.warmup)
    for b in sizes:  # every batch size's verify curve, measured before any timing
        costs.verify_curve(target, curve_tokens, batch_size=b)
    load_before, clock = machine_load.load_average(), machine_load.CpuClock.now()
    result: dict[str, Any] = {
        "partial": True, "baseline": ar, "batch_sizes": sizes, "batches_per_size": count, "repetitions": reps,
        "warmup": warmup, "greedy": sampling.greedy, "methods": [m.name for m in chosen],
        "not_batched": [m.name for m in methods if m.name not in {c.name for c in chosen}], "sizes": [],
    }

    def write(partial: bool) -> None:
        load = machine_load.MachineLoad.since(clock, load_before, torch.get_num_threads())
        result.update(partial=partial, machine=load.to_json())
        write_text_atomically(out_dir / OUTPUTS[0], json.dumps(result, indent=1, default=str))

    bar = tqdm(total=len(sizes) * count * (reps + warmup) * len(chosen), desc="batch sizes",
               disable=not cfg.bench.progress)
    try:
        for b in sizes:
            batches = draw_batches(len(prompts), b, count)
            max_new = [min(budgets[i] for i in batch) for batch in batches]  # within every prompt's checked budget
            runs = time_batches(chosen, target, [[ids[i] for i in batch] for batch in batches], max_new,
                                sampling, warmup, reps, lambda: bar.update(1))
            curve = costs.verify_curve(target, max(curve_tokens, _max_k(runs)), batch_size=b)
            result["sizes"].append(summarize_size(b, chosen, ar, runs, batches, max_new, curve, sampling.greedy))
            write(partial=True)  # after every batch size: a stopped sweep keeps the finished ones
    except (KeyboardInterrupt, Exception) as err:
        bar.close()
        done = [s["batch_size"] for s in result["sizes"]]
        print(f"[bench] the batch-size sweep stopped by {type(err).__name__} after batch sizes {done}; "
              f"they are in {out_dir / OUTPUTS[0]}", file=sys.stderr)
        raise
    bar.close()
    write(partial=False)
    if cfg.bench.plots:
        write_plot(result, out_dir / OUTPUTS[1])
    return result


def _max_k(runs: dict[str, list[list[BatchRun]]]) -> int:
    """The largest K any batched round drafted (0 when none did)."""
    return max((k for reps in runs.values() for rep in reps for r in rep if r.stats
                for k in r.stats.drafted_per_round), default=0)


# ----------------------------------------------------------------------------- report
def _cell(x: Any, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def _match(greedy_match: bool | None) -> str:
    return "n/a (sampled)" if greedy_match is None else ("yes" if greedy_match else "NO")


# The columns of a batch-size table: (header, the cell of one method's record).
COLUMNS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("tok/s", lambda m: _cell(m["tokens_per_s"], ".1f")),
    ("speedup vs AR", lambda m: _cell(m["speedup"], ".2f", "x")),
    ("predicted", lambda m: _cell(m.get("predicted_speedup"), ".2f", "x")),
    ("decode speedup", lambda m: _cell(m.get("decode_speedup"), ".2f", "x")),
    ("prefill s", lambda m: _cell(m.get("prefill_s"), ".2f")),
    ("latency s", lambda m: _cell(m["latency_s"], ".3f")),
    ("acceptance", lambda m: _cell(m.get("acceptance_rate"))),
    ("mean K", lambda m: _cell(m.get("mean_k"))),
    ("greedy = AR", lambda m: _match(m["greedy_match"])),
)


def render_markdown(result: dict[str, Any]) -> str:
    """The "## Batch sizes" section of results.md: the speedups side by side, then a table per
    batch size (rows: methods)."""
    sizes = result["sizes"]
    lines = ["## Batch sizes\n"]
    if result.get("partial"):
        lines.append(f"**PARTIAL:** {len(sizes)} of {len(result['batch_sizes'])} batch sizes complete.\n")
    lines.append(
        f"Each batch size b: {result['batches_per_size']} batches of b consecutive suite prompts (wrapping around), "
        f"every method interleaved; timed repetitions {result['repetitions']}, untimed first {result['warmup']}. "
        "tok/s = new tokens of all rows / seconds of all batches (median over repetitions); speedup = tok/s / AR's "
        "at the same b; predicted = the theory at b (acceptance pooled over rows, the K the batch chose, the verify "
        "curve measured at b); decode speedup = the same without the prefills (median prefill s per batch); latency = median over rows of batch start to the row's end; mean K = draft tokens "
        "chosen per batched round.\n")
    for warning in result.get("machine", {}).get("warnings", []):
        lines.append(f"**warning:** {warning}\n")
    if result.get("not_batched"):
        lines.append(f"Not run batched: {', '.join(result['not_batched'])}.\n")
    if not sizes:
        return "\n".join(lines)
    lines.append("| method | " + " | ".join(f"b={s['batch_size']}" for s in sizes) + " |")
    lines.append("|---|" + "---|" * len(sizes))
    for method in result["methods"]:
        cells = [_speedup_cell(s["methods"].get(method, {})) for s in sizes]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Decode speedup (prefill left out): " + "; ".join(
        f"{method} " + ", ".join(f"b={s['batch_size']} {_cell(s['methods'].get(method, {}).get('decode_speedup'), '.2f', 'x')}"
                                 for s in sizes)
        for method in result["methods"] if method != result["baseline"]) + ".\n")
    ar_tps = [(s["batch_size"], s["methods"][result["baseline"]]["tokens_per_s"]) for s in sizes]
    if ar_tps and ar_tps[0][1] > 0:  # how far batching alone amortises the weights
        lines.append(f"Batched {result['baseline']} throughput vs b={ar_tps[0][0]}: " + ", ".join(
            f"b={b} {t:.1f} tok/s ({t / ar_tps[0][1]:.2f}x)" for b, t in ar_tps) + ".\n")
    for s in sizes:
        lines.append(f"### batch size {s['batch_size']}\n")
        lines.append("| method | " + " | ".join(h for h, _ in COLUMNS) + " |")
        lines.append("|---|" + "---|" * len(COLUMNS))
        lines += [f"| {name} | " + " | ".join(cell(m) for _, cell in COLUMNS) + " |"
                  for name, m in s["methods"].items()]
        lines.append("")
    mismatches = [(m, s["batch_size"]) for s in sizes for m, r in s["methods"].items() if r["greedy_match"] is False]
    if mismatches:
        lines.append(f"**GREEDY MISMATCHES (method, batch size):** {mismatches}\n")
    return "\n".join(lines)


def _speedup_cell(m: dict[str, Any]) -> str:
    """"measured (predicted)" speedup of one method at one batch size."""
    if not m:
        return "-"
    pred = m.get("predicted_speedup")
    return _cell(m.get("speedup"), ".2f", "x") + ("" if pred is None else f" ({pred:.2f}x)")


def write_plot(result: dict[str, Any], path: Path) -> Path:
    """Speedup vs batch size per method (the baseline is the line at 1), its prediction dashed in the same
    colour; drawn like `specdraft.plots` (matplotlib's object API straight to PNG)."""
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    sizes = result["sizes"]
    for i, method in enumerate(m for m in result["methods"] if m != result["baseline"]):
        colour = f"C{i}"
        points = [(s["batch_size"], s["methods"][method]) for s in sizes if method in s["methods"]]
        ax.plot([b for b, _ in points], [m["speedup"] or 0.0 for _, m in points], marker="o", color=colour,
                label=method)
        predicted = [(b, m["predicted_speedup"]) for b, m in points if m.get("predicted_speedup")]
        if predicted:
            ax.plot(*zip(*predicted), ls="--", marker="x", color=colour, label=f"{method} (predicted)")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks([s["batch_size"] for s in sizes], [str(s["batch_size"]) for s in sizes])
    ax.set(xlabel="batch size", ylabel="throughput speedup vs AR at that batch size",
           title="Speedup vs batch size")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
