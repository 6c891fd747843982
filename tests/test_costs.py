"""The measured verify-cost curve: shape, on-disk cache per model/device/stack, lazy use by the
decoder (construction times nothing and writes nothing)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from drafters.ngram import NGramDrafter
from specdraft import costs
from specdraft.decode import SpeculativeDecoder
from specdraft.draft_length import CostModelDraftLength
from specdraft.models import tiny_random_target


def test_measured_curve_is_relative_to_one_position(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path))
    target = tiny_random_target()
    curve = costs.cached_verify_curve(target, 4)
    assert len(curve) == 5 and curve[0] == 1.0 and all(c > 0 for c in curve)
    assert target.cache_length == 0  # measuring leaves no trace in the cache
    table = json.loads((tmp_path / costs.CACHE_FILE).read_text())
    assert table == {costs.cost_key(target): curve}


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
    assert list(tmp_path.iterdir()) == [] and target.verify_costs == []


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
    assert len(target.verify_costs) == 6 and (tmp_path / costs.CACHE_FILE).is_file()
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
