"""The bench reads declared capabilities (hf_counterpart, HFCounterpart.hf_peer_kwargs), leaves the
process's RNG alone, and predicts speedups with the one verify-cost model and theory's formula."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from drafters.early_exit import EarlyExitDrafter
from drafters.ngram import NGramDrafter
from specdraft import bench, theory
from specdraft.models import tiny_random_target
from specdraft.sampling import SamplingConfig
from specdraft.stats import GenerationStats

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
    stats = GenerationStats(prefill_s=0.1, draft_s=0.03)
    for k, accepted in ((3, 2), (3, 3), (0, 0), (4, 1)):
        stats.record_round(k, accepted, accepted + 1)
        stats.record_verify(k, 0.05)
    assert stats.drafted == 10  # so T_q = 3 ms per drafted token
    curve = [1.0, 1.05, 1.1, 1.2, 1.4]
    got = bench.run_predicted_speedup(stats, curve, step_s=0.04, ar_step_s=0.05)
    t_v = [0.04 * c for c in curve]
    want = theory.predicted_speedup(stats.acceptance_per_position, 0.003, t_v, {3: 2, 0: 1, 4: 1}, 0.1, 0.05)
    assert got == pytest.approx(want)
    assert bench.run_predicted_speedup(GenerationStats(), curve, 0.04, 0.05) is None  # nothing ran
