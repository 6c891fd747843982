"""`specdraft-bench`: which drafter should I use for my model and prompts, and what does it buy?

For every prompt of a suite, the autoregressive baseline, each drafter and each Hugging Face peer
run interleaved (the order rotates per repetition) R times; medians are taken per prompt, so every
ratio comes from one run on one machine state. Writes into Hydra's run dir:

    results.json   per prompt x method: tokens, tok/s, speedup vs AR, acceptance (overall and per
                   position), mean accepted length, draft/verify/overhead seconds, measured
                   c = T_q/T_p, the verify cost curve T_v(k), predicted speedup and efficiency
    results.md     a table per category and overall
    *.png          acceptance per position, speedup per category, measured vs predicted speedup

    specdraft-bench drafter=ngram suite=quick
    specdraft-bench bench.drafters=[ngram,early_exit] bench.peers=[hf_generate,hf_prompt_lookup]
    specdraft-bench -m drafter=none,ngram num_draft_tokens=2,4,auto
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specdraft import theory
from specdraft.build import drafter_config, make_decoder, make_drafter
from specdraft.decode import SpeculativeDecoder
from specdraft.stats import GenerationStats
from specdraft.suites import SuitePrompt, load_suite
from specdraft.target import TargetModel

AR = "autoregressive"
PEERS = ("hf_generate", "hf_prompt_lookup", "hf_assisted", "hf_early_exit")
# Which HF peer is the counterpart of which drafter class (for the "ours vs HF" table).
COUNTERPART = {"NGramDrafter": "hf_prompt_lookup", "DraftModelDrafter": "hf_assisted",
               "EarlyExitDrafter": "hf_early_exit"}


@dataclass
class Run:
    """One generation of one method on one prompt."""

    seconds: float
    token_ids: list[int]
    stats: GenerationStats | None = None


@dataclass
class Method:
    """Something the bench times: our decoder (drafter or AR) or a Hugging Face peer."""

    name: str
    decoder: SpeculativeDecoder | None = None
    peer: str | None = None
    peer_kwargs: dict[str, Any] = field(default_factory=dict)
    drafter_class: str | None = None

    def run(self, target: TargetModel, ids: list[int], max_new: int, sampling: Any) -> Run:
        if self.decoder is not None:
            res = self.decoder.generate(ids, max_new)
            return Run(res.stats.total_s, res.token_ids[0].tolist(), res.stats)
        return run_peer(target, ids, max_new, sampling, self.peer_kwargs)


# ----------------------------------------------------------------------------- HF peers
def run_peer(
    target: TargetModel, ids: list[int], max_new: int, sampling: Any, kwargs: dict[str, Any]
) -> Run:
    """Time Hugging Face `generate` on the same prompt and settings (EOS stops it, like ours)."""
    inp = torch.tensor([ids], device=target.device)
    gen_kwargs: dict[str, Any] = {
        "max_new_tokens": max_new,
        "attention_mask": torch.ones_like(inp),
        "eos_token_id": target.eos_token_ids or None,
        "pad_token_id": (target.eos_token_ids or [0])[0],
    }
    if sampling.greedy:
        gen_kwargs["do_sample"] = False
    else:
        gen_kwargs.update(do_sample=True, temperature=sampling.temperature,
                          top_k=sampling.top_k or None, top_p=sampling.top_p)
        torch.manual_seed(sampling.seed)  # HF `generate` samples from the global RNG only
    gen_kwargs.update(kwargs)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = target.model.generate(inp, **gen_kwargs)
    seconds = time.perf_counter() - t0
    return Run(seconds, out[0, len(ids):].tolist())


def make_peers(cfg: DictConfig, target: TargetModel, drafters: dict[str, Any]) -> list[Method]:
    """Hugging Face counterparts requested in bench.peers."""
    methods = []
    for name in cfg.bench.peers:
        if name not in PEERS:
            raise ValueError(f"unknown peer {name!r}; choose from {list(PEERS)}.")
        if name == "hf_generate":
            methods.append(Method(name, peer=name))
        elif name == "hf_prompt_lookup":
            for k in cfg.bench.hf_prompt_lookup_num_tokens:
                methods.append(Method(f"{name}[{k}]", peer=name,
                                      peer_kwargs={"prompt_lookup_num_tokens": int(k)}))
        elif name == "hf_early_exit":
            exit_layer = next((getattr(d, "exit_layer", None) for d in drafters.values()
                               if hasattr(d, "exit_layer")), None) or cfg.bench.hf_early_exit_layer
            methods.append(Method(f"{name}[{exit_layer}]", peer=name,
                                  peer_kwargs={"assistant_early_exit": int(exit_layer)}))
        elif name == "hf_assisted":
            assistant = next((d.hf_assistant_model() for d in drafters.values()
                              if hasattr(d, "hf_assistant_model")), None)
            if assistant is None:
                print("[bench] hf_assisted skipped: no drafter in this run provides a draft model "
                      "(add draft_model to bench.drafters)", file=sys.stderr)
                continue
            methods.append(Method(name, peer=name, peer_kwargs={"assistant_model": assistant}))
    return methods


# ----------------------------------------------------------------------------- metrics
def verify_curve(stats: list[GenerationStats]) -> dict[int, float]:
    """Mean seconds of a verify forward per number of draft tokens k, pooled over runs."""
    tot: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for s in stats:
        for k, (sec, n) in s.verify_s_by_k.items():
            tot[int(k)][0] += sec
            tot[int(k)][1] += n
    return {k: v[0] / v[1] for k, v in sorted(tot.items()) if v[1]}


def predicted_speedup(s: GenerationStats, t_p0: float, curve: dict[int, float]) -> float | None:
    """Theory's speedup for the K mix this run actually used, from measured acceptance and costs:
    the rounds are predicted to emit sum_k n_k E[N](k) tokens in sum_k n_k (k T_q + T_v(k))
    seconds, where AR needs T_v(0) per token; both pay the same prefill."""
    if s.rounds == 0 or t_p0 <= 0:
        return None
    t_q = s.draft_s / s.drafted if s.drafted else 0.0
    acc = s.acceptance_per_position
    tokens = seconds = 0.0
    for k, (_, n) in s.verify_s_by_k.items():
        k = int(k)
        tokens += n * theory.expected_tokens_from_profile(acc, k)
        seconds += n * (k * t_q + curve.get(k, t_p0))
    return (s.prefill_s + tokens * t_p0) / (s.prefill_s + seconds) if seconds > 0 else None


def summarize(method: Method, runs: list[Run], ar_runs: list[Run], t_p0: float) -> dict[str, Any]:
    """Median-based record of one method on one prompt."""
    med = statistics.median(r.seconds for r in runs)
    ar_med = statistics.median(r.seconds for r in ar_runs)
    tokens = len(runs[0].token_ids)
    ar_tokens = len(ar_runs[0].token_ids)
    tps = tokens / med if med > 0 else 0.0
    ar_tps = ar_tokens / ar_med if ar_med > 0 else 0.0
    rec: dict[str, Any] = {
        "method": method.name,
        "tokens": tokens,
        "seconds_median": med,
        "tokens_per_s": tps,
        "speedup": tps / ar_tps if ar_tps > 0 else None,
        "greedy_match": runs[0].token_ids == ar_runs[0].token_ids,
    }
    stats = [r.stats for r in runs if r.stats is not None]
    if stats:
        s = stats[len(stats) // 2]
        curve = verify_curve(stats)
        t_q = s.draft_s / s.drafted if s.drafted else None
        pred = predicted_speedup(s, t_p0, curve)
        rec.update(
            acceptance_rate=s.acceptance_rate,
            acceptance_per_position=s.acceptance_per_position,
            mean_accepted_length=s.mean_accepted_length,
            rounds=s.rounds,
            draft_s=s.draft_s,
            verify_s=s.verify_s,
            overhead_s=s.overhead_s,
            overhead_fraction=s.overhead_fraction,
            prefill_s=s.prefill_s,
            c=(t_q / t_p0) if (t_q is not None and t_p0 > 0) else None,
            verify_curve={str(k): v for k, v in curve.items()},
            predicted_speedup=pred,
            efficiency=(rec["speedup"] / pred) if (pred and rec["speedup"]) else None,
        )
    return rec


# ----------------------------------------------------------------------------- the run
def build_methods(cfg: DictConfig, target: TargetModel) -> list[Method]:
    """AR baseline first, then the drafters (cfg.drafter, or bench.drafters), then HF peers.
    bench.plain_stack adds the AR baseline and every drafter again on the plain Hugging Face
    forward (`target.fast=false`, same weights), suffixed "[plain]", to show what the fast verifier
    buys."""
    methods = [Method(AR, decoder=make_decoder(cfg, target, None))]
    names = list(cfg.bench.drafters) if cfg.bench.drafters else []
    drafter_cfgs = {n: drafter_config(n) for n in names} if names else {"drafter": cfg.drafter}
    targets = [("", target)]
    if cfg.bench.get("plain_stack") and target.fast:
        plain = TargetModel(target.model, target.tokenizer, target.eos_token_ids, fast=False)
        targets.append(("[plain]", plain))
        methods.append(Method(AR + "[plain]", decoder=make_decoder(cfg, plain, None)))
    drafters = {}
    for suffix, tgt in targets:
        for name, dcfg in drafter_cfgs.items():
            drafter = make_drafter(dcfg)
            if drafter is None:
                continue
            label = (name if names else _drafter_label(cfg)) + suffix
            if not suffix:
                drafters[label] = drafter
            methods.append(Method(label, decoder=make_decoder(cfg, tgt, drafter),
                                  drafter_class=type(drafter).__name__))
    return methods + make_peers(cfg, target, drafters)


def _drafter_label(cfg: DictConfig) -> str:
    choice = HydraConfig.get().runtime.choices.get("drafter") if HydraConfig.initialized() else None
    # outside a Hydra run: the drafter's module name (drafters.ngram.NGramDrafter -> ngram)
    return str(choice or cfg.drafter.get("_target_", "drafter").rsplit(".", 2)[-2])


def select_prompts(cfg: DictConfig) -> list[SuitePrompt]:
    prompts = load_suite(cfg.suite.path or cfg.suite.name)
    if cfg.bench.categories:
        wanted = set(cfg.bench.categories)
        prompts = [p for p in prompts if p.category in wanted]
    if cfg.bench.limit:
        per_cat: dict[str, int] = defaultdict(int)
        kept = []
        for p in prompts:
            if per_cat[p.category] < cfg.bench.limit:
                kept.append(p)
                per_cat[p.category] += 1
        prompts = kept
    if not prompts:
        raise ValueError("no prompts selected; check suite, bench.categories and bench.limit.")
    return prompts


def run_bench(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """Run the whole comparison and write results.json / results.md / plots into out_dir."""
    torch.set_num_threads(cfg.bench.threads or torch.get_num_threads())
    target = instantiate(cfg.target)
    methods = build_methods(cfg, target)
    prompts = select_prompts(cfg)
    sampling = methods[0].decoder.sampling  # type: ignore[union-attr]
    reps = int(cfg.bench.repetitions)
    records = []
    bar = tqdm(total=len(prompts) * (reps + cfg.bench.warmup) * len(methods), desc="bench",
               disable=not cfg.bench.progress)
    for prompt in prompts:
        ids = prompt.token_ids(target.tokenizer)
        max_new = prompt.max_new_tokens or cfg.max_new_tokens
        runs: dict[str, list[Run]] = defaultdict(list)
        for rep in range(cfg.bench.warmup + reps):
            shift = rep % len(methods)
            for method in methods[shift:] + methods[:shift]:  # rotate to cancel drift
                run = method.run(target, ids, max_new, sampling)
                if rep >= cfg.bench.warmup:
                    runs[method.name].append(run)
                bar.update(1)
        ar_runs = runs[AR]
        t_p0 = verify_curve([r.stats for r in ar_runs if r.stats]).get(0, 0.0)
        for method in methods:
            rec = summarize(method, runs[method.name], ar_runs, t_p0)
            rec.update(prompt=prompt.id, category=prompt.category, drafter_class=method.drafter_class)
            if not sampling.greedy:  # sampled outputs differ by design: there is nothing to compare
                rec["greedy_match"] = None
            if sampling.greedy and not rec["greedy_match"]:
                print(f"\n!!! GREEDY MISMATCH: {method.name} on {prompt.id} differs from the "
                      "autoregressive output !!!", file=sys.stderr)
            records.append(rec)
    bar.close()
    result = {
        "config": OmegaConf.to_container(cfg, resolve=True),
        "records": records,
        "summary": aggregate(records),
        "peer_ratios": peer_ratios(records),
        "greedy_mismatches": [
            (r["method"], r["prompt"]) for r in records if sampling.greedy and not r["greedy_match"]
        ],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(result, indent=1, default=str))
    md = render_markdown(result)
    (out_dir / "results.md").write_text(md)
    if cfg.bench.plots:
        from specdraft.plots import write_plots

        write_plots(result, out_dir)
    return result


# ----------------------------------------------------------------------------- tables
def _median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def aggregate(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{category or "overall": {method: medians over prompts}}."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["category"], r["method"])].append(r)
        groups[("overall", r["method"])].append(r)
    out: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for (cat, method), rs in groups.items():
        out[cat][method] = {
            "prompts": len(rs),
            "speedup": _median([r["speedup"] for r in rs]),
            "tokens_per_s": _median([r["tokens_per_s"] for r in rs]),
            "acceptance_rate": _median([r.get("acceptance_rate") for r in rs]),
            "mean_accepted_length": _median([r.get("mean_accepted_length") for r in rs]),
            "efficiency": _median([r.get("efficiency") for r in rs]),
            "overhead_fraction": _median([r.get("overhead_fraction") for r in rs]),
            "greedy_match": None if any(r["greedy_match"] is None for r in rs) else all(
                r["greedy_match"] for r in rs),
        }
    return dict(out)


def peer_ratios(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ours vs the Hugging Face counterpart (best variant) per drafter: median over prompts of
    our tok/s divided by the peer's tok/s on the same prompt."""
    by_prompt: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in records:
        by_prompt[r["prompt"]][r["method"]] = r
    methods = {r["method"]: r.get("drafter_class") for r in records}
    out = []
    for name, cls in methods.items():
        peer = COUNTERPART.get(cls or "")
        if not peer:
            continue
        variants = sorted({m for m in methods if m.split("[")[0] == peer})
        if not variants:
            continue
        # the peer's best variant overall (e.g. best prompt_lookup_num_tokens)
        best = max(variants, key=lambda v: _median(
            [p[v]["tokens_per_s"] for p in by_prompt.values() if v in p]) or 0.0)
        ratios = [p[name]["tokens_per_s"] / p[best]["tokens_per_s"]
                  for p in by_prompt.values() if name in p and best in p and p[best]["tokens_per_s"]]
        out.append({"method": name, "peer": best, "ratio": _median(ratios), "prompts": len(ratios)})
    return out


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None else (format(x, spec) if isinstance(x, float) else str(x))


def _match(greedy_match: bool | None) -> str:
    """The "greedy = AR" cell: n/a when sampling (outputs are not expected to be equal)."""
    return "n/a (sampled)" if greedy_match is None else ("yes" if greedy_match else "NO")


def render_markdown(result: dict[str, Any]) -> str:
    lines = []
    cfg = result["config"]
    lines.append(f"# specdraft bench: {cfg['target'].get('name_or_path', 'target')}, "
                 f"suite {cfg['suite'].get('name') or cfg['suite'].get('path')}, "
                 f"num_draft_tokens={cfg['num_draft_tokens']}, max_new_tokens={cfg['max_new_tokens']}\n")
    for cat in ["overall"] + sorted(c for c in result["summary"] if c != "overall"):
        lines.append(f"## {cat}\n")
        lines.append("| method | speedup vs AR | tok/s | acceptance | mean accepted length | "
                     "efficiency | overhead | greedy = AR |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for method, m in result["summary"][cat].items():
            lines.append(
                f"| {method} | {_fmt(m['speedup'])}x | {_fmt(m['tokens_per_s'], '.1f')} | "
                f"{_fmt(m['acceptance_rate'])} | {_fmt(m['mean_accepted_length'])} | "
                f"{_fmt(m['efficiency'])} | {_fmt(m['overhead_fraction'], '.1%')} | "
                f"{_match(m['greedy_match'])} |"
            )
        lines.append("")
    if result["peer_ratios"]:
        lines.append("## ours vs Hugging Face counterpart (median tok/s ratio)\n")
        lines.append("| ours | HF peer | ratio | prompts |")
        lines.append("|---|---|---|---|")
        for r in result["peer_ratios"]:
            lines.append(f"| {r['method']} | {r['peer']} | {_fmt(r['ratio'])}x | {r['prompts']} |")
        lines.append("")
    if result["greedy_mismatches"]:
        lines.append(f"**GREEDY MISMATCHES:** {result['greedy_mismatches']}\n")
    return "\n".join(lines)


@hydra.main(version_base="1.3", config_path="pkg://conf", config_name="bench")
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    result = run_bench(cfg, out_dir)
    md = render_markdown(result)
    overall = md.split("\n## ")[1]  # the overall table (the first section)
    print("\n## " + overall)
    print(f"[bench] results in {out_dir}")
