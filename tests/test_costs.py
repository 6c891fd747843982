"""The measured verify-cost curve: shape, on-disk cache per model/device/stack, use by the decoder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drafters.ngram import NGramDrafter
from specdraft import costs
from specdraft.decode import SpeculativeDecoder
from specdraft.gamma import CostModelGamma
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


def test_auto_decoder_starts_from_the_cached_curve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path))
    target = tiny_random_target()
    dec = SpeculativeDecoder(target, NGramDrafter(), "auto", max_draft_tokens=5)
    assert isinstance(dec.policy, CostModelGamma)
    assert dec.policy.verify_curve == costs.cached_verify_curve(target, 5)
    given = SpeculativeDecoder(target, NGramDrafter(), "auto", max_draft_tokens=2, verify_curve=[1.0, 1.1, 1.2])
    assert given.policy.verify_curve == [1.0, 1.1, 1.2]
    with pytest.raises(ValueError, match="verify_curve"):
        SpeculativeDecoder(target, NGramDrafter(), "auto", verify_curve="measured")
