"""The bench's batch-size sweep (`specdraft.batch_bench`): per-position acceptance pooled over rows,
the theory's prediction from a batch's own K mix, batches drawn from the suite, settings checked
before any model loads, and a sweep on the tiny random target that writes batch_results.json, its
section of results.md and its plot, with every greedy row equal to AR's."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose
from omegaconf import OmegaConf

from specdraft import batch_bench, bench, theory
from specdraft.stats import GenerationStats


def row(rounds: list[tuple[int, int]], draft_s: float = 0.0) -> GenerationStats:
    """A row's stats from its rounds (drafted, accepted); each emits accepted + 1 tokens."""
    stats = GenerationStats()
    for k, a in rounds:
        stats.record_round(k, a, a + 1, draft_s=draft_s * k, verify_s=0.01)
    return stats


def test_acceptance_is_pooled_over_rows_by_counts_not_averaged_per_row() -> None:
    busy = row([(2, 2), (2, 1), (2, 0)])  # position 0: reached 3, accepted 2; position 1: reached 2, accepted 1
    quiet = row([(1, 0)])  # position 0: reached 1, accepted 0
    assert busy.acceptance_per_position == pytest.approx([2 / 3, 1 / 2])
    assert batch_bench.pooled_acceptance_per_position([busy, quiet]) == pytest.approx([2 / 4, 1 / 2])
    assert batch_bench.pooled_acceptance_per_position([quiet, busy]) == pytest.approx([2 / 4, 1 / 2])
    assert batch_bench.pooled_acceptance_per_position([row([(0, 0)])]) == []  # AR: nothing drafted
    assert batch_bench.pooled_acceptance_per_position([]) == []


def test_the_prediction_is_the_theory_of_the_batch_k_mix_at_its_curve() -> None:
    rows = [row([(3, 2), (3, 3), (0, 0)], draft_s=0.002), row([(3, 0), (3, 1), (0, 0)], draft_s=0.002)]
    batch = SimpleNamespace(drafted_per_round=[3, 3, 0], prefill_s=0.05, rounds=3, total_s=0.2)
    run = batch_bench.BatchRun(0.2, [[1] * 5, [1] * 3], rows, batch)  # type: ignore[arg-type]
    curve = [1.0, 1.2, 1.4, 1.7]
    got = batch_bench.predicted_batch_speedup([run], curve, ar_step_s=0.02)
    acceptance = [3 / 4, 2 / 3, 1 / 2]  # accepted / reached at each position, both rows' rounds together
    assert batch_bench.pooled_acceptance_per_position(rows) == pytest.approx(acceptance)
    want = theory.predicted_speedup(acceptance, 0.002, [0.02 * c for c in curve], {3: 2, 0: 1}, 0.05, 0.02)
    assert got == pytest.approx(want)
    assert batch_bench.predicted_batch_speedup([run], curve[:3], 0.02) is None  # K = 3 lies beyond the curve
    assert batch_bench.predicted_batch_speedup([run], curve, 0.0) is None  # no AR step measured
    ar = batch_bench.BatchRun(0.3, [[1] * 4], [row([(0, 0)] * 4)],
                              SimpleNamespace(total_s=0.3, prefill_s=0.1, rounds=4))  # type: ignore[arg-type]
    assert batch_bench.plain_step_seconds([ar, ar]) == pytest.approx(0.05)
    assert batch_bench.decode_throughput([run, ar]) == pytest.approx((8 + 4) / (0.15 + 0.2))  # prefills left out
    assert batch_bench.decode_throughput([batch_bench.BatchRun(0.2, [[1] * 5])]) is None  # a peer: no prefill


def test_batches_are_consecutive_prompts_wrapping_around_the_suite() -> None:
    assert batch_bench.draw_batches(5, 2, 3) == [[0, 1], [2, 3], [4, 0]]
    assert batch_bench.draw_batches(3, 4, 1) == [[0, 1, 2, 0]]  # larger than the suite: prompts repeat
    assert batch_bench.throughput([batch_bench.BatchRun(2.0, [[1] * 6, [1] * 4]),
                                   batch_bench.BatchRun(3.0, [[1] * 15])]) == pytest.approx(5.0)


def test_left_padding_and_rows_cut_after_their_stop_token() -> None:
    ids, mask = batch_bench.left_padded([[5, 6, 7], [8]], pad_id=2)
    assert ids.tolist() == [[5, 6, 7], [2, 2, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch_bench.cut_at_stop([4, 2, 2, 2], [2]) == [4, 2] and batch_bench.cut_at_stop([4, 5], []) == [4, 5]


def test_bad_batch_settings_name_the_setting_and_the_fix() -> None:
    cfg = OmegaConf.create({"bench": {"batch_sizes": [0, 2, "four", 2], "batches_per_size": 0}})
    problems = batch_bench.setting_problems(cfg)
    assert problems[0].startswith(
        "bench.batch_sizes=0 must be an integer >= 1 (prompts decoded together; e.g. bench.batch_sizes=[1,2,4,8]")
    assert problems[1].startswith("bench.batch_sizes='four' must be an integer >= 1")
    assert problems[2].startswith("bench.batches_per_size=0 must be an integer >= 1")
    assert problems[3] == ("bench.batch_sizes lists 2 more than once; list each batch size once, e.g. "
                           "bench.batch_sizes=[1,2,4,8].")
    assert batch_bench.setting_problems(OmegaConf.create({"bench": {"batch_sizes": [], "batches_per_size": 0}})) == []
    assert batch_bench.batch_sizes(OmegaConf.create({"bench": {}})) == []  # no key: the default, no sweep


def test_the_yaml_repeats_the_code_defaults(hydra_conf: None) -> None:
    cfg = compose("bench").bench
    assert {k: OmegaConf.to_container(cfg, resolve=True)[k] for k in batch_bench.DEFAULTS} == batch_bench.DEFAULTS


def test_bad_batch_settings_stop_the_bench_before_any_model_loads(hydra_conf: None, tmp_path: Path) -> None:
    cfg = compose("bench", overrides=["target=tiny_random", "suite=quick", "bench.batch_sizes=[1,0]"])
    with pytest.raises(ValueError, match=r"bench\.batch_sizes=0 must be an integer >= 1"):
        bench.plan_bench(cfg, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_sweep_over_batch_sizes_1_and_2(hydra_conf: None, tmp_path: Path) -> None:
    suite = tmp_path / "s.jsonl"
    words = ["copy this copy this copy this", "one two three one two three", "the cat the cat the cat"]
    suite.write_text("".join(json.dumps({"id": f"p{i}", "category": "c", "prompt": w}) + "\n"
                             for i, w in enumerate(words)))
    cfg = compose("bench", overrides=[
        "target=tiny_random", "suite=file", f"suite.path={suite}", "max_new_tokens=8", "num_draft_tokens=3",
        "bench.drafters=[ngram]", "bench.peers=[hf_generate]", "bench.repetitions=1", "bench.warmup=0",
        "bench.progress=false", "bench.bandwidth_bytes=0", "bench.batch_sizes=[1,2]"])
    out = tmp_path / "out"
    bench.run_bench(cfg, out)
    sweep = json.loads((out / "batch_results.json").read_text())
    assert sweep["partial"] is False and [s["batch_size"] for s in sweep["sizes"]] == [1, 2]
    assert sweep["methods"] == ["autoregressive", "ngram", "hf_generate"]
    assert [s["batches"] for s in sweep["sizes"]] == [[[0], [1]], [[0, 1], [2, 0]]]
    for size in sweep["sizes"]:
        ar, ngram, hf = (size["methods"][m] for m in sweep["methods"])
        assert ar["speedup"] == pytest.approx(1.0) and ar["mean_k"] == 0.0 and ar["acceptance_rate"] == 0.0
        assert ngram["new_tokens"] == ar["new_tokens"] == 8 * size["batch_size"] * 2
        for m in (ngram, hf):
            assert math.isfinite(m["speedup"]) and m["speedup"] > 0 and m["tokens_per_s"] > 0
        assert math.isfinite(ngram["predicted_speedup"]) and 0 < ngram["mean_k"] <= 3
        assert ar["decode_speedup"] == pytest.approx(1.0) and ngram["decode_speedup"] > 0
        assert "decode_speedup" not in hf
        assert ngram["greedy_match"] is True and ar["greedy_match"] is True
        assert len(size["verify_curve"]) > 3 and size["ar_step_s"] > 0
    md = (out / "results.md").read_text()
    assert "## Batch sizes" in md and "### batch size 2" in md and "| method | b=1 | b=2 |" in md
    assert ("| method | tok/s | speedup vs AR | predicted | decode speedup | prefill s | latency s | acceptance | mean K "
            "| greedy = AR |") in md and "Decode speedup (prefill left out): ngram b=1 " in md
    assert (out / "speedup_vs_batch.png").stat().st_size > 0
