"""Quantized-copy drafter: greedy exactness for every quantization, the exact-copy invariant
(bits 16/32 accept everything at any temperature), losslessness at temperature 1, memory."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

import conf

from drafters.quantized import QuantizedDrafter, memory_report
from specdraft.decode import SpeculativeDecoder
from specdraft.protocol import Drafter
from specdraft.models import tiny_random_target
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel
from specdraft.vocab import PrunedVocab
from tests.helpers import exact_two_token_distribution, plain_greedy, pooled_chisquare, sample_two_tokens

PROMPT = [1, 2, 3, 1, 2]


@pytest.fixture
def tiny_target() -> TargetModel:
    """Vocab 16, 2 layers, hidden 64: bitsandbytes 4-bit quantizes blocks of 64 inputs."""
    return tiny_random_target(vocab_size=16, seed=1, hidden_size=64)


@pytest.mark.parametrize(
    "kwargs",
    [{"bits": 8}, {"bits": 4, "quant_type": "nf4"}, {"bits": 4, "quant_type": "fp4"},
     {"bits": 8, "backend": "torch"}, {"bits": 8, "share_embeddings": False},
     {"bits": 4, "quant_type": "nf4", "blocksize": 32}],
    ids=["int8", "nf4", "fp4", "torch-int8", "int8-quantized-head", "nf4-blocksize32"],
)
def test_greedy_matches_plain_greedy(tiny_target: TargetModel, kwargs: dict) -> None:
    out = SpeculativeDecoder(tiny_target, QuantizedDrafter(**kwargs), 3).generate(PROMPT, 40, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(tiny_target, PROMPT, 40)
    assert 0 < out.stats.accepted <= out.stats.drafted


@pytest.mark.parametrize("bits", [16, 32])
@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0),
                                      SamplingConfig(temperature=0.7, top_k=5, top_p=0.9)],
                         ids=["greedy", "t1", "topk_topp"])
def test_exact_copy_accepts_everything(tiny_target: TargetModel, bits: int, sampling: SamplingConfig) -> None:
    dec = SpeculativeDecoder(tiny_target, QuantizedDrafter(bits=bits), 4, sampling)
    stats = dec.generate(PROMPT, 60, stop_token_ids=[]).stats
    assert stats.drafted > 0 and stats.acceptance_rate == 1.0


def test_lossless_at_temperature_one(tiny_target: TargetModel) -> None:
    sampling = SamplingConfig(temperature=1.0)
    dec = SpeculativeDecoder(tiny_target, QuantizedDrafter(bits=4, quant_type="fp4"), 2, sampling)
    counts = sample_two_tokens(dec, PROMPT, 800, tiny_target.vocab_size)
    assert pooled_chisquare(counts, exact_two_token_distribution(tiny_target, PROMPT, sampling)) > 1e-4


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
    drafter = instantiate(cfg, bits=4)
    assert isinstance(drafter, QuantizedDrafter) and drafter.bits == 4 and drafter.quant_type == "nf4"
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
    for bits in (4, 8, 32):
        drafter = QuantizedDrafter(bits=bits)
        drafter.bind(tiny_target)
        sizes[bits] = drafter.memory["copy_bytes"]
    target_bytes = memory_report(tiny_target.model, tiny_target.model)["target_bytes"]
    assert sizes[32] == 0  # the exact copy shares every tensor
    assert 0 < sizes[4] < sizes[8] < target_bytes
    small_blocks = QuantizedDrafter(bits=4, blocksize=32)
    small_blocks.bind(tiny_target)
    assert small_blocks.memory["copy_bytes"] > sizes[4]  # twice the absmax scales


def test_bad_arguments(tiny_target: TargetModel, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bits"):
        QuantizedDrafter(bits=3)
    with pytest.raises(ValueError, match="quant_type"):
        QuantizedDrafter(bits=4, quant_type="int4")
    with pytest.raises(ValueError, match="backend"):
        QuantizedDrafter(backend="gptq")
    with pytest.raises(ValueError, match="blocksize"):
        QuantizedDrafter(bits=4, blocksize=48)
    with pytest.raises(ValueError, match="bits=8 only"):
        QuantizedDrafter(bits=4, backend="torch")
    path = tmp_path / "vocab.json"
    PrunedVocab([1, 2], vocab_size=99).save(path)
    with pytest.raises(ValueError, match="built for 99 tokens"):
        QuantizedDrafter(pruned_vocab=path).bind(tiny_target)


@pytest.mark.slow
def test_default_target_int8_greedy(default_target: TargetModel) -> None:
    prompt = default_target.tokenizer("def fibonacci(n):")["input_ids"]
    out = SpeculativeDecoder(default_target, QuantizedDrafter(bits=8), 3).generate(prompt, 12, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(default_target, prompt, 12)
    assert out.stats.acceptance_rate > 0.5
