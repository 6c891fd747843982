"""`specdraft-bench`: which drafter should I use for my model and prompts, and what does it buy?

For every prompt of a suite, the autoregressive baseline, each drafter and each Hugging Face peer
run interleaved (the order rotates per repetition) R times; medians are taken per prompt, so every
ratio comes from one run on one machine state. Writes into Hydra's run dir:

    results.json   per prompt x method: tokens, tok/s, speedup vs AR, prefill seconds, decode tok/s
                   (new tokens / (total - prefill) seconds) and decode speedup vs AR, acceptance
                   (overall and per position), mean accepted length, draft/verify/overhead seconds,
                   measured c = T_q/T_p, measured verify seconds per k, the verify-cost curve
                   T_v(k)/T_v(0) (`specdraft.costs.verify_curve`), predicted speedup
                   (`specdraft.theory`) and efficiency (measured / predicted)
    results.md     a table per category and overall (end-to-end and decode-only speedups side by
                   side, so a long prompt's prefill does not hide a decoding speedup), and per turn
                   for multi-turn categories
    *.png          acceptance per position, speedup per category, measured vs predicted speedup

With bench.batch_sizes (e.g. [1,2,4,8]) the bench then also sweeps batch sizes: AR and every
drafter decode b prompts at once (`specdraft.batch_bench`; batch_results.json, a "## Batch sizes"
section in results.md, speedup_vs_batch.png).

llama.cpp peers (`llamacpp`, `llamacpp_lookup`, `llamacpp_q4`; built by `make llamacpp`,
`specdraft.llamacpp`) run the same prompt tokens and budget through llama.cpp's own tools, timed by
llama.cpp's timers. The physical limit (`specdraft.roofline`): the machine's read bandwidth is
measured once before the prompts; each prompt's bytes per decode step (weights + KV cache at its
mean context) give the roofline AR tok/s, and each method's decode tok/s is reported as a fraction
of it.

A multi-turn prompt (`turns`, the MT-bench / Spec-Bench format) is a conversation: every method
answers turn 1, its own answer is appended as an assistant message, and it answers turn 2 on the
whole conversation, and so on (`run_turns`). Each turn is a prompt of its own in the results (id
`<id>#t<turn>`, field `turn`); under greedy decoding every method's answers equal AR's, so every
turn's conversation is the same for all methods and is checked like any prompt.

Before any model loads, every setting, every prompt (tokenised: prompt + new tokens within the
target's context) and the output folder are checked, and every problem is reported in one error
(`specdraft.bench_checks`). results.json and results.md are rewritten after each prompt, marked
`"partial": true` until the last one; Ctrl-C or an error during the runs leaves them with every
finished prompt and says how far the run got. A folder that holds an earlier run's results (a
fixed hydra.run.dir) is refused unless bench.overwrite=true. Both files record the cores other
processes kept busy during the run (and the load average before and after) and warn when they or
surplus threads competed for the cores (`specdraft.machine_load`).

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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specdraft import batch_bench, bench_checks, costs, llamacpp, machine_load, roofline, theory
from specdraft.build import drafter_config, drafter_label, make_decoder, make_drafter
from specdraft.console import hydra_cli
from specdraft.decode import SpeculativeDecoder
from specdraft.files import write_text_atomically
from specdraft.plots import PLOT_FILES, write_plots
from specdraft.stats import GenerationStats
from specdraft.suites import SuitePrompt
from specdraft.target import TargetModel

AR = "autoregressive"
HF_PEERS = ("hf_generate", "hf_prompt_lookup", "hf_assisted", "hf_early_exit")


@dataclass(frozen=True)
class LlamaCppPeerKind:
    """A llama.cpp peer: which GGUF of `make llamacpp` it runs, and whether with lookup decoding."""

    model: str  # a key of llamacpp.MODELS
    lookup: bool


LLAMACPP_PEERS = {
    "llamacpp": LlamaCppPeerKind("f32", lookup=False),  # the same weights as ours, plain decoding
    "llamacpp_lookup": LlamaCppPeerKind("f32", lookup=True),  # its n-gram (lookup) decoding
    "llamacpp_q4": LlamaCppPeerKind("q4_1", lookup=False),  # the GGUF's own Q4_1 weights
}
PEERS = HF_PEERS + tuple(LLAMACPP_PEERS)
# Ours vs llama.cpp: the method of ours (by its bench name) that does what a llama.cpp peer does.
LLAMACPP_COUNTERPARTS = {AR: "llamacpp", "ngram": "llamacpp_lookup"}
OUTPUTS = ("results.json", "results.md", *PLOT_FILES, *batch_bench.OUTPUTS)  # what a run writes into its folder


@runtime_checkable
class HFCounterpart(Protocol):
    """What a drafter whose `hf_counterpart` is not None also provides: the arguments that make its
    Hugging Face peer do the same thing with the same weights, e.g. {"assistant_model": draft} for
    "hf_assisted" or {"assistant_early_exit": exit_layer} for "hf_early_exit" ({} when the peer
    needs nothing from the drafter). Asked after `bind`."""

    hf_counterpart: ClassVar[str | None]

    def hf_peer_kwargs(self) -> dict[str, Any]: ...


def peer_kwargs(drafter: Any) -> dict[str, Any]:
    """The arguments of the drafter's declared Hugging Face counterpart (`HFCounterpart`)."""
    if isinstance(drafter, HFCounterpart):
        return drafter.hf_peer_kwargs()
    raise ValueError(
        f"{type(drafter).__name__} declares hf_counterpart={type(drafter).hf_counterpart!r} but has no "
        "hf_peer_kwargs() giving that peer's arguments; implement it (see specdraft.bench.HFCounterpart)."
    )


@dataclass
class Run:
    """One generation of one method on one prompt.

    token_ids is empty for a peer that prints text (llama.cpp): new_tokens then counts its tokens
    and text holds its output. decode_seconds / decode_tokens: the part after the prompt's forward
    (None when the method does not split its time)."""

    seconds: float
    token_ids: list[int]
    stats: GenerationStats | None = None
    new_tokens: int | None = None
    text: str | None = None
    decode_seconds: float | None = None
    decode_tokens: int | None = None
    lookup: llamacpp.LookupStats | None = None

    @property
    def tokens(self) -> int:
        return len(self.token_ids) if self.new_tokens is None else self.new_tokens

    @property
    def has_token_ids(self) -> bool:
        return self.new_tokens is None

    @property
    def prefill_seconds(self) -> float | None:
        """Seconds before decoding (the prompt's forward); None when the method does not split its time."""
        return None if self.decode_seconds is None else self.seconds - self.decode_seconds


@dataclass
class Method:
    """Something the bench times: our decoder (drafter or AR) or a Hugging Face peer."""

    name: str
    decoder: SpeculativeDecoder | None = None
    peer: str | None = None
    peer_kwargs: dict[str, Any] = field(default_factory=dict)
    hf_counterpart: str | None = None  # the drafter's declared HF counterpart (ours vs HF table)
    baseline: str = AR  # the autoregressive method on the same target (forward stack)
    llamacpp: LlamaCppPeer | None = None  # set for a llama.cpp peer
    memory: dict[str, Any] = field(default_factory=dict)  # what its drafter keeps across requests (Drafter.learn)

    def run(self, target: TargetModel, ids: list[int], max_new: int, sampling: Any) -> Run:
        if self.decoder is not None:
            res = self.decoder.generate(ids, max_new, sampling=sampling, learn=False)
            s = res.stats
            return Run(s.total_s, res.token_ids[0].tolist(), s,
                       decode_seconds=s.total_s - s.prefill_s, decode_tokens=s.new_tokens)
        if self.llamacpp is not None:
            return self.llamacpp.run(target, ids, max_new, sampling)
        return run_peer(target, ids, max_new, sampling, self.peer_kwargs)


# ----------------------------------------------------------------------------- llama.cpp peers
@dataclass(frozen=True)
class LlamaCppPeer:
    """A llama.cpp tool on one GGUF with our threads and context (`specdraft.llamacpp`)."""

    model: Path
    draft_max: int | None  # None = plain decoding
    threads: int
    context: int

    def run(self, target: TargetModel, ids: list[int], max_new: int, sampling: Any) -> Run:
        """The same prompt tokens (as text, see specdraft.llamacpp), budget and sampling settings."""
        if target.tokenizer is None:
            raise ValueError(bench_checks.NO_TOKENIZER)
        text = target.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        request = llamacpp.Request(
            prompt=text, max_new_tokens=max_new, threads=self.threads, context=self.context,
            temperature=float(sampling.temperature), top_k=int(sampling.top_k), top_p=float(sampling.top_p),
            seed=int(sampling.seed), draft_max=self.draft_max)
        out = llamacpp.run(request, self.model, prompt_tokens=len(ids))
        return Run(out.seconds, [], new_tokens=out.new_tokens, text=out.text,
                   decode_seconds=out.decode_seconds, decode_tokens=out.decode_tokens, lookup=out.lookup)


def make_llamacpp_peers(cfg: DictConfig, target: TargetModel) -> list[Method]:
    """The llama.cpp peers requested in bench.peers (checked by bench_checks before any load)."""
    threads = int(cfg.bench.threads or torch.get_num_threads())
    methods = []
    for name in bench_checks.names(cfg.bench.peers):
        kind = LLAMACPP_PEERS.get(name)
        if kind is None:
            continue
        draft_max = int(cfg.bench.llamacpp_lookup_draft_max) if kind.lookup else None
        label = f"{name}[{draft_max}]" if kind.lookup else name
        peer = LlamaCppPeer(llamacpp.model_path(kind.model), draft_max, threads, target.max_context)
        methods.append(Method(label, peer=name, llamacpp=peer))
    return methods


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
    gen_kwargs.update(kwargs)
    # HF `generate` samples from the global RNG only: seed it inside a fork, which restores the
    # caller's RNG state afterwards.
    devices = [target.device] if target.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.inference_mode():
        torch.manual_seed(sampling.seed)
        t0 = time.perf_counter()
        out = target.model.generate(inp, **gen_kwargs)
        seconds = time.perf_counter() - t0
    return Run(seconds, out[0, len(ids):].tolist())


def make_peers(cfg: DictConfig, target: TargetModel, drafters: dict[str, Any]) -> list[Method]:
    """Hugging Face counterparts requested in bench.peers; a peer's arguments come from the first
    drafter of the run that declares it as its counterpart (`HFCounterpart.hf_peer_kwargs`)."""
    methods = []
    for name in bench_checks.names(cfg.bench.peers):
        if name not in PEERS:
            raise ValueError(f"unknown peer {name!r}; choose from {list(PEERS)}.")
        if name in LLAMACPP_PEERS:
            continue  # make_llamacpp_peers
        own = next((peer_kwargs(d) for d in drafters.values() if type(d).hf_counterpart == name), None)
        if name == "hf_generate":
            methods.append(Method(name, peer=name))
        elif name == "hf_prompt_lookup":
            for k in bench_checks.values(cfg.bench.hf_prompt_lookup_num_tokens):
                methods.append(Method(f"{name}[{k}]", peer=name,
                                      peer_kwargs={**(own or {}), "prompt_lookup_num_tokens": int(k)}))
        elif name == "hf_early_exit":
            kwargs = own or {"assistant_early_exit": int(cfg.bench.hf_early_exit_layer)}
            methods.append(Method(f"{name}[{kwargs['assistant_early_exit']}]", peer=name, peer_kwargs=kwargs))
        elif name == "hf_assisted":
            if own is None:
                print("[bench] hf_assisted skipped: no drafter in this run provides a draft model "
                      "(add draft_model to bench.drafters)", file=sys.stderr)
                continue
            methods.append(Method(name, peer=name, peer_kwargs=own))
    return methods


# ----------------------------------------------------------------------------- metrics
def verify_seconds_by_k(stats: list[GenerationStats]) -> dict[int, float]:
    """Measured mean seconds of a verify forward per number of draft tokens k, pooled over runs
    (reported, and the scale of the one verify-cost model: T_v(0) of the AR baseline)."""
    tot: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for s in stats:
        for k, (sec, n) in s.verify_s_by_k.items():
            tot[int(k)][0] += sec
            tot[int(k)][1] += n
    return {k: v[0] / v[1] for k, v in sorted(tot.items()) if v[1]}


def run_predicted_speedup(
    s: GenerationStats, curve: list[float], step_s: float, ar_step_s: float
) -> float | None:
    """`theory.predicted_speedup` of the K mix this run actually used, from its measured acceptance
    and drafting cost and the target's verify-cost model: T_v(k) = step_s * curve[k], where step_s
    is one AR step on this method's target and ar_step_s one step of the baseline it is compared
    with; both pay the same prefill."""
    if s.rounds == 0 or step_s <= 0 or ar_step_s <= 0:
        return None
    t_q = s.draft_s / s.drafted if s.drafted else 0.0
    mix = {int(k): n for k, (_, n) in s.verify_s_by_k.items()}
    t_v = [step_s * c for c in curve]
    return theory.predicted_speedup(s.acceptance_per_position, t_q, t_v, mix, s.prefill_s, ar_step_s)


def decode_tokens_per_s(runs: list[Run]) -> float | None:
    """Median over runs of the tokens produced after the prompt's forward per second spent there
    (None when the method does not split its time, e.g. Hugging Face generate)."""
    rates = [r.decode_tokens / r.decode_seconds for r in runs
             if r.decode_seconds and r.decode_tokens is not None and r.decode_seconds > 0]
    return statistics.median(rates) if rates else None


def texts_agree(a: str, b: str) -> bool:
    """Two outputs agree when the shorter is the start of the longer (llama-lookup may run past
    the token budget by a few tokens)."""
    return a.startswith(b) or b.startswith(a)


def summarize(
    method: Method, runs: list[Run], ar_runs: list[Run], step_s: dict[str, float],
    limit_tps: float | None = None, visible: Callable[[Run], str] | None = None,
) -> dict[str, Any]:
    """Median-based record of one method on one prompt; step_s: seconds of one AR step per
    baseline method (measured in this prompt's runs); limit_tps: the prompt's roofline AR tok/s
    (`specdraft.roofline`), None when not measured. A peer that prints text (llama.cpp) has no
    token ids to compare: its greedy_match is None, text_output true, and text_match says whether
    its text agrees with AR's (`texts_agree` of visible(run): the text without special tokens)."""
    med = statistics.median(r.seconds for r in runs)
    ar_med = statistics.median(r.seconds for r in ar_runs)
    tokens = runs[0].tokens
    ar_tokens = ar_runs[0].tokens
    tps = tokens / med if med > 0 else 0.0
    ar_tps = ar_tokens / ar_med if ar_med > 0 else 0.0
    decode_tps, ar_decode_tps = decode_tokens_per_s(runs), decode_tokens_per_s(ar_runs)
    rec: dict[str, Any] = {
        "method": method.name,
        "tokens": tokens,
        "seconds_median": med,
        "tokens_per_s": tps,
        "speedup": tps / ar_tps if ar_tps > 0 else None,
        "greedy_match": runs[0].token_ids == ar_runs[0].token_ids if runs[0].has_token_ids else None,
        "text_output": not runs[0].has_token_ids,
        "prefill_s": _median([r.prefill_seconds for r in runs]),
        "decode_tokens_per_s": decode_tps,
        "decode_speedup": decode_tps / ar_decode_tps if (decode_tps is not None and ar_decode_tps) else None,
        "roofline_fraction": decode_tps / limit_tps if (decode_tps is not None and limit_tps) else None,
    }
    if runs[0].text is not None:
        rec["output_text"] = runs[0].text
        rec["text_match"] = texts_agree(visible(runs[0]), visible(ar_runs[0])) if visible else None
    lookups = [r.lookup for r in runs if r.lookup is not None]
    if lookups:
        lk = lookups[len(lookups) // 2]
        rec.update(acceptance_rate=lk.acceptance_rate, drafted=lk.n_drafted, accepted=lk.n_accept,
                   draft_max=lk.n_draft)
    stats = [r.stats for r in runs if r.stats is not None]
    if stats and method.decoder is not None:
        s = stats[len(stats) // 2]
        max_k = max((int(k) for k in s.verify_s_by_k), default=0)
        curve = costs.verify_curve(method.decoder.target, max_k)
        t_q = s.draft_s / s.drafted if s.drafted else None
        ar_step = step_s.get(AR, 0.0)
        pred = run_predicted_speedup(s, curve, step_s.get(method.baseline, 0.0), ar_step)
        rec.update(
            acceptance_rate=s.acceptance_rate,
            acceptance_per_position=s.acceptance_per_position,
            mean_accepted_length=s.mean_accepted_length,
            rounds=s.rounds,
            cached_prompt_tokens=s.cached_prompt_tokens,
            draft_s=s.draft_s,
            verify_s=s.verify_s,
            overhead_s=s.overhead_s,
            overhead_fraction=s.overhead_fraction,
            c=(t_q / ar_step) if (t_q is not None and ar_step > 0) else None,
            verify_s_by_k={str(k): v for k, v in verify_seconds_by_k(stats).items()},
            verify_curve=curve,
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
    names = bench_checks.names(cfg.bench.drafters)
    drafter_cfgs = {drafter_label(n): drafter_config(n) for n in names} if names else {"drafter": cfg.drafter}
    targets = [("", target)]
    if cfg.bench.get("plain_stack") and target.fast:
        plain = TargetModel(target.model, target.tokenizer, target.eos_token_ids, fast=False)
        targets.append(("[plain]", plain))
        methods.append(Method(AR + "[plain]", decoder=make_decoder(cfg, plain, None), baseline=AR + "[plain]"))
    drafters = {}
    for suffix, tgt in targets:
        for name, dcfg in drafter_cfgs.items():
            drafter = make_drafter(dcfg)
            if drafter is None:
                continue
            label = (name if names else _drafter_label(cfg)) + suffix
            if not suffix:
                drafters[label] = drafter
            methods.append(Method(label, decoder=make_decoder(cfg, tgt, drafter, dcfg),
                                  hf_counterpart=type(drafter).hf_counterpart, baseline=AR + suffix))
    return methods + make_peers(cfg, target, drafters) + make_llamacpp_peers(cfg, target)


def _drafter_label(cfg: DictConfig) -> str:
    choice = HydraConfig.get().runtime.choices.get("drafter") if HydraConfig.initialized() else None
    # outside a Hydra run: the drafter's module name (drafters.ngram.NGramDrafter -> ngram)
    return str(choice or cfg.drafter.get("_target_", "drafter").rsplit(".", 2)[-2])


@dataclass(frozen=True)
class BenchPlan:
    """The prompts a checked configuration runs (`plan_bench`)."""

    prompts: list[SuitePrompt]


def plan_bench(cfg: DictConfig, out_dir: Path) -> BenchPlan:
    """Check everything that can be checked without the model's weights (settings, suite,
    categories, output folder, and every prompt's length with the target's tokenizer and context
    where `bench_checks.preview_target` can read them) and raise one ValueError naming every
    problem; else the prompts to run."""
    problems = bench_checks.setting_problems(cfg, PEERS, drafter_config, tuple(LLAMACPP_PEERS))
    problems += batch_bench.setting_problems(cfg)
    prompts, suite_problems = bench_checks.suite_problems(cfg)
    problems += suite_problems
    problems += bench_checks.output_problems(out_dir, OUTPUTS, bool(cfg.bench.get("overwrite", False)))
    preview, target_problems = bench_checks.preview_target(cfg.target)
    problems += target_problems
    if preview is not None and prompts:
        problems += bench_checks.context_problems(prompts, preview.tokenizer, preview.max_context,
                                                  _max_new_tokens(cfg))
    bench_checks.raise_problems(problems)
    return BenchPlan(prompts)


def _max_new_tokens(cfg: DictConfig) -> int | None:
    return cfg.max_new_tokens if bench_checks.is_int_at_least(cfg.max_new_tokens, 1) else None


@dataclass
class Progress:
    """How far a run got: generations done (warm-ups included) and prompts finished (each turn of
    a multi-turn prompt counts as a prompt)."""

    runs_total: int
    prompts_total: int
    runs_done: int = 0
    prompts_done: int = 0

    def sentence(self) -> str:
        return (f"{self.runs_done} of {self.runs_total} runs ({self.prompts_done} of "
                f"{self.prompts_total} prompts complete)")


def time_prompt(
    methods: list[Method], target: TargetModel, ids: Mapping[str, list[int]], max_new: int, sampling: Any,
    warmup: int, reps: int, on_run: Callable[[], None],
) -> dict[str, list[Run]]:
    """Every method's timed runs on one prompt (ids: each method's prompt tokens, by its name) after
    `warmup` untimed ones, the order rotating per repetition to cancel drift; on_run() is called
    after each generation. Then every drafter learns the prompt's first timed output once
    (`SpeculativeDecoder.learn`): a drafter that remembers requests (suffix decoding) sees each
    prompt's output only on the prompts after it, never in a repetition of the same prompt."""
    runs: dict[str, list[Run]] = defaultdict(list)
    for rep in range(warmup + reps):
        shift = rep % len(methods)
        for method in methods[shift:] + methods[:shift]:  # rotate to cancel drift
            run = method.run(target, ids[method.name], max_new, sampling)
            if rep >= warmup:
                runs[method.name].append(run)
            on_run()
    for method in methods:
        if method.decoder is not None and runs[method.name]:
            method.memory = method.decoder.learn(ids[method.name], runs[method.name][0].token_ids)
    return runs


def run_turns(
    methods: list[Method], target: TargetModel, prompt: SuitePrompt, max_new: int, sampling: Any,
    warmup: int, reps: int, on_run: Callable[[], None],
) -> Iterator[tuple[int, dict[str, list[int]], dict[str, list[Run]]]]:
    """(turn, each method's prompt tokens, `time_prompt`'s runs) for every turn of one prompt (one
    turn unless it has `turns`): each method answers each turn on its own conversation so far, its
    earlier answers (`answer_text` of its first timed run) appended as assistant messages."""
    answers: dict[str, list[str]] = {m.name: [] for m in methods}
    visible = visible_text(target.tokenizer)
    for turn in range(1, prompt.num_turns + 1):
        ids = {m.name: prompt.token_ids(target.tokenizer, answers[m.name]) for m in methods}
        runs = time_prompt(methods, target, ids, max_new, sampling, warmup, reps, on_run)
        yield turn, ids, runs
        for m in methods:
            answers[m.name].append(answer_text(runs[m.name][0], visible, target.tokenizer, max_new))


def answer_text(run: Run, visible: Callable[[Run], str], tokenizer: Any, max_new: int) -> str:
    """A run's output as the assistant message of the next turn: its text without special tokens;
    a text peer's cut to the token budget (llama-lookup may pass it by a few tokens), so that under
    greedy decoding its next turn sees AR's conversation."""
    text = visible(run)
    if run.has_token_ids:
        return text
    ids = tokenizer.encode(text, add_special_tokens=False)
    return text if len(ids) <= max_new else tokenizer.decode(ids[:max_new])


def prompt_records(
    methods: list[Method], runs: dict[str, list[Run]], prompt: SuitePrompt, greedy: bool,
    limit: dict[str, Any] | None = None, visible: Callable[[Run], str] | None = None,
    turn: int = 1, ids: Mapping[str, list[int]] | None = None,
) -> list[dict[str, Any]]:
    """One record per method for one turn of a prompt (`prompt.turn_id(turn)`); a greedy output
    that differs from AR's is reported. limit: the prompt's physical limit (`prompt_limit`), None
    when not measured; visible: a run's output as text without special tokens (`visible_text`),
    for peers that print text; ids: each method's prompt tokens (their count is recorded)."""
    step_s = {m.name: verify_seconds_by_k([r.stats for r in runs[m.name] if r.stats]).get(0, 0.0)
              for m in methods if m.name == m.baseline}
    limit_tps = limit["roofline_tokens_per_s"] if limit else None
    records = []
    for method in methods:
        rec = summarize(method, runs[method.name], runs[AR], step_s, limit_tps, visible)
        rec.update(prompt=prompt.turn_id(turn), category=prompt.category, turn=turn,
                   hf_counterpart=method.hf_counterpart, llamacpp_counterpart=LLAMACPP_COUNTERPARTS.get(method.name))
        if ids is not None:
            rec["prompt_tokens"] = len(ids[method.name])
        if limit:
            rec["roofline"] = limit
        if not greedy:  # sampled outputs differ by design: there is nothing to compare
            rec["greedy_match"] = None
            if "text_match" in rec:
                rec["text_match"] = None
        if greedy and rec["greedy_match"] is False:
            print(f"\n!!! GREEDY MISMATCH: {method.name} on {rec['prompt']} differs from the "
                  "autoregressive output !!!", file=sys.stderr)
        records.append(rec)
    return records


def measure_bandwidth(cfg: DictConfig, target: TargetModel) -> dict[str, Any] | None:
    """The read bandwidth of the target's device with the bench's threads, measured once before
    any prompt (`roofline.measure_read_bandwidth`); None when bench.bandwidth_bytes is 0."""
    nbytes = int(cfg.bench.bandwidth_bytes)
    if nbytes == 0:
        return None
    threads = torch.get_num_threads()
    bandwidth = roofline.measure_read_bandwidth(threads, nbytes, device=target.device)
    return {"read_bytes_per_s": bandwidth, "buffer_bytes": nbytes, "threads": threads,
            "device": str(target.device)}


def visible_text(tokenizer: Any) -> Callable[[Run], str]:
    """A run's output as text without special tokens: decoded token ids, or a text peer's output
    with the tokenizer's special tokens removed (llama-lookup prints the end-of-turn token)."""
    specials = [t for t in getattr(tokenizer, "all_special_tokens", []) if t]

    def visible(run: Run) -> str:
        if run.text is None:
            return tokenizer.decode(run.token_ids, skip_special_tokens=True)
        text = run.text
        for token in specials:
            text = text.replace(token, "")
        return text

    return visible


def prompt_limit(target: TargetModel, bandwidth: float, context: int) -> dict[str, Any]:
    """Bytes per decode step at `context` cached positions and the roofline AR tok/s they allow."""
    step = roofline.step_bytes(target, context)
    return {**step, "roofline_tokens_per_s": bandwidth / step["total"]}


def run_bench(cfg: DictConfig, out_dir: Path, plan: BenchPlan | None = None) -> dict[str, Any]:
    """Run the whole comparison and write results.json / results.md / plots into out_dir.

    plan: from `plan_bench` (checked here when not given). Every generation starts from the same
    state (each `generate` builds a fresh K policy), so warm-ups and the rotation order change no
    prompt's K choices. Process-wide settings (threads) are the caller's: `main` sets them from
    the config. On Ctrl-C or an error during the runs, the finished prompts are written (marked
    partial), the message says how far it got, and the exception goes on."""
    plan = plan or plan_bench(cfg, out_dir)
    load_before, clock = machine_load.load_average(), machine_load.CpuClock.now()
    target = instantiate(cfg.target)
    # the loaded target is the authority (and the only source for loaders preview_target cannot read)
    bench_checks.raise_problems(bench_checks.context_problems(
        plan.prompts, target.tokenizer, target.max_context, int(cfg.max_new_tokens)))
    methods = build_methods(cfg, target)
    curve_tokens = max([int(cfg.max_draft_tokens)]
                       + [m.decoder.drafter.verify_curve_tokens for m in methods if m.decoder and m.decoder.drafter])
    for tgt in {id(m.decoder.target): m.decoder.target for m in methods if m.decoder}.values():
        costs.verify_curve(tgt, curve_tokens)  # the one verify-cost model, measured before any timing
    sampling = methods[0].decoder.sampling  # type: ignore[union-attr]
    bandwidth = measure_bandwidth(cfg, target)
    visible = visible_text(target.tokenizer) if target.tokenizer is not None else None
    reps, warmup = int(cfg.bench.repetitions), int(cfg.bench.warmup)
    turns = sum(p.num_turns for p in plan.prompts)
    progress = Progress(turns * (reps + warmup) * len(methods), turns)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in OUTPUTS:  # an earlier run's files (bench.overwrite=true): none may look like this run's
        (out_dir / name).unlink(missing_ok=True)
    records: list[dict[str, Any]] = []

    def write(partial: bool) -> dict[str, Any]:
        machine = machine_load.MachineLoad.since(clock, load_before, torch.get_num_threads())
        result = make_result(cfg, records, sampling.greedy, progress, machine, partial, bandwidth)
        result["drafter_memory"] = {m.name: m.memory for m in methods if m.memory}
        write_text_atomically(out_dir / "results.json", json.dumps(result, indent=1, default=str))
        write_text_atomically(out_dir / "results.md", render_markdown(result))
        return result

    bar = tqdm(total=progress.runs_total, desc="bench", disable=not cfg.bench.progress)

    def on_run() -> None:
        progress.runs_done += 1
        bar.update(1)

    try:
        for prompt in plan.prompts:
            max_new = prompt.max_new_tokens or int(cfg.max_new_tokens)
            for turn, ids, runs in run_turns(methods, target, prompt, max_new, sampling, warmup, reps, on_run):
                mean_context = len(ids[AR]) + runs[AR][0].tokens // 2  # the KV cache's mean length while decoding
                limit = prompt_limit(target, bandwidth["read_bytes_per_s"], mean_context) if bandwidth else None
                records.extend(prompt_records(methods, runs, prompt, sampling.greedy, limit, visible, turn, ids))
                progress.prompts_done += 1
                write(partial=True)  # after every prompt (turn): a killed run keeps what it did
    except (KeyboardInterrupt, Exception) as err:
        bar.close()
        how = "interrupted" if isinstance(err, KeyboardInterrupt) else f"stopped by {type(err).__name__}"
        try:
            write(partial=True)
            print(f"[bench] {how} after {progress.sentence()}; partial results in {out_dir}",
                  file=sys.stderr)
        except OSError as write_err:
            print(f"[bench] {how} after {progress.sentence()}; the partial results could not be written "
                  f"to {out_dir}: {write_err}", file=sys.stderr)
        raise
    bar.close()
    result = write(partial=False)
    if cfg.bench.plots:
        write_plots(result, out_dir)
    if batch_bench.batch_sizes(cfg):  # the batch-size sweep: batch_results.json, its section of results.md
        sweep = batch_bench.run_sweep(cfg, target, methods, plan.prompts, out_dir, AR, curve_tokens)
        write_text_atomically(out_dir / "results.md",
                              render_markdown(result) + "\n" + batch_bench.render_markdown(sweep))
    return result


def make_result(
    cfg: DictConfig, records: list[dict[str, Any]], greedy: bool, progress: Progress,
    machine: machine_load.MachineLoad, partial: bool, bandwidth: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The results.json object of the records so far; bandwidth: `measure_bandwidth`'s record."""
    return {
        "config": OmegaConf.to_container(cfg, resolve=True),
        "partial": partial,
        "progress": {"runs_done": progress.runs_done, "runs_total": progress.runs_total,
                     "prompts_done": progress.prompts_done, "prompts_total": progress.prompts_total},
        "machine": machine.to_json(),
        "records": records,
        "summary": aggregate(records),
        "summary_by_turn": aggregate_by_turn(records),
        "peer_ratios": peer_ratios(records),
        "roofline": roofline_summary(records, bandwidth),
        "greedy_mismatches": [(r["method"], r["prompt"]) for r in records if greedy and r["greedy_match"] is False],
    }


# ----------------------------------------------------------------------------- tables
def _median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def aggregate(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{category or "overall": {method: medians over prompts}} (every turn of a multi-turn prompt
    counts as a prompt)."""
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
            "decode_speedup": _median([r.get("decode_speedup") for r in rs]),
            "prefill_s": _median([r.get("prefill_s") for r in rs]),
            "prompt_tokens": _median([r.get("prompt_tokens") for r in rs]),
            "acceptance_rate": _median([r.get("acceptance_rate") for r in rs]),
            "mean_accepted_length": _median([r.get("mean_accepted_length") for r in rs]),
            "efficiency": _median([r.get("efficiency") for r in rs]),
            "overhead_fraction": _median([r.get("overhead_fraction") for r in rs]),
            "greedy_match": None if any(r["greedy_match"] is None for r in rs) else all(
                r["greedy_match"] for r in rs),
            "text_output": any(r.get("text_output") for r in rs),
            "text_match": None if any(r.get("text_match") is None for r in rs) else all(
                r["text_match"] for r in rs),
            "decode_tokens_per_s": _median([r.get("decode_tokens_per_s") for r in rs]),
            "roofline_fraction": _median([r.get("roofline_fraction") for r in rs]),
        }
    return dict(out)


def aggregate_by_turn(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """{category or "overall": {turn: {method: medians over prompts}}} for the categories that hold
    multi-turn prompts, and overall when there are any (later turns answer longer conversations);
    empty when every prompt has one turn."""
    multi = sorted({r["category"] for r in records if r.get("turn", 1) > 1})
    out = {}
    for cat in ["overall", *multi] if multi else []:
        rs = [r for r in records if cat in ("overall", r["category"])]
        turns = sorted({r.get("turn", 1) for r in rs})
        out[cat] = {str(t): aggregate([r for r in rs if r.get("turn", 1) == t])["overall"] for t in turns}
    return out


def roofline_summary(records: list[dict[str, Any]], bandwidth: dict[str, Any] | None) -> dict[str, Any] | None:
    """The measured bandwidth and the medians over prompts of the bytes per decode step and the
    roofline AR tok/s (None when the bandwidth was not measured)."""
    if bandwidth is None:
        return None
    limits = list({r["prompt"]: r["roofline"] for r in records if r.get("roofline")}.values())
    keys = ("weights", "embedding_row", "kv_cache", "total", "context", "roofline_tokens_per_s")
    return {**bandwidth, "prompts": len(limits), "dtype": limits[0]["dtype"] if limits else None,
            **{k: _median([lim[k] for lim in limits]) for k in keys}}


COUNTERPART_KEYS = ("hf_counterpart", "llamacpp_counterpart")  # record fields naming a method's peers


def peer_ratios(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ours vs each declared counterpart (best variant): the drafter's Hugging Face counterpart
    and the llama.cpp peer of LLAMACPP_COUNTERPARTS; median over prompts of our tok/s divided by
    the peer's tok/s on the same prompt."""
    by_prompt: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in records:
        by_prompt[r["prompt"]][r["method"]] = r
    methods = list(dict.fromkeys(r["method"] for r in records))
    pairs = list(dict.fromkeys((r["method"], r[key]) for key in COUNTERPART_KEYS for r in records if r.get(key)))
    out = []
    for name, peer in pairs:
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


def _times(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _match(greedy_match: bool | None, text_output: bool = False, text_match: bool | None = None) -> str:
    """The "greedy = AR" cell: n/a when sampling (outputs are not expected to be equal); for a
    peer that prints text instead of token ids (llama.cpp), whether its text agrees with AR's."""
    if text_output and text_match is not None:
        return "same text" if text_match else "other text"
    return "n/a (sampled)" if greedy_match is None else ("yes" if greedy_match else "NO")


# The columns of every summary table: (header, the cell of one method's medians).
SUMMARY_COLUMNS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("speedup vs AR", lambda m: _times(m["speedup"])),
    ("tok/s", lambda m: _fmt(m["tokens_per_s"], ".1f")),
    ("decode speedup vs AR", lambda m: _times(m.get("decode_speedup"))),
    ("decode tok/s", lambda m: _fmt(m.get("decode_tokens_per_s"), ".1f")),
    ("prefill ms", lambda m: _fmt(None if m.get("prefill_s") is None else m["prefill_s"] * 1e3, ".1f")),
    ("acceptance", lambda m: _fmt(m["acceptance_rate"])),
    ("mean accepted length", lambda m: _fmt(m["mean_accepted_length"])),
    ("efficiency", lambda m: _fmt(m["efficiency"])),
    ("overhead", lambda m: _fmt(m["overhead_fraction"], ".1%")),
    ("greedy = AR", lambda m: _match(m["greedy_match"], m.get("text_output", False), m.get("text_match"))),
)


def _table(first: list[str], rows: list[tuple[list[str], dict[str, Any]]]) -> list[str]:
    """A markdown table: the `first` columns, then SUMMARY_COLUMNS; rows: (first cells, medians)."""
    headers = first + [h for h, _ in SUMMARY_COLUMNS]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cells + [cell(m) for _, cell in SUMMARY_COLUMNS]) + " |" for cells, m in rows]
    return lines + [""]


def render_markdown(result: dict[str, Any]) -> str:
    lines = []
    cfg = result["config"]
    lines.append(f"# specdraft bench: {cfg['target'].get('name_or_path', 'target')}, "
                 f"suite {cfg['suite'].get('name') or cfg['suite'].get('path')}, "
                 f"num_draft_tokens={cfg['num_draft_tokens']}, max_new_tokens={cfg['max_new_tokens']}\n")
    if result.get("partial"):
        p = result["progress"]
        lines.append(f"**PARTIAL:** {p['prompts_done']} of {p['prompts_total']} prompts complete "
                     f"({p['runs_done']} of {p['runs_total']} runs); the tables hold the complete prompts only.\n")
    machine = result.get("machine", {})
    if "cpu" in machine:
        lines.append(f"Machine: {machine['cpu']}, {machine['threads']} torch threads on {machine['cpu_count']} cores.\n")
    for warning in machine.get("warnings", []):
        lines.append(f"**warning:** {warning}\n")
    if not result["summary"]:
        lines.append("No prompt completed.\n")
    by_turn = result.get("summary_by_turn") or {}
    for cat in sorted(result["summary"], key=lambda c: (c != "overall", c)):
        lines.append(f"## {cat}\n")
        lines += _table(["method"], [([method], m) for method, m in result["summary"][cat].items()])
        if cat in by_turn:
            lines.append(f"### {cat}, per turn\n")
            lines += _table(["turn", "method", "prompt tokens"], [
                ([turn, method, _fmt(m.get("prompt_tokens"), ".0f")], m)
                for turn, methods in by_turn[cat].items() for method, m in methods.items()])
    if result["peer_ratios"]:
        lines.append("## ours vs peer: Hugging Face and llama.cpp counterparts (median tok/s ratio)\n")
        lines.append("| ours | peer | ratio | prompts |")
        lines.append("|---|---|---|---|")
        for r in result["peer_ratios"]:
            lines.append(f"| {r['method']} | {r['peer']} | {_fmt(r['ratio'])}x | {r['prompts']} |")
        lines.append("")
    lines += roofline_markdown(result)
    if result.get("drafter_memory"):
        lines.append("## what drafters keep across requests (after the last prompt)\n")
        lines.append("| method | tokens | budget (tokens) | requests | estimated bytes | corpus tokens | corpus budget | corpus bytes |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for method, mem in result["drafter_memory"].items():
            lines.append(f"| {method} | {mem.get('tokens')} | {mem.get('budget_tokens')} | {mem.get('requests')} "
                         f"| {mem.get('bytes')} | {mem.get('corpus_tokens', 0)} | {mem.get('corpus_budget_tokens', '-')} "
                         f"| {mem.get('corpus_bytes', 0)} |")
        lines.append("")
    if result["greedy_mismatches"]:
        lines.append(f"**GREEDY MISMATCHES:** {result['greedy_mismatches']}\n")
    return "\n".join(lines)


def roofline_markdown(result: dict[str, Any]) -> list[str]:
    """The physical-limit section: bandwidth, bytes per step, roofline tok/s, decode tok/s per method."""
    limit = result.get("roofline")
    if not limit or not limit.get("prompts"):
        return []
    mb = 1e6
    lines = [
        "## physical limit: decode tok/s vs the memory-bandwidth roofline\n",
        (f"Read bandwidth {limit['read_bytes_per_s'] / 1e9:.1f} GB/s (measured in this run on {limit['device']}, "
         f"{limit['threads']} threads). Bytes per decode step ({limit['dtype']}, median over "
         f"{limit['prompts']} prompts): weights {limit['weights'] / mb:.1f} MB + embedding row "
         f"{limit['embedding_row'] / mb:.3f} MB + KV cache {limit['kv_cache'] / mb:.1f} MB at the mean context of "
         f"{limit['context']:.0f} positions = {limit['total'] / mb:.1f} MB: roofline AR decode "
         f"{limit['roofline_tokens_per_s']:.1f} tok/s. A speculative method (several tokens per forward) "
         "or one that reads fewer bytes (llamacpp_q4) can exceed 1.\n"),
        "| method | decode tok/s | fraction of the roofline |",
        "|---|---|---|",
    ]
    for method, m in result["summary"].get("overall", {}).items():
        lines.append(f"| {method} | {_fmt(m.get('decode_tokens_per_s'), '.1f')} | {_fmt(m.get('roofline_fraction'))} |")
    lines.append("")
    return lines


@hydra_cli("bench")
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    plan = plan_bench(cfg, out_dir)  # every problem at once, before any model loads
    if cfg.bench.threads:
        torch.set_num_threads(int(cfg.bench.threads))
    result = run_bench(cfg, out_dir, plan)
    md = render_markdown(result)
    overall = md.split("\n## ")[1]  # the overall table (the first section)
    print("\n## " + overall)
    for warning in result["machine"]["warnings"]:
        print(f"[bench] warning: {warning}")
    print(f"[bench] results in {out_dir}")
