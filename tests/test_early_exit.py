"""Early-exit self-drafting: greedy exactness, losslessness at temperature 1, the full-depth
invariant, and the shared KV cache (after a partial acceptance the target's cache equals a plain
forward over the accepted sequence, for layers below and above the exit)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from transformers import DynamicCache

import conf

from drafters.early_exit import EarlyExitDrafter, resolve_adapter
from specdraft.decode import SpeculativeDecoder
from specdraft.models import tiny_random_target
from specdraft.protocol import DraftContext
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel
from specdraft.vocab import VOCAB_FILE, resolve_pruned_vocab
from specdraft.formats.exit_adapter import ExitAdapter, save_adapter
from tests.test_quantized import check_pruned_vocab_exact
from tests.helpers import exact_two_token_distribution, plain_greedy, pooled_chisquare, sample_two_tokens

PROMPT = [1, 2, 3, 1, 2]
LAYERS = 4


@pytest.fixture
def deep_target() -> TargetModel:
    """Vocab 16, 4 layers, random weights, no EOS."""
    return tiny_random_target(vocab_size=16, seed=1, num_layers=LAYERS)


def random_adapter(context: bool) -> ExitAdapter:
    """A random (non-identity) adapter for the 32-wide tiny target."""
    torch.manual_seed(0)
    adapter = ExitAdapter(hidden_size=32, width=16, context=context)
    for down in adapter.down:
        torch.nn.init.normal_(down.weight, std=0.3)
    return adapter


@pytest.fixture(params=[False, True], ids=["plain", "context"])
def adapter_dir(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A random adapter for exit layer 2 of the 4-layer tiny target, plain and context."""
    return save_adapter(random_adapter(request.param), tmp_path / "adapter", {"exit_layer": 2})


def cache_tensors(target: TargetModel) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) of every layer of the target's cache, [B, heads, T, d] each."""
    return [(k.clone(), v.clone()) for k, v in target.cache_tensors()]


def plain_cache(target: TargetModel, token_ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Cache of a plain full forward (no specdraft code) over token_ids."""
    cache = DynamicCache(config=target.config)
    with torch.inference_mode():
        target.model(torch.tensor([token_ids]), cache=cache, use_cache=True)
    return [(layer.keys, layer.values) for layer in cache.layers]


@pytest.mark.parametrize("exit_layer", [1, 2, 3])
@pytest.mark.parametrize("share_kv", [True, False])
def test_greedy_matches_plain_greedy(deep_target: TargetModel, exit_layer: int, share_kv: bool) -> None:
    drafter = EarlyExitDrafter(exit_layer=exit_layer, adapter=None, share_kv=share_kv)
    out = SpeculativeDecoder(deep_target, drafter, 3).generate(PROMPT, 40, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(deep_target, PROMPT, 40)
    assert out.stats.drafted > 0


def test_greedy_with_adapter_matches_plain_greedy(deep_target: TargetModel, adapter_dir: Path) -> None:
    drafter = EarlyExitDrafter(adapter=adapter_dir)
    assert drafter.exit_layer == 2
    out = SpeculativeDecoder(deep_target, drafter, 4).generate([3], 40, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(deep_target, [3], 40)


def test_context_adapter_reads_the_target_feature_then_its_own(deep_target: TargetModel) -> None:
    """The first draft token's q is the adapter on layer 2's hidden state of the newest token and the
    target's post-norm final hidden state of the position before it; the second reads the exit's
    own output at the first draft position (checked against a plain HF forward)."""
    from specdraft.formats.exit_adapter import exit_hidden
    from specdraft.protocol import DraftContext

    adapter = random_adapter(context=True)
    with torch.no_grad():
        adapter.up[0].weight[:, 32:] *= 10  # let the feature move q visibly
    drafter = EarlyExitDrafter(exit_layer=2, adapter=None, copy_ngram=None)  # the exit itself
    drafter.adapter = adapter
    drafter.bind(deep_target)
    sampling = SamplingConfig(temperature=1.0)
    ids = torch.tensor([PROMPT])
    deep_target.reset()
    prefill = deep_target.forward(ids[:, :-1], num_logits=0)
    ctx = DraftContext(ids, prefill.hidden[:, -1], sampling, sampling.make_generator())
    draft = drafter.propose(ctx, 2)
    with torch.inference_mode():
        hs = deep_target.model(torch.cat([ids, draft.token_ids[:, :1]], 1), output_hidden_states=True).hidden_states
        first = exit_hidden(deep_target, hs[2][:, -2], adapter, hs[-1][:, -3])  # [1, H]
        second = exit_hidden(deep_target, hs[2][:, -1], adapter, first)
        for got, out in zip(draft.probs[0], (first, second), strict=True):
            torch.testing.assert_close(got, torch.softmax(deep_target.lm_head(out).float(), -1)[0], rtol=1e-4, atol=1e-5)
        # and not with the feature one position off (the test can tell them apart)
        shifted = exit_hidden(deep_target, hs[2][:, -2], adapter, hs[-1][:, -2])
        assert (draft.probs[0, 0] - torch.softmax(deep_target.lm_head(shifted).float(), -1)[0]).abs().max() > 1e-2


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0)], ids=["greedy", "t1"])
def test_full_depth_exit_accepts_everything(deep_target: TargetModel, sampling: SamplingConfig) -> None:
    dec = SpeculativeDecoder(deep_target, EarlyExitDrafter(exit_layer=LAYERS, adapter=None, copy_ngram=None), 4, sampling)
    stats = dec.generate(PROMPT, 60, stop_token_ids=[]).stats
    assert stats.drafted > 0 and stats.acceptance_rate == 1.0


def test_pruned_vocab_stays_exact(deep_target: TargetModel, tmp_path: Path) -> None:
    check_pruned_vocab_exact(deep_target, lambda path: EarlyExitDrafter(exit_layer=2, adapter=None, pruned_vocab=path),
                             tmp_path)


def test_config_instantiates(adapter_dir: Path) -> None:
    cfg = OmegaConf.load(Path(conf.__file__).parent / "drafter" / "early_exit.yaml")
    drafter = instantiate(cfg, exit_layer=None, adapter=str(adapter_dir))
    assert isinstance(drafter, EarlyExitDrafter) and drafter.exit_layer == 2 and drafter.share_kv


def test_yaml_repeats_the_constructor_defaults() -> None:
    """conf/drafter/early_exit.yaml builds what EarlyExitDrafter() builds: every constructor argument,
    at its default."""
    cfg = OmegaConf.to_container(OmegaConf.load(Path(conf.__file__).parent / "drafter" / "early_exit.yaml"))
    cfg.pop("_target_")
    defaults = {n: p.default for n, p in inspect.signature(EarlyExitDrafter).parameters.items()}
    assert cfg == defaults
    built = instantiate(OmegaConf.create({"_target_": "drafters.early_exit.EarlyExitDrafter", **cfg}))
    plain = EarlyExitDrafter()
    assert (built.exit_layer, built.adapter_dir, built.share_kv, built.pruned_vocab_spec) == (
        plain.exit_layer, plain.adapter_dir, plain.share_kv, plain.pruned_vocab_spec)
    assert EarlyExitDrafter.hf_counterpart == "hf_early_exit"


def test_partial_exit_rejects_something(deep_target: TargetModel) -> None:
    """Guards the invariant test: a shallow exit is a different model and does get rejected."""
    stats = SpeculativeDecoder(deep_target, EarlyExitDrafter(exit_layer=1, adapter=None), 4).generate(
        PROMPT, 60, stop_token_ids=[]
    ).stats
    assert stats.acceptance_rate < 1.0


def test_lossless_at_temperature_one(deep_target: TargetModel, adapter_dir: Path) -> None:
    sampling = SamplingConfig(temperature=1.0)
    dec = SpeculativeDecoder(deep_target, EarlyExitDrafter(adapter=adapter_dir), 2, sampling)
    counts = sample_two_tokens(dec, PROMPT, 800, deep_target.vocab_size)
    assert pooled_chisquare(counts, exact_two_token_distribution(deep_target, PROMPT, sampling)) > 1e-4


def test_shared_cache_after_partial_acceptance(deep_target: TargetModel) -> None:
    """Draft 4 tokens through layers < 2, verify reusing them, keep 2: every layer's cache equals
    a plain forward over the kept sequence."""
    drafter = EarlyExitDrafter(exit_layer=2, adapter=None, copy_ngram=None)  # the exit itself
    drafter.bind(deep_target)
    ctx_ids = torch.tensor([PROMPT])
    deep_target.reset()
    deep_target.forward(ctx_ids[:, :-1], num_logits=0)
    ctx = SamplingConfig()
    from specdraft.protocol import DraftContext

    draft = drafter.propose(DraftContext(ctx_ids, None, ctx, ctx.make_generator()), 4)
    assert [k.shape[2] for k, _ in deep_target.cache_tensors()] == [8, 8, 4, 4]
    assert deep_target.cache_length == 4
    inputs = torch.cat([ctx_ids[:, -1:], draft.token_ids], dim=1)  # [1, 5]
    shared = deep_target.forward(inputs).logits
    deep_target.crop(len(PROMPT) + 2)
    kept = PROMPT + draft.token_ids[0, :2].tolist()
    for (k, v), (k_ref, v_ref) in zip(cache_tensors(deep_target), plain_cache(deep_target, kept), strict=True):
        torch.testing.assert_close(k, k_ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(v, v_ref, rtol=1e-4, atol=1e-4)
    # the shared verify computed the same logits as a plain forward over prompt + draft
    with torch.inference_mode():
        full = deep_target.model(torch.cat([ctx_ids, draft.token_ids], dim=1)).logits[:, -5:]
    torch.testing.assert_close(shared, full, rtol=1e-4, atol=1e-4)


def test_shared_cache_after_decoding(deep_target: TargetModel) -> None:
    """After a whole generation, the cache holds exactly the committed tokens but the newest."""
    dec = SpeculativeDecoder(deep_target, EarlyExitDrafter(exit_layer=2, adapter=None), 3, SamplingConfig(temperature=1.0))
    out = dec.generate(PROMPT, 23, stop_token_ids=[])
    assert out.stats.accepted < out.stats.drafted  # there were rejections to roll back
    committed = PROMPT + out.token_ids[0].tolist()
    for (k, v), (k_ref, v_ref) in zip(
        cache_tensors(deep_target), plain_cache(deep_target, committed[:-1]), strict=True
    ):
        torch.testing.assert_close(k, k_ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(v, v_ref, rtol=1e-4, atol=1e-4)


def test_forward_with_other_tokens_recomputes(deep_target: TargetModel) -> None:
    """Pending prefix positions that do not match the verify inputs are dropped, not reused."""
    deep_target.reset()
    deep_target.forward(torch.tensor([PROMPT[:-1]]), num_logits=0)
    deep_target.forward_prefix(torch.tensor([[PROMPT[-1]]]), 2)
    deep_target.forward_prefix(torch.tensor([[5]]), 2)
    logits = deep_target.forward(torch.tensor([[PROMPT[-1], 6]])).logits
    with torch.inference_mode():
        ref = deep_target.model(torch.tensor([PROMPT + [6]])).logits[:, -2:]
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
    assert deep_target.cache_length == len(PROMPT) + 1


def test_bad_arguments(deep_target: TargetModel, adapter_dir: Path) -> None:
    with pytest.raises(ValueError, match="exit_layer"):
        EarlyExitDrafter(exit_layer=0, adapter=None)
    with pytest.raises(ValueError, match="without an adapter"):
        EarlyExitDrafter(adapter=None)
    with pytest.raises(ValueError, match="trained at exit_layer=2"):
        EarlyExitDrafter(exit_layer=3, adapter=adapter_dir)
    with pytest.raises(ValueError, match="layers"):
        EarlyExitDrafter(exit_layer=LAYERS + 1, adapter=None).bind(deep_target)
    with pytest.raises(ValueError, match="neither a directory"):
        EarlyExitDrafter(exit_layer=1, adapter="no-such-adapter")


def test_batch_size_one_only(deep_target: TargetModel) -> None:
    """The shared prefix cache is one sequence's: a batch is refused up front, naming the reason."""
    drafter = EarlyExitDrafter(exit_layer=2, adapter=None)
    assert EarlyExitDrafter.batched is False
    dec = SpeculativeDecoder(deep_target, drafter, 3)
    with pytest.raises(ValueError, match="batch"):
        dec.generate_batch([PROMPT, [3, 4]], 8, stop_token_ids=[])
    drafter.keep_rows([0])  # batch size 1: a no-op
    with pytest.raises(ValueError, match="batch size 1"):
        drafter.keep_rows([1])
    with pytest.raises(ValueError, match="batch size 1"):
        drafter.propose(DraftContext(torch.tensor([[1, 2], [3, 4]]), None, SamplingConfig(), torch.Generator()), 2)
    out = dec.generate_batch([PROMPT], 8, stop_token_ids=[])  # a batch of one is fine
    assert out[0].token_ids[0].tolist() == plain_greedy(deep_target, PROMPT, 8)


def test_shipped_adapter_is_the_default() -> None:
    """With no arguments: the adapter shipped for the default target (also by its full shipped
    name): exit layer 6, <= 10 MB, with the pruned vocabulary it was trained on."""
    drafter = EarlyExitDrafter()
    assert drafter.exit_layer == 6 and drafter.adapter is not None and drafter.adapter.hidden_size == 576
    assert drafter.adapter.context  # reads the target's final hidden state of the position before
    shipped = resolve_adapter("smollm2-135m")
    assert drafter.adapter_dir == shipped == resolve_adapter("smollm2-135m/early_exit")
    vocab = resolve_pruned_vocab(drafter.pruned_vocab_spec, shipped, 49152)
    assert vocab is not None and (shipped / VOCAB_FILE).is_file() and vocab.size < 49152
    assert sum(f.stat().st_size for f in shipped.iterdir()) <= 10 * 2**20
    assert "specdraft-train-early-exit" in json.loads((shipped / "adapter_config.json").read_text())["command"]


@pytest.mark.slow
@pytest.mark.parametrize("adapter", [None, "smollm2-135m"], ids=["no-adapter", "shipped-adapter"])
def test_default_target_greedy(default_target: TargetModel, adapter: str | None) -> None:
    prompt = default_target.tokenizer("def fibonacci(n):")["input_ids"]
    out = SpeculativeDecoder(default_target, EarlyExitDrafter(exit_layer=6, adapter=adapter), 3).generate(
        prompt, 24, stop_token_ids=[]
    )
    assert out.token_ids[0].tolist() == plain_greedy(default_target, prompt, 24)
    if adapter is not None:  # the trained exit does get accepted on code
        assert out.stats.accepted > 0


@pytest.mark.parametrize("share_kv", [True, False])
def test_copy_first_rounds_and_exit_rounds_share_the_cache(deep_target: TargetModel, share_kv: bool) -> None:
    """With copy_ngram=1 most rounds copy and the rest run the exit on the shared cache: the output is
    still plain greedy's, and both kinds of rounds happened."""
    drafter = EarlyExitDrafter(exit_layer=2, adapter=None, share_kv=share_kv, copy_ngram=1)
    exit_rounds = []
    exit_draft = drafter._exit_draft
    drafter._exit_draft = lambda ctx, k: exit_rounds.append(k) or exit_draft(ctx, k)  # type: ignore[method-assign]
    out = SpeculativeDecoder(deep_target, drafter, 3).generate(PROMPT, 40, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(deep_target, PROMPT, 40)
    assert 0 < len(exit_rounds) < out.stats.rounds


@pytest.mark.parametrize("share_kv", [True, False])
def test_a_confidence_stop_shortens_exit_drafts_and_keeps_greedy_exact(deep_target: TargetModel, share_kv: bool) -> None:
    """confidence_threshold ends an exit round at its first unsure token: some rounds draft fewer than
    K, on the shared cache as well, and greedy output is plain greedy's. A threshold outside (0, 1) is
    a clear error."""
    drafter = EarlyExitDrafter(exit_layer=2, adapter=None, share_kv=share_kv, copy_ngram=None, confidence_threshold=0.5)
    out = SpeculativeDecoder(deep_target, drafter, 4).generate(PROMPT, 40, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(deep_target, PROMPT, 40)
    assert any(0 < k < 4 for k in out.stats.drafted_per_round[:-2])
    with pytest.raises(ValueError, match="confidence_threshold"):
        EarlyExitDrafter(exit_layer=2, adapter=None, confidence_threshold=0.0)
