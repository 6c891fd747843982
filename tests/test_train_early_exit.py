"""Exit-adapter training: the loss goes down on a tiny target, the adapter starts as the identity,
save/load round-trips, and the Hydra recipe runs end to end (tiny target, a few steps)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate

from drafters.early_exit import EarlyExitDrafter
from specdraft.models import tiny_random_target
from specdraft.target import TargetModel
from specdraft.vocab import VOCAB_FILE, PrunedVocab
from specdraft.formats.exit_adapter import ExitAdapter, exit_logits, load_adapter, save_adapter
from specdraft.train.early_exit import (
    agreement,
    losses,
    precompute_teacher,
    run,
    teacher_cache_dir,
    train_adapter,
    train_sample,
)
from specdraft.train.loop import TrainSettings


def teacher_data(target: TargetModel, tmp_path: Path, exit_layer: int = 1, with_prev: bool = False) -> dict[str, torch.Tensor]:
    return precompute_teacher(target, BLOCKS(target), exit_layer, top_k=8, out_dir=tmp_path / "cache",
                              shard_blocks=4, with_prev=with_prev)


def fit(steps: int, lr: float = 1e-2, **kwargs: object) -> TrainSettings:
    """Settings of a short run: cosine from lr to 0 without warm-up or clipping (overridable)."""
    return TrainSettings(**{"max_steps": steps, "lr": lr, "warmup_steps": 0, "min_lr_ratio": 0.0, "grad_clip": None,
                            **kwargs})


def BLOCKS(target: TargetModel) -> torch.Tensor:  # noqa: N802 - fixed data
    return torch.randint(0, target.vocab_size, (8, 32), generator=torch.Generator().manual_seed(0))  # [8, 32]


def test_loss_goes_down_and_agreement_rises(tmp_path: Path) -> None:
    target = tiny_random_target(vocab_size=64, seed=3, num_layers=3)
    data = teacher_data(target, tmp_path)
    assert data["hidden"].shape == (256, 32) and data["top_ids"].shape == (256, 8)
    adapter = ExitAdapter(hidden_size=32, width=64)
    before = agreement(target, adapter, data)["top1"]
    curve = losses(train_adapter(target, adapter, data, fit(60), batch_tokens=128, log=False))
    assert sum(curve[-10:]) / 10 < 0.8 * sum(curve[:10]) / 10
    assert agreement(target, adapter, data)["top1"] > before


def test_context_adapter_learns_more_than_plain(tmp_path: Path) -> None:
    """The context adapter (+ the target's previous final hidden state) trains, and with the same
    steps it fits the teacher better than the plain adapter on the same data; top1_chained is the
    agreement with its own feature instead of the target's."""
    target = tiny_random_target(vocab_size=64, seed=3, num_layers=3)
    data = teacher_data(target, tmp_path, with_prev=True)
    results = {}
    for context in (False, True):
        adapter = ExitAdapter(hidden_size=32, width=64, context=context)
        curve = losses(train_adapter(target, adapter, data, fit(150), batch_tokens=128, log=False))
        assert sum(curve[-10:]) / 10 < 0.8 * sum(curve[:10]) / 10
        results[context] = agreement(target, adapter, data)
    assert results[True]["top1"] > results[False]["top1"]
    assert "top1_chained" in results[True] and "top1_chained" not in results[False]
    assert 0.0 <= results[True]["top1_chained"] <= 1.0


def test_prev_is_the_final_hidden_before(tmp_path: Path) -> None:
    """prev[i] = post-norm last-layer hidden state at i - 1 within a block, zeros at a block start;
    a cache written without prev gets it added when asked for."""
    target = tiny_random_target(vocab_size=64, seed=3, num_layers=3)
    plain = teacher_data(target, tmp_path)
    assert "prev" not in plain
    data = teacher_data(target, tmp_path, with_prev=True)  # same cache directory: the shards are redone
    torch.testing.assert_close(data["hidden"], plain["hidden"])
    with torch.no_grad():
        final = target.model(BLOCKS(target)[:2], output_hidden_states=True).hidden_states[-1]  # [2, 32, H]
    prev = data["prev"][:64].view(2, 32, -1).float()
    assert prev[:, 0].abs().max() == 0
    torch.testing.assert_close(prev[:, 1:], final[:, :-1], rtol=1e-2, atol=1e-2)  # float16 cache


def test_pruned_vocab_training(tmp_path: Path) -> None:
    """Training against a pruned draft vocabulary (teacher ids outside it are left out) still learns."""
    target = tiny_random_target(vocab_size=64, seed=3, num_layers=3)
    data = teacher_data(target, tmp_path)
    vocab = PrunedVocab(range(0, 64, 2), vocab_size=64)
    adapter = ExitAdapter(hidden_size=32, width=64)
    curve = losses(train_adapter(target, adapter, data, fit(60), batch_tokens=128, vocab=vocab, log=False))
    assert sum(curve[-10:]) / 10 < 0.8 * sum(curve[:10]) / 10
    result = agreement(target, adapter, data, vocab=vocab)
    assert 0.0 < result["top1"] <= result["top5"] <= 1.0


def test_untrained_adapter_is_identity() -> None:
    h = torch.randn(3, 32)
    torch.testing.assert_close(ExitAdapter(hidden_size=32, width=16, num_blocks=2)(h), h)
    torch.testing.assert_close(ExitAdapter(hidden_size=32, width=16, context=True)(h, torch.randn(3, 32)), h)
    with pytest.raises(ValueError, match="context=True"):
        ExitAdapter(hidden_size=32, width=16, context=True)(h)


def test_checkpoint_resume_is_exact_and_roundtrip(tmp_path: Path) -> None:
    """A run stopped after 4 steps and resumed to 10 ends with the weights of an uninterrupted run of
    10 (a step's batch depends on the step alone; constant lr, so the schedule does not depend on
    max_steps), and a saved adapter loads back to the same exit."""
    target = tiny_random_target(vocab_size=64, seed=3, num_layers=3)
    data = teacher_data(target, tmp_path)
    ckpt = tmp_path / "ckpt.pt"
    fresh = {}
    for name in ("whole", "resumed"):
        torch.manual_seed(0)
        fresh[name] = ExitAdapter(hidden_size=32, width=64)
        torch.nn.init.normal_(fresh[name].down[0].weight, std=0.1)
    train_adapter(target, fresh["whole"], data, fit(10, min_lr_ratio=1.0), batch_tokens=64, log=False)
    first = train_adapter(target, fresh["resumed"], data, fit(4, min_lr_ratio=1.0), batch_tokens=64, checkpoint=ckpt,
                          log=False)
    assert first.step == 4 and ckpt.is_file()
    resumed = ExitAdapter(hidden_size=32, width=64)  # weights and optimizer state come from the checkpoint
    log = train_adapter(target, resumed, data, fit(10, min_lr_ratio=1.0), batch_tokens=64, checkpoint=ckpt, log=False)
    assert log.step == 10 and len(losses(log)) == 10
    for a, b in zip(resumed.parameters(), fresh["whole"].parameters(), strict=True):
        torch.testing.assert_close(a, b)
    save_adapter(resumed, tmp_path / "out", {"exit_layer": 1})
    loaded, meta = load_adapter(tmp_path / "out")
    h = data["hidden"][:5].float()
    torch.testing.assert_close(exit_logits(target, h, loaded), exit_logits(target, h, resumed))
    assert meta["exit_layer"] == 1


@pytest.mark.parametrize(("context", "sources"), [(False, "[pydoc]"), (True, "[selfgen,pydoc]")],
                         ids=["plain", "context-mixed"])
def test_recipe_end_to_end(tmp_path: Path, context: bool, sources: str) -> None:
    vocab_path = tmp_path / "vocab.json"
    PrunedVocab(range(4096), vocab_size=49152).save(vocab_path)
    GlobalHydra.instance().clear()
    with initialize_config_module(version_base="1.3", config_module="conf"):
        cfg = compose(
            "train_early_exit",
            overrides=[
                "target=tiny_random", "+target.num_layers=3", "exit_layer=1", "block_size=64",
                "train_tokens=1024", "eval_tokens=256", "train.max_steps=5", "batch_tokens=64", "top_k=4",
                f"sources={sources}", "adapter.width=16", f"pruned_vocab={vocab_path}", f"cache_dir={tmp_path / 'cache'}",
                f"out_dir={tmp_path / 'adapter'}", f"adapter.context={str(context).lower()}",
            ],
        )
    GlobalHydra.instance().clear()
    metrics = run(cfg)
    assert 0.0 <= metrics["trained"]["top1"] <= 1.0 and metrics["last_loss"] is not None
    assert metrics["train_sample"]["tokens"] == metrics["trained"]["tokens"]  # as many seen tokens as held-out
    if "selfgen" in sources:  # the two domains are also scored apart, 256 held-out tokens each
        assert set(metrics["by_source"]) == {"selfgen", "pydoc"}
        assert metrics["by_source"]["pydoc"]["trained"]["tokens"] == 256 == metrics["trained"]["tokens"] // 2
    assert (tmp_path / "adapter" / VOCAB_FILE).is_file()
    drafter = EarlyExitDrafter(adapter=tmp_path / "adapter")
    assert drafter.exit_layer == 1 and drafter.adapter is not None and drafter.adapter.context == context
    drafter.bind(instantiate(cfg.target))
    assert drafter.vocab is not None and drafter.vocab.size == 4096  # trained on it, drafts on it (pruned_vocab=auto)


def test_train_sample_takes_whole_blocks_spread_over_the_split() -> None:
    train = {"hidden": torch.arange(10 * 4).float()[:, None], "prev": torch.arange(10 * 4).float()[:, None]}  # 10 blocks of 4
    sample = train_sample(train, tokens=12, block_size=4)
    assert sample["hidden"].flatten().tolist() == [0, 1, 2, 3, 16, 17, 18, 19, 36, 37, 38, 39]  # blocks 0, 4 (4.5 rounds to even), 9
    assert train_sample(train, tokens=1000, block_size=4)["prev"].shape[0] == 40  # capped at the split


def test_a_longer_run_redoes_the_partial_last_shard(tmp_path: Path) -> None:
    """A shorter run leaves a partial last shard (6 blocks in shards of 4); a longer run over the same
    token stream must not reuse it as if it were whole (that dropped 2 blocks of the shipped
    adapter's 1.6M-token run)."""
    target = tiny_random_target(vocab_size=64, seed=3, num_layers=3)
    blocks = BLOCKS(target)  # [8, 32]
    short = precompute_teacher(target, blocks[:6], 1, top_k=8, out_dir=tmp_path / "cache", shard_blocks=4)
    assert short["hidden"].shape[0] == 6 * 32
    longer = precompute_teacher(target, blocks, 1, top_k=8, out_dir=tmp_path / "cache", shard_blocks=4)
    fresh = precompute_teacher(target, blocks, 1, top_k=8, out_dir=tmp_path / "fresh", shard_blocks=4)
    assert longer["hidden"].shape[0] == 8 * 32
    torch.testing.assert_close(longer["top_ids"], fresh["top_ids"])


def test_distill_loss_treats_tokens_outside_the_vocabulary_either_way() -> None:
    """The one distillation loss: with every teacher id inside both treatments are the plain top-k
    cross-entropy; with ids outside (-1), renormalize=True is the cross-entropy to the teacher
    renormalised over the ids inside (positions with none skipped), renormalize=False drops them
    from the full top-k softmax and averages over every position."""
    from specdraft.train.losses import distill_loss

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, generator=gen)  # [N, M]
    top_logits = torch.randn(3, 2, generator=gen)  # [N, k]
    inside = torch.tensor([[0, 1], [2, 3], [4, 0]])
    logq = torch.log_softmax(logits, -1)
    full = -(torch.softmax(top_logits, -1) * logq.gather(-1, inside)).sum(-1).mean()
    for renormalize in (True, False):
        torch.testing.assert_close(distill_loss(logits, top_logits, inside, renormalize), full)
    outside = torch.tensor([[0, -1], [2, 3], [-1, -1]])  # row 0: one id inside; row 2: none
    p = torch.softmax(top_logits, -1)
    row0, row1 = -logq[0, 0], -(p[1] * logq[1, [2, 3]]).sum()
    torch.testing.assert_close(distill_loss(logits, top_logits, outside), (row0 + row1) / 2)
    torch.testing.assert_close(distill_loss(logits, top_logits, outside, renormalize=False), (p[0, 0] * row0 + row1) / 3)


def test_the_teacher_cache_is_named_after_the_target() -> None:
    """target=... gets its own cache (the default target's name, and so its cache, is unchanged)."""
    GlobalHydra.instance().clear()
    with initialize_config_module(version_base="1.3", config_module="conf"):
        default = compose("train_early_exit", overrides=["cache_dir=/c"])
        tiny = compose("train_early_exit", overrides=["cache_dir=/c", "target=tiny_random"])
        hub = compose("train_early_exit", overrides=["cache_dir=/c", "target=hf", "target.name_or_path=org/model"])
        named = compose("train_early_exit", overrides=["cache_dir=/c", "target=tiny_random", "cache_name=mine"])
    GlobalHydra.instance().clear()
    assert teacher_cache_dir(default) == Path("/c/smollm2-135m_E6_T256_k32")
    assert teacher_cache_dir(tiny).name.startswith("specdraft.models.tiny_random_target_")
    assert teacher_cache_dir(hub).name.startswith("org--model_")
    assert teacher_cache_dir(named).name.startswith("mine_")


def test_each_list_of_selfgen_sources_gets_its_own_teacher_cache() -> None:
    GlobalHydra.instance().clear()
    with initialize_config_module(version_base="1.3", config_module="conf"):
        def cache(path: str) -> Path:
            return teacher_cache_dir(compose("train_early_exit", overrides=[
                "cache_dir=/c", "sources=[selfgen,stdlib]", f"selfgen_path={path}"]))

        one, listed, both, swapped = cache("/d/a"), cache("[/d/a]"), cache("[/d/a,/d/b]"), cache("[/d/b,/d/a]")
    GlobalHydra.instance().clear()
    assert one == listed  # one source, named either way, is the same data
    assert len({one, both, swapped}) == 3  # the order is the stream's order: another cache
