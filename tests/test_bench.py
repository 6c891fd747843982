"""The bench reads declared capabilities (hf_counterpart, HFCounterpart.hf_peer_kwargs), leaves the
process's RNG alone, and predicts speedups with the one verify-cost model and theory's formula; it
checks settings and prompts before any model loads, keeps the finished prompts of a stopped run,
never overwrites an earlier run silently, and says when it was not alone on the machine."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose
from omegaconf import DictConfig, OmegaConf
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast

from drafters.early_exit import EarlyExitDrafter
from drafters.ngram import NGramDrafter
from specdraft import bench, bench_checks, models, theory
from specdraft.machine_load import CpuClock, MachineLoad, load_warnings, machine_busy_seconds, others_cores
from specdraft.models import tiny_random_llama, tiny_random_target
from specdraft.sampling import SamplingConfig
from specdraft.stats import GenerationStats
from specdraft.suites import SuitePrompt, load_suite

PEERS = {"peers": ["hf_generate", "hf_prompt_lookup", "hf_early_exit", "hf_assisted"],
         "hf_prompt_lookup_num_tokens": [3, 5], "hf_early_exit_layer": 6}


def peer_names(drafters: dict[str, Any]) -> dict[str, dict[str, Any]]:
    cfg = OmegaConf.create({"bench": PEERS})
    return {m.name: m.peer_kwargs for m in bench.make_peers(cfg, tiny_random_target(), drafters)}


def test_peer_arguments_come_from_the_declared_counterpart(capsys: pytest.CaptureFixture[str]) -> None:
    assert peer_names({"ngram": NGramDrafter()}) == {
        "hf_generate": {}, "hf_prompt_lookup[3]": {"prompt_lookup_num_tokens": 3},
        "hf_prompt_lookup[5]": {"prompt_lookup_num_tokens": 5}, "hf_early_exit[6]": {"assistant_early_exit": 6},
    }  # no drafter provides a draft model: hf_assisted is skipped, and says so
    assert "hf_assisted skipped" in capsys.readouterr().err
    # the early-exit drafter gives its exit layer to its counterpart
    assert peer_names({"exit": EarlyExitDrafter(exit_layer=2, adapter=None)})["hf_early_exit[2]"] == {
        "assistant_early_exit": 2}
    with pytest.raises(ValueError, match="unknown peer"):
        bench.make_peers(OmegaConf.create({"bench": {"peers": ["vllm"]}}), tiny_random_target(), {})


def test_peer_ratios_pair_each_method_with_its_declared_counterpart() -> None:
    rows = [("p1", "ngram", "hf_prompt_lookup", 20.0), ("p1", "hf_prompt_lookup[3]", None, 10.0),
            ("p1", "hf_prompt_lookup[5]", None, 8.0), ("p1", "medusa", None, 30.0)]
    records = [{"prompt": p, "method": m, "hf_counterpart": c, "tokens_per_s": t} for p, m, c, t in rows]
    assert bench.peer_ratios(records) == [
        {"method": "ngram", "peer": "hf_prompt_lookup[3]", "ratio": 2.0, "prompts": 1}]


def test_a_sampled_peer_leaves_the_global_rng_as_it_was() -> None:
    target = tiny_random_target(vocab_size=16)
    before = torch.random.get_rng_state()
    run = bench.run_peer(target, [1, 2, 3], 4, SamplingConfig(temperature=1.0, seed=3), {})
    assert torch.equal(torch.random.get_rng_state(), before) and len(run.token_ids) == 4
    again = bench.run_peer(target, [1, 2, 3], 4, SamplingConfig(temperature=1.0, seed=3), {})
    assert again.token_ids == run.token_ids  # seeded from the sampling config


def test_predicted_speedup_uses_the_curve_and_theory() -> None:
    stats = GenerationStats(prefill_s=0.1)
    for k, accepted in ((3, 2), (3, 3), (0, 0), (4, 1)):
        stats.record_round(k, accepted, accepted + 1, draft_s=0.03 * k / 10, verify_s=0.05)
    assert stats.drafted == 10  # so T_q = 3 ms per drafted token
    curve = [1.0, 1.05, 1.1, 1.2, 1.4]
    got = bench.run_predicted_speedup(stats, curve, step_s=0.04, ar_step_s=0.05)
    t_v = [0.04 * c for c in curve]
    want = theory.predicted_speedup(stats.acceptance_per_position, 0.003, t_v, {3: 2, 0: 1, 4: 1}, 0.1, 0.05)
    assert got == pytest.approx(want)
    assert bench.run_predicted_speedup(GenerationStats(), curve, 0.04, 0.05) is None  # nothing ran


# ----------------------------------------------------------------------------- checks before any model
WORDS = ["<unk>", "hello", "world", "copy", "this"]


@pytest.fixture
def word_tokenizer_dir(tmp_path: Path) -> Path:
    """A word-level tokenizer and a tiny Llama config in a directory (loads in milliseconds)."""
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    folder = tmp_path / "tok"
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>").save_pretrained(folder)
    tiny_random_llama(vocab_size=16).config.save_pretrained(folder)
    return folder


def write_suite(path: Path, words_per_prompt: list[int]) -> Path:
    """Raw prompts of the given lengths in words (= tokens), categories a, b, a, b, ..."""
    lines = [json.dumps({"id": f"p{i + 1}", "category": "ab"[i % 2], "prompt": " ".join(["hello"] * n)})
             for i, n in enumerate(words_per_prompt)]
    path.write_text("\n".join(lines) + "\n")
    return path


def bench_cfg(tok_dir: Path, suite: Path, *overrides: str) -> DictConfig:
    """The bench config on the tiny random target with a 64-position context (hydra_conf active)."""
    return compose("bench", overrides=[
        "target=tiny_random", "target.vocab_size=16", f"target.tokenizer={tok_dir}",
        "target.max_position_embeddings=64", "suite=file", f"suite.path={suite}", "max_new_tokens=4",
        "num_draft_tokens=2", "bench.repetitions=1", "bench.warmup=0", "bench.plots=false",
        "bench.progress=false", "bench.bandwidth_bytes=1048576", *overrides])


@pytest.fixture
def model_loads(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Records every load of the tiny target's model (the config's _target_ is looked up at call time)."""
    calls: list[dict[str, Any]] = []
    real = models.tiny_random_target

    def recording(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(models, "tiny_random_target", recording)
    return calls


@pytest.fixture
def generations(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Counts the bench's generations and raises `state["raise"]` on generation number `state["at"]`."""
    state: dict[str, Any] = {"count": 0, "at": None, "raise": None}
    real = bench.Method.run

    def counted(self: bench.Method, *args: Any) -> bench.Run:
        state["count"] += 1
        if state["count"] == state["at"]:
            raise state["raise"]
        return real(self, *args)

    monkeypatch.setattr(bench.Method, "run", counted)
    return state


def test_too_long_prompts_are_all_reported_before_the_model_loads(
    hydra_conf: None, tmp_path: Path, word_tokenizer_dir: Path, model_loads: list[Any]
) -> None:
    suite = write_suite(tmp_path / "s.jsonl", [5, 61, 3, 70])
    with pytest.raises(ValueError) as err:
        bench.run_bench(bench_cfg(word_tokenizer_dir, suite), tmp_path / "out")
    message = str(err.value)
    assert "2 problems" in message and "'p1'" not in message and "'p3'" not in message
    assert "prompt 'p2' (b): 61 prompt tokens + 4 new tokens = 65, beyond the target's context of 64" in message
    assert "prompt 'p4' (b): 70 prompt tokens + 4 new tokens = 74" in message
    assert model_loads == [] and not (tmp_path / "out").exists()


def test_every_bad_setting_is_reported_at_once(
    hydra_conf: None, tmp_path: Path, word_tokenizer_dir: Path, model_loads: list[Any]
) -> None:
    suite = write_suite(tmp_path / "s.jsonl", [5, 5])
    cfg = bench_cfg(word_tokenizer_dir, suite, "bench.repetitions=0", "bench.warmup=-1", "max_new_tokens=0",
                    "bench.limit=0", "bench.threads=two", "bench.peers=[hf_prompt_lookup,vllm]",
                    "bench.hf_prompt_lookup_num_tokens=[3,0]",
                    "bench.drafters=[ngram,nodrafter]", "bench.categories=[a,c]",
                    "num_draft_tokens=many", "max_draft_tokens=-1", "prefix_cache_tokens=-5")
    with pytest.raises(ValueError) as err:
        bench.plan_bench(cfg, tmp_path / "out")
    message = str(err.value)
    for sentence in ("bench.repetitions=0 must be an integer >= 1", "bench.warmup=-1 must be an integer >= 0",
                     "max_new_tokens=0 must be an integer >= 1", "bench.limit=0 must be an integer >= 1",
                     "bench.threads='two' must be an integer >= 1", "unknown peer(s) 'vllm' in bench.peers",
                     "bench.hf_prompt_lookup_num_tokens=0 must be an integer >= 1",
                     "bench.drafters: unknown drafter config 'nodrafter'",
                     "unknown category 'c' in bench.categories; suite", "has a, b.",
                     "num_draft_tokens must be an integer >= 0", "max_draft_tokens must be an integer >= 0",
                     "prefix_cache_tokens must be an integer >= 0 (0 = no prefix caching), got -5"):
        assert sentence in message, sentence
    assert "12 problems" in message and model_loads == []
    missing = bench_cfg(word_tokenizer_dir, tmp_path / "nope.jsonl", "bench.warmup=-1")
    with pytest.raises(ValueError, match="(?s)2 problems.*warmup=-1.*neither a built-in suite"):
        bench.plan_bench(missing, tmp_path / "out")


def test_a_target_whose_context_is_unknown_is_checked_before_any_generation(
    hydra_conf: None, tmp_path: Path, word_tokenizer_dir: Path, generations: dict[str, Any]
) -> None:
    suite = write_suite(tmp_path / "s.jsonl", [5, 300])  # beyond the tiny Llama's default 256 positions
    cfg = bench_cfg(word_tokenizer_dir, suite, "~target.max_position_embeddings")
    assert bench_checks.preview_target(cfg.target) == (None, [])
    with pytest.raises(ValueError, match="prompt 'p2' .* beyond the target's context of 256"):
        bench.run_bench(cfg, tmp_path / "out")
    assert generations["count"] == 0


@pytest.mark.parametrize("error", [RuntimeError("injected"), KeyboardInterrupt()], ids=["error", "ctrl-c"])
def test_a_run_stopped_after_prompt_1_keeps_prompt_1(
    hydra_conf: None, tmp_path: Path, word_tokenizer_dir: Path, generations: dict[str, Any],
    capsys: pytest.CaptureFixture[str], error: BaseException,
) -> None:
    suite = write_suite(tmp_path / "s.jsonl", [5, 6])
    generations.update(at=3, **{"raise": error})  # AR and ngram ran prompt 1; the first run of prompt 2 fails
    out = tmp_path / "out"
    with pytest.raises(type(error)):
        bench.run_bench(bench_cfg(word_tokenizer_dir, suite), out)
    result = json.loads((out / "results.json").read_text())
    assert result["partial"] is True and {r["prompt"] for r in result["records"]} == {"p1"}
    assert {r["method"] for r in result["records"]} == {"autoregressive", "ngram"}
    assert result["progress"] == {"runs_done": 2, "runs_total": 4, "prompts_done": 1, "prompts_total": 2}
    assert "**PARTIAL:** 1 of 2 prompts complete (2 of 4 runs)" in (out / "results.md").read_text()
    how = "interrupted" if isinstance(error, KeyboardInterrupt) else "stopped by RuntimeError"
    assert f"[bench] {how} after 2 of 4 runs (1 of 2 prompts complete); partial results in {out}" in (
        capsys.readouterr().err)


def test_a_finished_run_is_complete_and_never_overwritten_silently(
    hydra_conf: None, tmp_path: Path, word_tokenizer_dir: Path
) -> None:
    suite = write_suite(tmp_path / "s.jsonl", [5, 6])
    out = tmp_path / "out"
    result = bench.run_bench(bench_cfg(word_tokenizer_dir, suite, "drafter=none"), out)
    assert result["partial"] is False and json.loads((out / "results.json").read_text())["partial"] is False
    assert result["progress"]["runs_done"] == 2 and {r["prompt"] for r in result["records"]} == {"p1", "p2"}
    assert set(result["machine"]) == {"cpu_count", "threads", "load_before", "load_after", "others_during", "cpu",
                                      "warnings"}
    assert "Machine: " + result["machine"]["cpu"] in (out / "results.md").read_text()
    assert not list(out.glob(".*.tmp"))  # every write was renamed into place
    with pytest.raises(ValueError, match="already holds results.json, results.md from an earlier run; pass "
                                         "bench.overwrite=true"):
        bench.plan_bench(bench_cfg(word_tokenizer_dir, suite), out)
    assert bench.plan_bench(bench_cfg(word_tokenizer_dir, suite, "bench.overwrite=true"), out).prompts


def test_limit_and_categories_select_in_suite_order(tmp_path: Path) -> None:
    prompts = load_suite(write_suite(tmp_path / "s.jsonl", [1, 2, 3, 4, 5]))
    assert [p.id for p in bench_checks.select_prompts(prompts, [], 2)] == ["p1", "p2", "p3", "p4"]
    assert [p.id for p in bench_checks.select_prompts(prompts, ["b"], None)] == ["p2", "p4"]
    assert bench_checks.names("qa") == ["qa"] and bench_checks.names(None) == []  # bench.categories=qa
    assert bench_checks.values(OmegaConf.create({"k": [3, 5]}).k) == [3, 5]


# ----------------------------------------------------------------------------- was the bench alone?
def test_no_warning_on_an_idle_machine_or_when_others_use_spare_cores() -> None:
    assert load_warnings(threads=2, cpu_count=2, load_before=0.1, load_after=2.2) == []
    assert load_warnings(threads=4, cpu_count=16, load_before=4.0, load_after=8.0) == []  # 8 of 16 cores
    assert load_warnings(threads=2, cpu_count=2, load_before=None, load_after=None) == []  # no load average


def test_competing_processes_are_reported_from_either_load_average() -> None:
    before = load_warnings(threads=2, cpu_count=2, load_before=2.0, load_after=2.5)  # busy when it started
    assert len(before) == 1 and "other processes competed for the cores: their load was about 2.0" in before[0]
    assert "before 2.00, after 2.50" in before[0] and "the bench ran 2 threads on 2 cores" in before[0]
    after = load_warnings(threads=2, cpu_count=2, load_before=0.0, load_after=3.9)  # another started later
    assert len(after) == 1 and "their load was about 1.9" in after[0]


def test_a_measured_share_of_other_processes_decides_over_a_stale_load_average() -> None:
    """The load average still holds the bench's own earlier work (a sweep after the per-prompt runs):
    where the other processes' CPU time was measured, that decides."""
    assert load_warnings(threads=2, cpu_count=2, load_before=2.0, load_after=2.0, others_during=0.05) == []
    (warning,) = load_warnings(threads=2, cpu_count=2, load_before=0.0, load_after=2.0, others_during=0.9)
    assert "their load was about 0.9 (measured: the machine's busy CPU time during the run minus the bench's own)" in warning


def test_others_cores_is_the_machine_busy_time_not_spent_by_this_process(tmp_path: Path) -> None:
    start = CpuClock(wall_s=10.0, machine_busy_s=100.0, own_s=5.0)
    assert others_cores(start, CpuClock(14.0, 108.0, 11.0)) == pytest.approx(0.5)  # 8 busy s, 6 our own, in 4 s
    assert others_cores(start, CpuClock(14.0, 106.0, 11.5)) == 0.0  # clock granularity: never below zero
    assert others_cores(start, CpuClock(14.0, None, 11.0)) is None and others_cores(start, start) is None
    clk = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"  # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(f"cpu  {3 * clk} {clk} {clk} {50 * clk} {7 * clk} 0 {clk} {2 * clk} 0 0\ncpu0 1 2 3\n")
    assert machine_busy_seconds(stat) == pytest.approx(8.0)  # idle and iowait are not busy; steal is
    assert machine_busy_seconds(tmp_path / "missing") is None
    stat.write_text("garbage\n")
    assert machine_busy_seconds(stat) is None


def test_this_process_cpu_time_is_its_own_not_another_process() -> None:
    """Half a CPU second of spinning here shows up in the own clock and the machine's (whatever else
    the machine runs: the spin counts this process's CPU time, not wall time, which a busy machine
    stretches)."""
    if machine_busy_seconds() is None:
        pytest.skip("no /proc/stat on this platform")
    start = CpuClock.now()
    end = time.process_time() + 0.5
    while time.process_time() < end:
        pass
    now = CpuClock.now()
    assert now.own_s - start.own_s >= 0.4 and now.machine_busy_s - start.machine_busy_s >= 0.4
    others = others_cores(start, now)
    assert others is not None and others >= 0.0


def test_more_threads_than_cores_is_reported() -> None:
    (warning,) = load_warnings(threads=4, cpu_count=2, load_before=0.0, load_after=None)
    assert "torch runs 4 threads on 2 cores" in warning and "bench.threads=2" in warning
    both = MachineLoad(cpu_count=2, threads=4, load_before=(3.0, 2.0, 1.0), load_after=(7.0, 5.0, 2.0))
    assert len(both.warnings()) == 2 and both.to_json()["warnings"] == both.warnings()


@pytest.mark.slow
def test_the_default_target_is_previewed_without_its_weights(hydra_conf: None, default_target: Any) -> None:
    preview, problems = bench_checks.preview_target(compose("bench").target)
    assert problems == [] and preview is not None and preview.max_context == default_target.max_context
    prompt = load_suite("quick")[0]
    assert prompt.token_ids(preview.tokenizer) == prompt.token_ids(default_target.tokenizer)


# ----------------------------------------------------------------------------- multi-turn prompts, decode vs prefill
@pytest.fixture
def prompts_seen(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[int], bench.Run]]:
    """Every generation of the bench: (method, prompt token ids, run)."""
    seen: list[tuple[str, list[int], bench.Run]] = []
    real = bench.Method.run

    def recording(self: bench.Method, target: Any, ids: list[int], *args: Any) -> bench.Run:
        run = real(self, target, ids, *args)
        seen.append((self.name, list(ids), run))
        return run

    monkeypatch.setattr(bench.Method, "run", recording)
    return seen


def test_a_two_turn_prompt_answers_each_turn_on_the_conversation_so_far(
    hydra_conf: None, tmp_path: Path, prompts_seen: list[tuple[str, list[int], bench.Run]]
) -> None:
    suite = tmp_path / "mt.jsonl"
    suite.write_text("\n".join(json.dumps(line) for line in [
        {"question_id": 81, "category": "writing", "turns": ["Write a haiku about rain.", "Now make it sadder."],
         "reference": ["any"]},
        {"id": "qa-1", "category": "qa", "messages": [{"role": "user", "content": "What is rain?"}]},
    ]) + "\n")
    cfg = compose("bench", overrides=[
        "target=tiny_random", "suite=file", f"suite.path={suite}", "max_new_tokens=6", "num_draft_tokens=2",
        "bench.drafters=[ngram]", "bench.peers=[hf_generate]", "bench.repetitions=1", "bench.warmup=0",
        "bench.plots=false", "bench.progress=false", "bench.bandwidth_bytes=0"])
    out = tmp_path / "out"
    result = bench.run_bench(cfg, out)
    methods = ["autoregressive", "ngram", "hf_generate"]
    assert result["progress"] == {"runs_done": 9, "runs_total": 9, "prompts_done": 3, "prompts_total": 3}
    by_key = {(r["prompt"], r["method"]): r for r in result["records"]}
    assert set(by_key) == {(p, m) for p in ("81#t1", "81#t2", "qa-1") for m in methods}
    assert [by_key[(p, "ngram")]["turn"] for p in ("81#t1", "81#t2", "qa-1")] == [1, 2, 1]
    assert all(r["greedy_match"] is True for r in result["records"]) and not result["greedy_mismatches"]

    tokenizer = models.load_tokenizer("smollm2-135m")
    calls = {m: [ids for name, ids, _ in prompts_seen if name == m] for m in methods}
    assert all(calls[m] == calls["autoregressive"] for m in methods)  # greedy: one conversation for all
    first, second, _ = calls["autoregressive"]  # turn 1, turn 2, qa-1
    assert first == load_suite(suite)[0].token_ids(tokenizer)  # turn 1: the first user turn only
    ar_turn_1 = next(run for name, _, run in prompts_seen if name == "autoregressive")
    answer = tokenizer.decode(ar_turn_1.token_ids, skip_special_tokens=True)
    conversation = tokenizer.decode(second, clean_up_tokenization_spaces=False)
    assert answer.strip() and conversation.index("Write a haiku") < conversation.index(answer) < conversation.index(
        "Now make it sadder.")
    assert second[:len(first)] == first and by_key[("81#t2", "ngram")]["prompt_tokens"] == len(second)

    turns = result["summary_by_turn"]
    assert set(turns) == {"overall", "writing"} and set(turns["writing"]) == {"1", "2"}
    assert turns["overall"]["1"]["autoregressive"]["prompts"] == 2 and turns["writing"]["2"]["ngram"]["prompts"] == 1
    md = (out / "results.md").read_text()
    assert "### writing, per turn" in md and "### overall, per turn" in md and "### qa, per turn" not in md
    assert "| turn | method | prompt tokens | speedup vs AR |" in md and f"| 2 | ngram | {len(second)} |" in md


def test_decode_speed_and_prefill_are_reported_next_to_end_to_end() -> None:
    ar = [bench.Run(1.0, [1] * 10, decode_seconds=0.5, decode_tokens=10)]  # 0.5 s prefill
    fast = [bench.Run(0.75, [1] * 10, decode_seconds=0.25, decode_tokens=10)]  # decoding twice as fast
    hf = [bench.Run(0.5, [1] * 10)]  # does not split its time
    rec = bench.summarize(bench.Method("ngram"), fast, ar, {})
    assert rec["speedup"] == pytest.approx(4 / 3) and rec["decode_speedup"] == pytest.approx(2.0)
    assert rec["prefill_s"] == pytest.approx(0.5) and rec["decode_tokens_per_s"] == pytest.approx(40.0)
    peer = bench.summarize(bench.Method("hf_generate"), hf, ar, {})
    assert peer["speedup"] == pytest.approx(2.0) and peer["decode_speedup"] is None and peer["prefill_s"] is None
    own = bench.summarize(bench.Method(bench.AR), ar, ar, {})
    records = [{**r, "prompt": "p", "category": "qa"} for r in (own, rec, peer)]
    summary = bench.aggregate(records)
    assert summary["overall"]["ngram"]["decode_speedup"] == pytest.approx(2.0)
    assert bench.aggregate_by_turn(records) == {}  # single-turn prompts only: no per-turn tables
    config = {"target": {"name_or_path": "t"}, "suite": {"name": "quick"}, "num_draft_tokens": 3, "max_new_tokens": 8}
    md = bench.render_markdown({"config": config, "summary": summary, "peer_ratios": [], "greedy_mismatches": []})
    assert ("| method | speedup vs AR | tok/s | decode speedup vs AR | decode tok/s | prefill ms | acceptance |"
            in md)
    assert "| ngram | 1.33x | 13.3 | 2.00x | 40.0 | 500.0 |" in md
    assert "| hf_generate | 2.00x | 20.0 | - | - | - |" in md and "per turn" not in md


def test_a_multi_turn_prompt_must_fit_the_context_at_its_last_turn() -> None:
    tokenizer = models.load_tokenizer("smollm2-135m")
    prompt = SuitePrompt(id="m", category="chat", turns=("Hello there.", "And again?"))
    length = len(prompt.token_ids(tokenizer, [""]))
    assert bench_checks.context_problems([prompt], tokenizer, length + 8, 4) == []
    (problem,) = bench_checks.context_problems([prompt], tokenizer, length + 7, 4)
    assert f"prompt 'm' (chat): {length} prompt tokens over its 2 turns + 2 x 4 new tokens = {length + 8}" in problem


def test_a_remembering_drafter_learns_each_prompt_once_after_its_timed_runs(hydra_conf: None, tmp_path: Path) -> None:
    """Suffix decoding's store learns every prompt's output once, after all its repetitions: a
    repetition never sees its own prompt's output, and the store's size is in the results."""
    suite = tmp_path / "r.jsonl"
    suite.write_text("\n".join(json.dumps({"id": f"p{i}", "category": "c", "prompt": f"word {i} " * 3})
                               for i in range(3)) + "\n")
    cfg = compose("bench", overrides=[
        "target=tiny_random", "suite=file", f"suite.path={suite}", "max_new_tokens=8", "num_draft_tokens=4",
        "bench.drafters=[ngram,suffix,suffix_cold]", "bench.repetitions=2", "bench.warmup=1",
        "bench.plots=false", "bench.progress=false", "bench.bandwidth_bytes=0"])
    result = bench.run_bench(cfg, tmp_path / "out")
    memory = result["drafter_memory"]
    assert set(memory) == {"suffix"}  # ngram and the store-less suffix_cold keep nothing
    assert memory["suffix"]["requests"] == 3 and memory["suffix"]["tokens"] == 3 * 8
    assert memory["suffix"]["tokens"] <= memory["suffix"]["budget_tokens"]
    assert all(r["greedy_match"] is True for r in result["records"])
    assert "## what drafters keep across requests" in (tmp_path / "out" / "results.md").read_text()


def test_prefix_caching_reuses_earlier_prompts_never_a_repetition_of_the_same_one(
    hydra_conf: None, tmp_path: Path
) -> None:
    """prefix_cache_tokens > 0: a second turn restores the first turn's conversation (every method
    from its own earlier run), while repeated timings of one prompt never restore that prompt itself;
    greedy output stays AR's."""
    suite = tmp_path / "mt.jsonl"
    suite.write_text(json.dumps({"question_id": 81, "category": "writing",
                                 "turns": ["Write a haiku about rain.", "Now make it sadder."]}) + "\n")
    cfg = compose("bench", overrides=[
        "target=tiny_random", "suite=file", f"suite.path={suite}", "max_new_tokens=6", "num_draft_tokens=2",
        "bench.drafters=[ngram]", "bench.repetitions=2", "bench.warmup=0", "prefix_cache_tokens=4096",
        "bench.plots=false", "bench.progress=false", "bench.bandwidth_bytes=0"])
    result = bench.run_bench(cfg, tmp_path / "out")
    by_key = {(r["prompt"], r["method"]): r for r in result["records"]}
    methods = ["autoregressive", "ngram"]
    assert set(by_key) == {(p, m) for p in ("81#t1", "81#t2") for m in methods}
    first = by_key[("81#t1", "ngram")]["prompt_tokens"]
    for m in methods:
        assert by_key[("81#t1", m)]["cached_prompt_tokens"] == 0
        assert first - 2 <= by_key[("81#t2", m)]["cached_prompt_tokens"] < by_key[("81#t2", m)]["prompt_tokens"]
    assert all(r["greedy_match"] is True for r in result["records"])


def test_a_drafter_config_file_of_your_own_runs_beside_the_packaged_one(hydra_conf: None, tmp_path: Path) -> None:
    """bench.drafters takes the path of a YAML drafter config too (a variant of a shipped drafter, e.g.
    pointing at a draft you trained): it runs beside the packaged config and goes by its file name.
    An entry may change settings after the name ("ngram max_ngram=4"): it goes by the whole entry."""
    own = tmp_path / "ngram_wide.yaml"
    own.write_text("_target_: drafters.ngram.NGramDrafter\nmax_ngram: 4\nmin_ngram: 1\n")
    suite = write_suite(tmp_path / "s.jsonl", [5, 5])
    cfg = compose("bench", overrides=[
        "target=tiny_random", "suite=file", f"suite.path={suite}", "max_new_tokens=6", "num_draft_tokens=2",
        f"bench.drafters=[ngram,{own},'ngram max_ngram=2 min_ngram=2']", "bench.peers=[]", "bench.repetitions=1",
        "bench.warmup=0", "bench.plots=false", "bench.progress=false", "bench.bandwidth_bytes=0"])
    result = bench.run_bench(cfg, tmp_path / "out")
    assert {r["method"] for r in result["records"]} == {"autoregressive", "ngram", "ngram_wide",
                                                         "ngram max_ngram=2 min_ngram=2"}
    assert all(r["greedy_match"] is True for r in result["records"])

    (tmp_path / "sub").mkdir()
    twin = tmp_path / "sub" / "ngram_wide.yaml"
    twin.write_text(own.read_text())
    empty = tmp_path / "empty.yaml"
    empty.write_text("max_ngram: 4\n")
    for drafters, sentence in ((f"[{own},{twin}]", "names a drafter twice"),
                               (f"[{tmp_path / 'none.yaml'}]", "does not exist"),
                               (f"[{empty}]", "has no _target_"),
                               ("['ngram max_ngrams=2']", "has no setting 'max_ngrams'"),
                               ("['ngram max_ngram']", "is not key=value"),
                               ("['ngram max_ngram=2 max_ngram=3']", "sets 'max_ngram' twice"),
                               ("[ngram,'ngram ']", "names a drafter twice")):
        bad = compose("bench", overrides=["target=tiny_random", "suite=file", f"suite.path={suite}",
                                          f"bench.drafters={drafters}"])
        with pytest.raises(ValueError, match=sentence):
            bench.plan_bench(bad, tmp_path / "out2")
