"""DraftModelDrafter: greedy exactness, KV-cache rollback, statistical losslessness (full and
pruned vocabulary), clear errors, the shipped artifact and the Hydra config."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate
from transformers import PreTrainedModel

import specdraft.draft_loop
from drafters.draft_model import DraftModelDrafter, load_draft_hf_model
from specdraft.decode import SpeculativeDecoder
from specdraft.models import tiny_random_llama
from specdraft.protocol import Draft, DraftContext
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel
from specdraft.formats.draft import build_student, save_draft_artifact
from specdraft.vocab import PrunedVocab
from tests.helpers import exact_two_token_distribution, plain_greedy, pooled_chisquare, sample_two_tokens

PROMPT = [1, 2, 3, 1, 2]


def tiny_draft(seed: int = 7) -> torch.nn.Module:
    return tiny_random_llama(vocab_size=16, seed=seed, init_std=0.3, num_layers=1)


def subset() -> PrunedVocab:
    return PrunedVocab(torch.tensor([0, 1, 2, 3, 5, 7, 8, 9, 11, 12, 14, 15]), 16)


def ctx_of(ids: list[int], sampling: SamplingConfig = SamplingConfig()) -> DraftContext:
    return DraftContext(torch.tensor([ids]), None, sampling, sampling.make_generator())


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("vocab", [None, "subset"])
def test_greedy_matches_plain_greedy(tiny_target: TargetModel, k: int, vocab: str | None) -> None:
    drafter = DraftModelDrafter(tiny_draft(), pruned_vocab=subset() if vocab else None, copy_ngram=None)
    dec = SpeculativeDecoder(tiny_target, drafter, k)
    out = dec.generate(PROMPT, max_new_tokens=40, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(tiny_target, PROMPT, 40)


@pytest.mark.parametrize("copy", [None, 2], ids=["draft", "copying"])
@pytest.mark.parametrize("vocab", [None, "subset"])
def test_siblings_keep_greedy_exact_and_keep_more_tokens(tiny_target: TargetModel, copy: int | None,
                                                         vocab: str | None) -> None:
    """siblings=2: rounds are trees (as deep as the K asked for, up to 3 nodes per depth), greedy output is
    plain greedy's, and the runner-up tokens keep more draft tokens than the chain alone; the stats
    count a tree's depth as drafted. At temperature > 0 and in a batch the draft stays a chain.
    The target's verify-cost curve is set flat (every sibling is worth its position): a tiny model's
    measured curve is noise."""
    prompt = PROMPT * 3
    tiny_target.verify_costs[1] = [1.0] * 40  # what specdraft.costs.verify_curve reads for batch size 1
    kept = []
    for siblings in (0, 2):
        drafter = DraftModelDrafter(tiny_draft(), pruned_vocab=subset() if vocab else None, copy_ngram=copy,
                                    siblings=siblings)
        dec = SpeculativeDecoder(tiny_target, drafter, 3)
        out = dec.generate(prompt, max_new_tokens=40, stop_token_ids=[])
        assert out.token_ids[0].tolist() == plain_greedy(tiny_target, prompt, 40)
        assert max(out.stats.drafted_per_round) <= 3
        kept.append(out.stats.accepted / out.stats.rounds)
        if siblings:
            fresh = [5, 9, 13, 2]  # no repeats: the model drafts (a copy round would be a chain)
            drafter.reset()
            tree = drafter.propose(ctx_of(fresh), 3)
            assert tree.parents is not None and 3 < tree.num_tokens <= 9
            drafter.reset()
            assert drafter.propose(ctx_of(fresh, SamplingConfig(temperature=1.0)), 3).parents is None
            drafter.reset()
            rows = DraftContext(torch.tensor([fresh, fresh]), None, SamplingConfig(), SamplingConfig().make_generator())
            assert drafter.propose(rows, 3).parents is None
    assert kept[1] > kept[0]
    with pytest.raises(ValueError, match="siblings must be an integer"):
        DraftModelDrafter(tiny_draft(), siblings=-1)


def test_a_batch_that_shrinks_to_one_row_drafts_trees_and_stays_exact(tiny_target: TargetModel) -> None:
    """generate_batch: rows stop at a stop token at different rounds; once one row is left its rounds are
    sibling trees (flat verify-cost curve), and every row's output is what it gets alone as a chain."""
    tiny_target.verify_costs[1] = [1.0] * 40  # every sibling pays (a tiny model's measured curve is noise)
    drafter = DraftModelDrafter(tiny_draft(), copy_ngram=None)
    trees = []  # per proposal: whether it was a tree
    propose = drafter.propose

    def recording(ctx: DraftContext, k: int) -> Draft:
        draft = propose(ctx, k)
        trees.append(draft.parents is not None)
        return draft

    drafter.propose = recording  # type: ignore[method-assign]
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 16, (n,), generator=g).tolist() for n in (3, 9, 5)]
    batch = SpeculativeDecoder(tiny_target, drafter, 3).generate_batch(prompts, 30, stop_token_ids=[4])
    for prompt, result in zip(prompts, batch.results):
        alone = SpeculativeDecoder(tiny_target, DraftModelDrafter(tiny_draft(), copy_ngram=None, siblings=0), 3)
        assert result.token_ids[0].tolist() == alone.generate(prompt, 30, stop_token_ids=[4]).token_ids[0].tolist()
    assert any(trees) and not all(trees)


def test_greedy_draft_equal_to_target_accepts_everything(tiny_target: TargetModel) -> None:
    dec = SpeculativeDecoder(tiny_target, DraftModelDrafter(tiny_target.model, pruned_vocab=None, copy_ngram=None), 4)
    out = dec.generate(PROMPT, max_new_tokens=20, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(tiny_target, PROMPT, 20)
    assert out.stats.acceptance_rate == 1.0


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0, seed=3)])
def test_rollback_leaves_no_stale_kv(tiny_target: TargetModel, sampling: SamplingConfig) -> None:
    drafter = DraftModelDrafter(tiny_draft(), pruned_vocab=subset(), copy_ngram=None)
    drafter.bind(tiny_target)
    drafter.reset()
    first = drafter.propose(ctx_of(PROMPT, sampling), 4).token_ids[0].tolist()
    recovered = (first[1] + 1) % 16  # the target kept 1 draft token, then emitted another token
    committed = PROMPT + first[:1] + [recovered]
    drafter.commit(ctx_of(committed, sampling), [1])
    again = drafter.propose(ctx_of(committed, sampling), 3)

    fresh = DraftModelDrafter(tiny_draft(), pruned_vocab=subset(), copy_ngram=None)
    fresh.bind(tiny_target)
    ref = fresh.propose(ctx_of(committed, sampling), 3)
    assert again.token_ids.tolist() == ref.token_ids.tolist()
    torch.testing.assert_close(again.probs, ref.probs, atol=1e-5, rtol=1e-4)


def test_full_acceptance_feeds_last_draft_and_bonus(tiny_target: TargetModel) -> None:
    drafter = DraftModelDrafter(tiny_draft(), pruned_vocab=None, copy_ngram=None)
    drafter.bind(tiny_target)
    first = drafter.propose(ctx_of(PROMPT), 3).token_ids[0].tolist()
    committed = PROMPT + first + [4]  # all 3 accepted + a bonus token
    drafter.commit(ctx_of(committed), [3])
    again = drafter.propose(ctx_of(committed), 2)
    fresh = DraftModelDrafter(tiny_draft(), pruned_vocab=None, copy_ngram=None)
    fresh.bind(tiny_target)
    assert again.token_ids.tolist() == fresh.propose(ctx_of(committed), 2).token_ids.tolist()


def test_pruned_q_is_zero_outside_subset(tiny_target: TargetModel) -> None:
    drafter = DraftModelDrafter(tiny_draft(), pruned_vocab=subset(), copy_ngram=None)
    drafter.bind(tiny_target)
    draft = drafter.propose(ctx_of(PROMPT, SamplingConfig(temperature=1.0)), 3)
    outside = torch.tensor([4, 6, 10, 13])
    assert draft.probs.shape == (1, 3, 16)
    assert float(draft.probs[..., outside].abs().sum()) == 0.0
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(1, 3))
    assert set(draft.token_ids[0].tolist()) <= set(subset().ids.tolist())


@pytest.mark.parametrize(
    ("sampling", "vocab"),
    [(SamplingConfig(temperature=1.0), None), (SamplingConfig(temperature=0.8, top_p=0.9), "subset")],
    ids=["t1_full", "topp_pruned"],
)
def test_statistically_lossless(tiny_target: TargetModel, sampling: SamplingConfig, vocab: str | None) -> None:
    drafter = DraftModelDrafter(tiny_draft(), pruned_vocab=subset() if vocab else None, copy_ngram=None)
    dec = SpeculativeDecoder(tiny_target, drafter, 2, sampling)
    expected = exact_two_token_distribution(tiny_target, PROMPT, sampling)
    counts = sample_two_tokens(dec, PROMPT, 1200, tiny_target.vocab_size)
    assert pooled_chisquare(counts, expected) > 1e-4


@pytest.mark.parametrize("k", [1, 4])
def test_copying_greedy_matches_plain_greedy(tiny_target: TargetModel, k: int) -> None:
    drafter = DraftModelDrafter(tiny_draft(), pruned_vocab=subset(), copy_ngram=1, copy_max_ngram=3)
    out = SpeculativeDecoder(tiny_target, drafter, k).generate(PROMPT, max_new_tokens=40, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(tiny_target, PROMPT, 40)


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0, seed=3)], ids=["greedy", "t1"])
def test_copy_first_rounds_skip_the_draft_and_its_cache_catches_up(tiny_target: TargetModel,
                                                                    sampling: SamplingConfig) -> None:
    """copy_first: a round whose last 2 tokens occurred earlier is the copy (the draft does not run);
    the next drafted round feeds the draft every token it missed. Greedy output is plain greedy's."""
    drafter = DraftModelDrafter(tiny_draft(), pruned_vocab=subset(), copy_ngram=2, copy_first=True)
    drafter.bind(tiny_target)
    assert drafter.draft_sources == ("copy", "model") == DraftModelDrafter(tiny_draft()).draft_sources
    assert DraftModelDrafter(tiny_draft(), copy_first=False).draft_sources == ()
    copied = drafter.propose(ctx_of([9, 4, 6, 10, 13, 5, 9, 4], sampling), 3)
    assert copied.token_ids[0].tolist() == [6, 10, 13] and copied.probs is None
    model_rounds = []
    draft = drafter._draft
    drafter._draft = lambda ctx, k: model_rounds.append(k) or draft(ctx, k)  # type: ignore[method-assign]
    dec = SpeculativeDecoder(tiny_target, drafter, 4)
    out = dec.generate(PROMPT, max_new_tokens=40, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(tiny_target, PROMPT, 40)
    assert 0 < len(model_rounds) < out.stats.rounds
    alone = DraftModelDrafter(tiny_draft(), copy_ngram=None)  # no copying at all, copy_first included
    assert alone.draft_sources == () and not alone.copy_first


def test_copying_proposes_what_followed_the_earlier_occurrence(tiny_target: TargetModel) -> None:
    drafter = DraftModelDrafter(tiny_draft(), pruned_vocab=subset(), copy_ngram=2, copy_weight=1.0, copy_first=False)
    drafter.bind(tiny_target)
    draft = drafter.propose(ctx_of([9, 4, 6, 10, 13, 5, 9, 4]), 3)  # 4, 6, 10 are outside the subset
    assert draft.token_ids[0].tolist() == [6, 10, 13]
    sampled = drafter.propose(ctx_of([9, 4, 6, 10, 13, 5, 9, 4], SamplingConfig(temperature=1.0)), 3)
    assert sampled.token_ids[0].tolist() == [6, 10, 13]  # weight 1: q is one-hot on the copy
    torch.testing.assert_close(sampled.probs, torch.nn.functional.one_hot(torch.tensor([[6, 10, 13]]), 16).float())


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0, seed=3)])
def test_copying_rollback_leaves_no_stale_kv(tiny_target: TargetModel, sampling: SamplingConfig) -> None:
    prompt = [9, 4, 6, 10, 13, 5, 9, 4, 6]  # the copies 10, 13 are drafted but not fed to the draft (greedy)
    drafter = DraftModelDrafter(tiny_draft(), pruned_vocab=subset(), copy_ngram=2, copy_first=False)
    drafter.bind(tiny_target)
    first = drafter.propose(ctx_of(prompt, sampling), 4).token_ids[0].tolist()
    committed = prompt + first[:2] + [7]  # two kept, then a recovered token
    drafter.commit(ctx_of(committed, sampling), [2])
    again = drafter.propose(ctx_of(committed, sampling), 3)
    fresh = DraftModelDrafter(tiny_draft(), pruned_vocab=subset(), copy_ngram=2, copy_first=False)
    fresh.bind(tiny_target)
    ref = fresh.propose(ctx_of(committed, sampling), 3)
    assert again.token_ids.tolist() == ref.token_ids.tolist()
    torch.testing.assert_close(again.probs, ref.probs, atol=1e-5, rtol=1e-4)


def test_copying_is_statistically_lossless(tiny_target: TargetModel) -> None:
    """Top-p on the pruned vocabulary: the mixture is formed over V after expanding q (the negative
    control below runs at T = 1 on the full vocabulary)."""
    sampling = SamplingConfig(temperature=0.8, top_p=0.9)
    drafter = DraftModelDrafter(tiny_draft(), pruned_vocab=subset(), copy_ngram=1, copy_weight=0.6, copy_first=False)
    dec = SpeculativeDecoder(tiny_target, drafter, 2, sampling)
    expected = exact_two_token_distribution(tiny_target, PROMPT, sampling)
    counts = sample_two_tokens(dec, PROMPT, 1200, tiny_target.vocab_size)
    assert pooled_chisquare(counts, expected) > 1e-4


def test_the_default_copying_first_is_statistically_lossless(tiny_target: TargetModel) -> None:
    """The default draft model (copy_first) at T = 1: PROMPT's last 2 tokens occurred earlier, so the
    first round is a copy (one-hot q) and later rounds the draft's mixed q; the first two tokens keep
    the target's exact distribution."""
    sampling = SamplingConfig(temperature=1.0)
    drafter = DraftModelDrafter(tiny_draft(), pruned_vocab=subset())
    drafter.bind(tiny_target)
    assert drafter.source_of(ctx_of(PROMPT, sampling)) == [0]  # a copy drafts the first round
    dec = SpeculativeDecoder(tiny_target, drafter, 2, sampling)
    expected = exact_two_token_distribution(tiny_target, PROMPT, sampling)
    counts = sample_two_tokens(dec, PROMPT, 1200, tiny_target.vocab_size)
    assert pooled_chisquare(counts, expected) > 1e-4


def test_negative_control_copy_missing_from_q_fails(tiny_target: TargetModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A drafter that draws copies but reports its unmixed q must fail the same test."""
    mix = specdraft.draft_loop.mix_in_copy

    def unmixed(q: torch.Tensor, copy_id: int, weight: float, gen: torch.Generator):
        return q, mix(q.clone(), copy_id, weight, gen)[1]

    monkeypatch.setattr(specdraft.draft_loop, "mix_in_copy", unmixed)
    sampling = SamplingConfig(temperature=1.0)
    drafter = DraftModelDrafter(tiny_draft(), pruned_vocab=None, copy_ngram=1, copy_weight=0.9, copy_first=False)
    dec = SpeculativeDecoder(tiny_target, drafter, 2, sampling)
    expected = exact_two_token_distribution(tiny_target, PROMPT, sampling)
    counts = sample_two_tokens(dec, PROMPT, 1200, tiny_target.vocab_size)
    assert pooled_chisquare(counts, expected) < 1e-4


@pytest.mark.parametrize("batch", [1, 3], ids=["alone", "batch"])
def test_a_confidence_stop_keeps_greedy_exact_and_shortens_drafts(tiny_target: TargetModel, batch: int) -> None:
    """With confidence_threshold rounds end at the draft's first unsure token: some rounds draft fewer
    than the K asked for, and greedy output is still plain greedy's, alone and row by row in a batch."""
    from specdraft.models import tiny_random_target

    target = tiny_random_target(vocab_size=16, seed=9) if batch > 1 else tiny_target
    drafter = DraftModelDrafter(tiny_draft(), pruned_vocab=None, copy_ngram=None, confidence_threshold=0.5)
    dec = SpeculativeDecoder(target, drafter, 4)
    prompts = [PROMPT, PROMPT[:3], PROMPT[2:]][:batch]
    out = dec.generate_batch(prompts, max_new_tokens=30, stop_token_ids=[])
    for prompt, row in zip(prompts, out):
        assert row.token_ids[0].tolist() == plain_greedy(target, prompt, 30)
    drafted = [k for row in out for k in row.stats.drafted_per_round[:-2]]  # the last rounds meet the budget
    assert any(0 < k < 4 for k in drafted) and max(drafted) > 1
    with pytest.raises(ValueError, match="confidence_threshold"):
        DraftModelDrafter(tiny_draft(), confidence_threshold=1.0)


def test_a_confidence_stop_is_statistically_lossless(tiny_target: TargetModel) -> None:
    """The stop depends on the draft's own q only, so the sampled output keeps the target's law."""
    sampling = SamplingConfig(temperature=1.0)
    drafter = DraftModelDrafter(tiny_draft(), pruned_vocab=None, copy_ngram=None, confidence_threshold=0.3)
    dec = SpeculativeDecoder(tiny_target, drafter, 3, sampling)
    expected = exact_two_token_distribution(tiny_target, PROMPT, sampling)
    counts = sample_two_tokens(dec, PROMPT, 1200, tiny_target.vocab_size)
    assert pooled_chisquare(counts, expected) > 1e-4


def test_bad_copy_settings_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="copy_ngram"):
        DraftModelDrafter(copy_ngram=5, copy_max_ngram=4)
    with pytest.raises(ValueError, match="copy_weight"):
        DraftModelDrafter(copy_ngram=2, copy_weight=0.0)


def test_vocab_size_mismatch_names_both_sizes(tiny_target: TargetModel) -> None:
    drafter = DraftModelDrafter(tiny_random_llama(vocab_size=32, seed=2), pruned_vocab=None)
    with pytest.raises(ValueError, match=r"32 tokens.*16"):
        drafter.bind(tiny_target)


def test_pruned_vocab_for_another_vocabulary(tiny_target: TargetModel) -> None:
    drafter = DraftModelDrafter(tiny_draft(), pruned_vocab=PrunedVocab(torch.arange(8), 64))
    with pytest.raises(ValueError, match="64 tokens"):
        drafter.bind(tiny_target)


def test_missing_checkpoint_is_a_clear_error(tiny_target: TargetModel, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist|unknown model"):
        DraftModelDrafter(str(tmp_path / "nope")).bind(tiny_target)
    (tmp_path / "draft.json").write_text("{}")
    (tmp_path / "draft.safetensors").write_bytes(b"")
    (tmp_path / "draft.json").unlink()
    with pytest.raises(ValueError, match="config.json"):
        DraftModelDrafter(str(tmp_path)).bind(tiny_target)


class FakeTokenizer:
    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def __len__(self) -> int:
        return len(self.texts)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.texts[i] for i in ids]


def test_different_tokenizer_warns_or_raises() -> None:
    same = FakeTokenizer([f"t{i}" for i in range(16)])
    other = FakeTokenizer([f"u{i}" for i in range(16)])
    DraftModelDrafter(tiny_draft())._check_token_texts(same, FakeTokenizer(list(same.texts)))
    with pytest.warns(UserWarning, match="tokenizer differs"):
        DraftModelDrafter(tiny_draft())._check_token_texts(other, same)
    with pytest.raises(ValueError, match="tokenizer differs"):
        DraftModelDrafter(tiny_draft(), strict_tokenizer=True)._check_token_texts(other, same)


def test_exported_artifact_round_trip(tiny_target: TargetModel, tmp_path: Path) -> None:
    student = build_student(tiny_target.model, [1])
    save_draft_artifact(student, subset(), [1], tmp_path, {"command": "test"})
    hf = load_draft_hf_model(str(tmp_path), tiny_target)
    assert isinstance(hf, PreTrainedModel)
    ids = torch.tensor([PROMPT])
    torch.testing.assert_close(hf(ids).logits, student(ids).logits, atol=2e-2, rtol=1e-2)  # float16 weights
    dec = SpeculativeDecoder(tiny_target, DraftModelDrafter(str(tmp_path)), 3)
    assert dec.drafter.vocab is not None and dec.drafter.vocab.size == 12
    out = dec.generate(PROMPT, max_new_tokens=20, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(tiny_target, PROMPT, 20)


def test_hydra_config_instantiates() -> None:
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        cfg = compose(config_name="train_distill")  # exists beside the drafter config
        drafter_cfg = compose(config_name="drafter/draft_model").drafter
    GlobalHydra.instance().clear()
    drafter = instantiate(drafter_cfg)
    assert isinstance(drafter, DraftModelDrafter)
    assert drafter.model_spec == "smollm2-135m/draft" and cfg.vocab.size > 0
    assert (drafter.copy_ngram, drafter.copy_weight) == (2, 0.9)  # copying is on for the shipped draft


def test_no_argument_drafter_is_the_yaml_drafter() -> None:
    """The Python API and `drafter=draft_model` build the same drafter (the YAML repeats the defaults)."""
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        yaml = compose(config_name="drafter/draft_model").drafter
    GlobalHydra.instance().clear()
    defaults = {k: p.default for k, p in inspect.signature(DraftModelDrafter).parameters.items()}
    assert {k: yaml[k] for k in defaults} == defaults
    assert set(yaml) - {"_target_"} == set(defaults)
    assert DraftModelDrafter.hf_counterpart == "hf_assisted"


@pytest.mark.slow
@pytest.mark.parametrize("siblings", [0, 1], ids=["chain", "siblings"])
def test_shipped_draft_greedy_exact_on_default_target(default_target: TargetModel, siblings: int) -> None:
    """As configured by default (siblings=1: the draft plus copying, its runner-up tokens as tree
    leaves where the verify-cost curve pays) and as a plain chain (siblings=0)."""
    tok = default_target.tokenizer
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is a Python list comprehension?"}], add_generation_prompt=True
    )
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    dec = SpeculativeDecoder(default_target, DraftModelDrafter(siblings=siblings), 4)
    out = dec.generate(prompt, max_new_tokens=32, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(default_target, prompt, 32)
    assert out.stats.acceptance_rate > 0.1  # a trained draft; an untrained one accepts ~0.0


def test_hf_peer_kwargs_give_the_bound_draft_as_assistant(tiny_target: TargetModel) -> None:
    draft = tiny_draft()
    drafter = DraftModelDrafter(draft, pruned_vocab=subset(), copy_ngram=None)
    with pytest.raises(ValueError, match="bind the drafter"):
        drafter.hf_peer_kwargs()
    drafter.bind(tiny_target)
    assert drafter.hf_peer_kwargs() == {"assistant_model": draft}  # full-vocabulary head, same weights


def test_propose_twice_on_the_same_context_is_repeatable(tiny_target: TargetModel) -> None:
    drafter = DraftModelDrafter(tiny_draft(), pruned_vocab=None, copy_ngram=None)
    drafter.bind(tiny_target)
    ctx = ctx_of(PROMPT)
    first = drafter.propose(ctx, 1)  # the cache now holds the whole context
    drafter.commit(ctx, [0])
    assert drafter.propose(ctx, 1).token_ids.tolist() == first.token_ids.tolist()
