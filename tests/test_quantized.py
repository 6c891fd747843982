"""Quantized-copy drafter: greedy exactness for every backend and format, the exact-copy invariant
(bits=32 accepts everything at any temperature), losslessness at temperature 1 with a negative
control, memory."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

import conf
from drafters.quantized import QuantizedDrafter, memory_report
from specdraft.check.broken import always_accept
from specdraft.decode import SpeculativeDecoder
from specdraft.models import tiny_random_target
from specdraft.protocol import Drafter
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel
from specdraft.vocab import PrunedVocab
from tests.helpers import (
    exact_two_token_distribution,
    plain_greedy,
    pooled_chisquare,
    sample_two_tokens,
)

PROMPT = [1, 2, 3, 1, 2]


@pytest.fixture
def tiny_target() -> TargetModel:
    """Vocab 16, 2 layers, hidden 64 (bitsandbytes 4-bit quantizes blocks of 64 inputs); weights of
    std 0.3, so p is peaked and a wrong output law is visible at the statistical tests' N."""
    return tiny_random_target(vocab_size=16, seed=1, hidden_size=64, init_std=0.3)


@pytest.mark.parametrize(
    "kwargs",
    [{"bits": 4}, {"bits": 4, "share_kv": False}, {"bits": 4, "group_size": 64}, {"bits": 8}, {"bits": 16}, {"bits": 4, "share_embeddings": False},
     {"bits": 8, "backend": "bitsandbytes"}, {"bits": 4, "backend": "bitsandbytes", "quant_type": "nf4", "group_size": 64},
     {"bits": 4, "backend": "bitsandbytes", "quant_type": "fp4", "group_size": 64},
     {"bits": 8, "backend": "torch"}, {"bits": 8, "backend": "bitsandbytes", "share_embeddings": False}],
    ids=["int4", "int4-own-cache", "int4-group64", "int8", "bf16", "int4-quantized-head", "bnb-int8", "bnb-nf4", "bnb-fp4",
         "torch-int8", "bnb-int8-quantized-head"],
)
def test_greedy_matches_plain_greedy(tiny_target: TargetModel, kwargs: dict) -> None:
    out = SpeculativeDecoder(tiny_target, QuantizedDrafter(**kwargs), 3).generate(PROMPT, 40, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(tiny_target, PROMPT, 40)
    assert 0 < out.stats.accepted <= out.stats.drafted


@pytest.mark.parametrize("backend", ["fast", "bitsandbytes"])
@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0),
                                      SamplingConfig(temperature=0.7, top_k=5, top_p=0.9)],
                         ids=["greedy", "t1", "topk_topp"])
def test_exact_copy_accepts_everything(tiny_target: TargetModel, backend: str, sampling: SamplingConfig) -> None:
    dec = SpeculativeDecoder(tiny_target, QuantizedDrafter(bits=32, backend=backend), 4, sampling)
    stats = dec.generate(PROMPT, 60, stop_token_ids=[]).stats
    assert stats.drafted > 0 and stats.acceptance_rate == 1.0


@pytest.mark.parametrize("kwargs", [{"bits": 4}, {"bits": 16}, {"bits": 4, "backend": "bitsandbytes",
                                                                 "quant_type": "fp4", "group_size": 64}],
                         ids=["int4", "bf16", "bnb-fp4"])
def test_lossless_at_temperature_one(tiny_target: TargetModel, kwargs: dict) -> None:
    assert _two_token_p_value(tiny_target, QuantizedDrafter(**kwargs)) > 1e-4


def test_lossless_and_its_negative_control(tiny_target: TargetModel, tmp_path: Path) -> None:
    """An int4 copy over every other token id: its q differs from p by construction (no mass on the
    odd ids), so the same test with a verifier that accepts every draft rejects what it passes."""
    path = tmp_path / "vocab.json"
    PrunedVocab(range(0, tiny_target.vocab_size, 2), vocab_size=tiny_target.vocab_size).save(path)
    assert _two_token_p_value(tiny_target, QuantizedDrafter(bits=4, pruned_vocab=path)) > 1e-4
    assert _two_token_p_value(tiny_target, QuantizedDrafter(bits=4, pruned_vocab=path), always_accept) < 1e-4


def _two_token_p_value(target: TargetModel, drafter: QuantizedDrafter, sampler: Callable | None = None) -> float:
    """Chi-square p-value of the first two sampled tokens (T = 1, 800 seeds) against the exact law."""
    sampling = SamplingConfig(temperature=1.0)
    extra = {} if sampler is None else {"sampler": sampler}
    dec = SpeculativeDecoder(target, drafter, 2, sampling, **extra)
    counts = sample_two_tokens(dec, PROMPT, 800, target.vocab_size)
    return pooled_chisquare(counts, exact_two_token_distribution(target, PROMPT, sampling))


def check_pruned_vocab_exact(target: TargetModel, make_drafter: Callable[[Path], Drafter], tmp_path: Path) -> None:
    """A drafter over every other token id keeps greedy output exact and still drafts when sampling."""
    path = tmp_path / "vocab.json"
    PrunedVocab(range(0, target.vocab_size, 2), vocab_size=target.vocab_size).save(path)
    drafter = make_drafter(path)
    out = SpeculativeDecoder(target, drafter, 3).generate(PROMPT, 30, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(target, PROMPT, 30)
    sampled = SpeculativeDecoder(target, drafter, 3, SamplingConfig(temperature=1.0))
    assert sampled.generate(PROMPT, 30, stop_token_ids=[]).stats.drafted > 0


def test_pruned_vocab_stays_exact(tiny_target: TargetModel, tmp_path: Path) -> None:
    check_pruned_vocab_exact(tiny_target, lambda path: QuantizedDrafter(bits=8, pruned_vocab=path), tmp_path)


def test_config_instantiates(tiny_target: TargetModel) -> None:
    cfg = OmegaConf.load(Path(conf.__file__).parent / "drafter" / "quantized.yaml")
    drafter = instantiate(cfg, bits=16)
    assert isinstance(drafter, QuantizedDrafter) and drafter.bits == 16 and drafter.backend == "auto"
    drafter.bind(tiny_target)
    assert drafter.memory["copy_bytes"] > 0


def test_yaml_repeats_the_constructor_defaults() -> None:
    """conf/drafter/quantized.yaml builds what QuantizedDrafter() builds: every constructor argument,
    at its default."""
    cfg = OmegaConf.to_container(OmegaConf.load(Path(conf.__file__).parent / "drafter" / "quantized.yaml"))
    assert cfg.pop("_target_") == "drafters.quantized.QuantizedDrafter"
    assert cfg == {n: p.default for n, p in inspect.signature(QuantizedDrafter).parameters.items()}
    assert QuantizedDrafter.hf_counterpart is None


def test_memory_report(tiny_target: TargetModel) -> None:
    sizes = {}
    for bits in (4, 8, 16, 32):
        drafter = QuantizedDrafter(bits=bits)
        drafter.bind(tiny_target)
        sizes[bits] = drafter.memory["copy_bytes"]
        assert drafter.memory["target_bytes"] == tiny_target.weight_bytes
    assert 0 < sizes[4] < sizes[8] < sizes[16] < sizes[32]
    assert sizes[32] == tiny_target.weight_bytes - tiny_target.vocab_size * tiny_target.hidden_size * 4  # no head
    small_groups = QuantizedDrafter(bits=4, group_size=32)
    large_groups = QuantizedDrafter(bits=4, group_size=64)
    small_groups.bind(tiny_target)
    large_groups.bind(tiny_target)
    assert small_groups.memory["copy_bytes"] > large_groups.memory["copy_bytes"]  # twice the scales
    bnb = {}
    for bits in (4, 8, 32):
        drafter = QuantizedDrafter(bits=bits, backend="bitsandbytes", group_size=64)
        drafter.bind(tiny_target)
        bnb[bits] = drafter.memory["copy_bytes"]
    target_bytes = memory_report(tiny_target.model, tiny_target.model)["target_bytes"]
    assert bnb[32] == 0  # the Hugging Face copy shares every tensor
    assert 0 < bnb[4] < bnb[8] < target_bytes


def test_bad_arguments(tiny_target: TargetModel, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bits"):
        QuantizedDrafter(bits=3)
    with pytest.raises(ValueError, match="quant_type"):
        QuantizedDrafter(bits=4, quant_type="int4")
    with pytest.raises(ValueError, match="backend"):
        QuantizedDrafter(backend="gptq")
    with pytest.raises(ValueError, match="group_size"):
        QuantizedDrafter(bits=4, group_size=48)
    with pytest.raises(ValueError, match="bits=8 only"):
        QuantizedDrafter(bits=4, backend="torch")
    with pytest.raises(ValueError, match="bfloat16"):
        QuantizedDrafter(bits=16, backend="bitsandbytes")
    with pytest.raises(ValueError, match="group_size that divides 64"):
        QuantizedDrafter(bits=4, group_size=128).bind(tiny_target)
    path = tmp_path / "vocab.json"
    PrunedVocab([1, 2], vocab_size=99).save(path)
    with pytest.raises(ValueError, match="built for 99 tokens"):
        QuantizedDrafter(pruned_vocab=path).bind(tiny_target)


@pytest.mark.slow
def test_default_target_int4_greedy(default_target: TargetModel) -> None:
    prompt = default_target.tokenizer("def fibonacci(n):")["input_ids"]
    out = SpeculativeDecoder(default_target, QuantizedDrafter(), 3).generate(prompt, 12, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(default_target, prompt, 12)
    assert out.stats.acceptance_rate > 0.5


def test_auto_pruned_vocab_is_the_subset_shipped_for_the_target(tiny_target: TargetModel) -> None:
    """No shipped artifact was made for the tiny target: "auto" means the full vocabulary there."""
    from specdraft.shipped import shipped_pruned_vocab

    assert shipped_pruned_vocab(tiny_target) is None
    drafter = QuantizedDrafter(pruned_vocab="auto")
    drafter.bind(tiny_target)
    assert drafter.vocab is None


def test_a_copy_on_the_target_cache_leaves_the_target_cache_as_it_found_it(tiny_target: TargetModel) -> None:
    """share_kv: the copy writes its drafts after the target's positions and crops them away, so the
    target's cache afterwards is exactly the one it had (same length, same keys and values)."""
    import torch

    from specdraft.protocol import DraftContext

    drafter = QuantizedDrafter(bits=4)
    drafter.bind(tiny_target)
    ids = torch.tensor([PROMPT])
    tiny_target.reset()
    tiny_target.forward(ids[:, :-1], num_logits=0)
    before = [(k.clone(), v.clone()) for k, v in tiny_target.cache_tensors()]
    draft = drafter.propose(DraftContext(ids, None, SamplingConfig(), torch.Generator()), 4)
    assert draft.num_tokens == 4 and tiny_target.cache_length == len(PROMPT) - 1
    for (k0, v0), (k1, v1) in zip(before, tiny_target.cache_tensors()):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)
    drafter.reset()  # the copy's reset must not empty the target's cache
    assert tiny_target.cache_length == len(PROMPT) - 1


@pytest.mark.slow
def test_auto_pruned_vocab_finds_the_default_targets_subset(default_target: TargetModel) -> None:
    from specdraft.shipped import shipped_pruned_vocab

    found = shipped_pruned_vocab(default_target)
    assert found is not None and found.parent.parent.name == "smollm2-135m"
