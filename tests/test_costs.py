"""The measured costs: the verify-cost curve (shape, on-disk cache per model/device/stack), the
drafter's cost per token, a cache that cannot be written (a warning, never a failure), lazy use by
the decoder (construction times nothing and writes nothing), and seeded runs that reproduce while
the clock is noisy."""

from __future__ import annotations

import itertools
import json
import logging
import random
import time
from pathlib import Path

import pytest

from drafters.ngram import NGramDrafter
from specdraft import costs
from specdraft.decode import SpeculativeDecoder
from specdraft.draft_length import CostModelDraftLength
from specdraft.models import tiny_random_target
from specdraft.sampling import SamplingConfig


def test_measured_curve_is_relative_to_one_position(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path))
    target = tiny_random_target()
    curve = costs.cached_verify_curve(target, 4)
    assert len(curve) == 5 and curve[0] == 1.0 and all(c > 0 for c in curve)
    assert target.cache_length == 0  # measuring leaves no trace in the cache
    table = json.loads((tmp_path / costs.CACHE_FILE).read_text())
    assert table == {f"verify_curve|{costs.CURVE_METHOD}|{costs.cost_key(target)}": curve}


def test_the_curve_is_the_fastest_sweep_and_never_falls(monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy moment (one slow sweep) must not make a draft length look dear; a length measured
    cheaper than a shorter one costs as much as the shorter one."""
    fake = {("target", 1): [1.0, 5.0, 1.0], ("target", 2): [1.2, 1.2, 9.0], ("target", 3): [1.1, 3.0, 1.1]}
    monkeypatch.setattr(costs, "time_forwards", lambda *a, **k: fake)
    assert costs.measure_verify_curve(tiny_random_target(), 2, reps=3) == pytest.approx([1.0, 1.2, 1.2])


def test_cached_curve_is_reused_and_keyed_by_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path))
    fast, plain = tiny_random_target(), tiny_random_target(fast=False)
    first = costs.cached_verify_curve(fast, 3)
    monkeypatch.setattr(costs, "measure_verify_curve", lambda *a, **k: pytest.fail("measured again"))
    assert costs.cached_verify_curve(fast, 3) == first
    assert costs.cached_verify_curve(fast, 2) == first[:3]
    assert costs.cost_key(fast) != costs.cost_key(plain)


def test_building_a_decoder_times_nothing_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(costs, "measure_verify_curve", lambda *a, **k: pytest.fail("timed the target"))
    target = tiny_random_target()
    for k in ("auto", 3, 0):
        SpeculativeDecoder(target, NGramDrafter(), k, max_draft_tokens=5)
        SpeculativeDecoder(target, None, k)
    assert list(tmp_path.iterdir()) == [] and target.verify_costs == {}


def test_auto_measures_the_curve_on_first_use_outside_the_timed_stats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path))
    target = tiny_random_target()
    dec = SpeculativeDecoder(target, NGramDrafter(), "auto", max_draft_tokens=5)
    measure = costs.measure_verify_curve
    slow = 1.0  # seconds the measurement is made to take

    def slow_measure(*args: object, **kwargs: object) -> list[float]:
        time.sleep(slow)
        return measure(*args, **kwargs)

    monkeypatch.setattr(costs, "measure_verify_curve", slow_measure)
    out = dec.generate([1, 2, 3, 1, 2], 6, stop_token_ids=[])
    assert out.stats.total_s < slow  # the measurement is not this generation's time
    assert len(target.verify_costs[1]) == 6 and (tmp_path / costs.CACHE_FILE).is_file()
    assert isinstance(dec.new_policy(), CostModelDraftLength)
    assert dec.new_policy().verify_curve == costs.verify_curve(target, 5)  # memoised: measured once
    monkeypatch.setattr(costs, "measure_verify_curve", lambda *a, **k: pytest.fail("measured again"))
    SpeculativeDecoder(target, NGramDrafter(), "auto", max_draft_tokens=5).generate([1, 2, 3], 4)


def test_an_explicit_curve_is_used_and_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(costs, "measure_verify_curve", lambda *a, **k: pytest.fail("timed the target"))
    target = tiny_random_target()
    given = SpeculativeDecoder(target, NGramDrafter(), "auto", max_draft_tokens=2, verify_curve=[1.0, 1.1, 1.2])
    given.generate([1, 2, 3, 1, 2], 6)
    assert given.new_policy().verify_curve == [1.0, 1.1, 1.2]  # type: ignore[attr-defined]
    for bad in ("measured", [1.0, 1.1]):
        with pytest.raises(ValueError, match="verify_curve"):
            SpeculativeDecoder(target, NGramDrafter(), "auto", max_draft_tokens=2, verify_curve=bad)
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_or_corrupt_cache_only_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(blocker / "cache"))  # cannot be created (even by root)
    target = tiny_random_target()
    with caplog.at_level(logging.WARNING, logger="specdraft.costs"):
        out = SpeculativeDecoder(target, NGramDrafter(), "auto", max_draft_tokens=3).generate([1, 2, 3, 1, 2], 5)
    assert out.token_ids.shape[1] >= 1 and "cannot write the cost cache" in caplog.text
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path))
    (tmp_path / costs.CACHE_FILE).write_text("{ half a json")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specdraft.costs"):
        assert costs.cached_value("answer", lambda: 42) == 42
    assert "cannot read the cost cache" in caplog.text
    assert json.loads((tmp_path / costs.CACHE_FILE).read_text()) == {"answer": 42}  # rewritten whole


def test_draft_cost_is_seconds_per_token_over_one_target_step() -> None:
    curve = [1.0, 1.1, 1.2, 1.3]
    # Round 1 (prompt catch-up) is ignored; then 3 tokens in 6 ms with a 26 ms verify at k = 3
    # (T_v(0) = 20 ms): 2 ms / 20 ms = 0.1 per token; a round that drafted nothing costs 1 token.
    got = costs.draft_cost_ratios([3, 3, 3, 0], [0.5, 0.006, 0.006, 0.002], [0.026, 0.026, 0.026, 0.02], curve)
    assert got[0] is None and got[1:] == pytest.approx([0.1, 0.1, 0.1])
    assert costs.draft_cost_ratios([3, 3], [0.5, 0.006], [0.026, 0.0], curve) == [None, None]  # no timed verify
    # a tree round: 2 draft steps (its depth) in 4 ms, its verify scored 3 nodes in 26 ms (T_v(0) = 20 ms): 0.1 per step
    assert costs.draft_cost_ratios([3, 2], [0.5, 0.004], [0.026, 0.026], curve, [3, 3])[1] == pytest.approx(0.1)
    assert costs.is_draft_cost([0.1]) and costs.is_draft_cost([0.1, 0.0], 2)
    assert not any(costs.is_draft_cost(v) for v in ([-1.0], None, 0.1, [0.1, 0.2], [True]))


def test_each_draft_source_costs_the_median_of_its_own_rounds() -> None:
    ratios = [None, 0.01, 0.3, 0.02, 0.2, 0.4]
    sources = [0, 0, 1, 0, 1, 1]
    assert costs.draft_costs_by_source(sources, ratios, 2) == pytest.approx([0.015, 0.3])
    assert costs.draft_costs_by_source([0, 0, 0], [None, 0.1, 0.3], 2) == pytest.approx([0.2, 0.2])  # no rounds: all
    assert costs.draft_costs_by_source([0], [None], 2) == [0.0, 0.0]


def test_seeded_auto_runs_reproduce_under_a_noisy_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The draft length of "auto" follows measured costs; measured once before the generations,
    so a clock that jitters by 10x while they run changes nothing. Through the cost cache, a new
    decoder (a new process) measures nothing and reproduces the tokens too."""
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path))
    target = tiny_random_target(vocab_size=16)
    sampling = SamplingConfig(temperature=0.7, seed=7)
    prompt = [1, 2, 3, 4, 1, 2, 3]
    flat = [1.0] * 5  # verify costs given (so that drafting pays); the drafter's cost is measured
    decoder = SpeculativeDecoder(target, NGramDrafter(), "auto", sampling, max_draft_tokens=4, verify_curve=flat,
                                 cost_key="ngram")
    first = decoder.generate(prompt, 40, stop_token_ids=[])
    rng = random.Random(0)
    clock = itertools.accumulate(rng.uniform(0.0, 0.1) for _ in itertools.count())
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))  # every timer in every module
    runs = [decoder.generate(prompt, 40, stop_token_ids=[]) for _ in range(3)]
    assert all(r.token_ids.tolist() == first.token_ids.tolist() for r in runs)
    assert all(r.stats.drafted_per_round == first.stats.drafted_per_round for r in runs)
    assert len(set(first.stats.drafted_per_round)) > 1  # K did vary
    monkeypatch.setattr(SpeculativeDecoder, "_measure_draft_cost", lambda *a: pytest.fail("measured again"))
    fresh = SpeculativeDecoder(target, NGramDrafter(), "auto", sampling, max_draft_tokens=4, verify_curve=flat,
                               cost_key="ngram")
    assert fresh.generate(prompt, 40, stop_token_ids=[]).token_ids.tolist() == first.token_ids.tolist()
    other = decoder.generate(prompt, 40, stop_token_ids=[], sampling=SamplingConfig(temperature=1.0, seed=8))
    assert other.token_ids.tolist() != first.token_ids.tolist()


def test_draft_cost_is_measured_once_per_mode_and_can_be_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path))
    target = tiny_random_target()
    calls = []
    measure = SpeculativeDecoder._measure_draft_cost

    def counting(self: SpeculativeDecoder, sampling: SamplingConfig, batch_size: int = 1) -> list[float]:
        calls.append(sampling.greedy)
        return measure(self, sampling, batch_size)

    monkeypatch.setattr(SpeculativeDecoder, "_measure_draft_cost", counting)
    dec = SpeculativeDecoder(target, NGramDrafter(), "auto", max_draft_tokens=3)
    for _ in range(2):
        dec.generate([1, 2, 3, 1, 2], 5)
        dec.generate([1, 2, 3, 1, 2], 5, sampling=SamplingConfig(temperature=1.0))
    assert calls == [True, False] and dec.draft_costs_per_token(SamplingConfig())[0] >= 0
    plain = SpeculativeDecoder(target, None).generate([1, 2, 3, 1, 2], 5).token_ids
    assert dec.generate([1, 2, 3, 1, 2], 5).token_ids.tolist() == plain.tolist()  # measuring left no state behind
    given = SpeculativeDecoder(target, NGramDrafter(), "auto", max_draft_tokens=3, draft_cost=0.25)
    given.generate([1, 2, 3, 1, 2], 5)
    assert calls == [True, False] and given.new_policy().draft_cost == 0.25  # type: ignore[attr-defined]
    for bad in (-1.0, "cheap"):
        with pytest.raises(ValueError, match="draft_cost"):
            SpeculativeDecoder(target, NGramDrafter(), "auto", draft_cost=bad)  # type: ignore[arg-type]
