"""specdraft-train-medusa on a tiny random target: cached hidden states, every head's loss goes
down, checkpoints resume (exactly: a resumed run ends where an uninterrupted one does), and the
saved PEFT adapter reloads to identical outputs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from drafters.medusa import MedusaDrafter
from drafters.medusa_forms import CompiledHeads
from specdraft.formats.medusa_heads import load_heads, save_heads
from specdraft.models import tiny_random_target
from specdraft.protocol import DraftContext
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel
from specdraft.train.medusa import (
    batch_positions, concat, evaluate, head_losses, oversampled, precompute, train, use_bf16,
)
from specdraft.train.shard_cache import cached_shards
from specdraft.vocab import VOCAB_FILE, build_pruned_vocab
from tests.helpers import load_script


def tiny_cfg(tmp_path: Path, loss: str = "ce", **train: object) -> DictConfig:
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        cfg = compose(config_name="train_medusa")
    GlobalHydra.instance().clear()
    cfg = OmegaConf.merge(cfg, {
        "cache_dir": str(tmp_path / "cache"), "out_dir": str(tmp_path / "heads"),
        "num_heads": 3, "lora_rank": 4, "lora_alpha": 8, "batch_size": 64, "bf16": False,
        "heads_loss": {"loss": loss},
        "train": {"lr": 0.02, "max_steps": 60, "eval_every": 0, "checkpoint_every": 20, "warmup_steps": 1,
                  "max_minutes": None, **train},
    })
    return cfg


def greedy_sequences(target: TargetModel, n: int, length: int) -> list[tuple[torch.Tensor, int]]:
    """The tiny target's own greedy continuations of random prompts (self-distillation data)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        prompt = torch.randint(target.vocab_size, (1, 3), generator=gen)
        with torch.inference_mode():
            ids = target.model.generate(prompt, max_new_tokens=length, do_sample=False, pad_token_id=0)
        out.append((ids[0], 2))
    return out


def test_config_composes() -> None:
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        cfg = compose(config_name="train_medusa", overrides=["num_heads=4", "heads_loss.loss=kl"])
    GlobalHydra.instance().clear()
    assert cfg.num_heads == 4 and cfg.heads_loss.loss == "kl"


def test_bf16_setting_auto_follows_the_cpu_and_bad_values_are_named() -> None:
    from specdraft.linear_formats import cpu_has_bf16

    assert use_bf16("auto") == cpu_has_bf16()
    assert use_bf16(True) is True and use_bf16(False) is False
    with pytest.raises(ValueError, match="bf16 must be true, false or auto"):
        use_bf16("yes")


def test_cached_shards_are_reused_only_for_the_sequences_they_were_computed_from(tmp_path: Path) -> None:
    """An interrupted or repeated run reuses its shards; other data of the same lengths in the same
    cache directory is recomputed, never trained on with another dataset's states."""
    calls: list[int] = []

    def compute(shard):  # noqa: ANN001, ANN202 - the target's outputs: here the ids themselves
        calls.append(len(shard))
        return {"choice": torch.cat([ids for ids, _ in shard])}

    seqs = [(torch.arange(10) + i, 0) for i in range(6)]
    first = cached_shards(seqs, tmp_path, "s", compute, shard_tokens=20)
    assert len(calls) == 3
    again = cached_shards(seqs, tmp_path, "s", compute, shard_tokens=20)
    assert len(calls) == 3 and all(torch.equal(a["choice"], b["choice"]) for a, b in zip(first, again))
    other = [(ids + 100, 0) for ids, _ in seqs[:2]] + seqs[2:]  # same lengths, other tokens in shard 0
    parts = cached_shards(other, tmp_path, "s", compute, shard_tokens=20)
    assert len(calls) == 4  # only shard 0 was recomputed
    assert torch.equal(parts[0]["choice"], torch.cat([ids for ids, _ in other[:2]]))
    moved = [(ids, 1) for ids, _ in seqs]  # same tokens, other first positions
    cached_shards(moved, tmp_path, "s", compute, shard_tokens=20)
    assert len(calls) == 7


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads Linux's /proc/self/maps")
def test_cached_shards_are_memory_mapped_from_their_files(tmp_path: Path) -> None:
    """Fresh and reused shards alike come back mapped from their files (not copies in memory), so a
    feature cache larger than RAM can be trained on."""
    seqs = [(torch.arange(10) + i, 0) for i in range(4)]
    compute = lambda shard: {"choice": torch.cat([ids for ids, _ in shard])}  # noqa: E731

    def mapped() -> set[str]:
        return {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if str(tmp_path) in line}

    for _ in range(2):  # computed, then reused
        parts = cached_shards(seqs, tmp_path, "m", compute, shard_tokens=20)
        assert mapped() >= {str(tmp_path / f"m-{i:04d}.pt") for i in range(len(parts))}
        assert torch.equal(torch.cat([p["choice"] for p in parts]), torch.cat([ids for ids, _ in seqs]))
        del parts


@pytest.mark.parametrize("loss", ["ce", "kl"])
def test_training_lowers_every_head_loss_and_reloads(tmp_path: Path, loss: str) -> None:
    torch.set_num_threads(1)
    target = tiny_random_target(vocab_size=16, seed=1, hidden_size=32)
    cfg = tiny_cfg(tmp_path, loss=loss)
    data = precompute(target, greedy_sequences(target, 24, 30), Path(cfg.cache_dir), "tiny", 200)
    assert len(list(Path(cfg.cache_dir).glob("tiny-*.pt"))) > 1
    again = precompute(target, greedy_sequences(target, 24, 30), Path(cfg.cache_dir), "tiny", 200)
    assert torch.equal(again.hidden, data.hidden)  # shards are reused
    ckpt = Path(cfg.cache_dir) / "checkpoint.pt"
    model, log = train(cfg, target, data, {}, ckpt)
    hist = torch.tensor([h[1:] for h in (log["loss_history_every_50"])])
    first = hist[0]
    model.eval()
    # every head's loss is lower after training than at step 1
    idx = data.inputs(3)[:256]
    with torch.no_grad():
        final = head_losses(CompiledHeads(model), data, idx, loss)
    assert (final < first).all(), (first, final)

    before = evaluate(model, data, 3, 500)
    assert all(0 <= x <= 1 for x in before["top1"])
    out = tmp_path / "heads"
    save_heads(model, out, {"command": "test"})
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    assert (out / "README.md").read_text().startswith("# 3 Medusa heads, PEFT adapter")  # not PEFT's card
    reloaded = load_heads(out, target.lm_head.weight)
    hidden = data.states(torch.arange(20))
    with torch.no_grad():
        assert torch.equal(reloaded(hidden), model(hidden))
    drafter = MedusaDrafter(heads=str(out), tree=None)  # no accuracy.json to grow a tree from
    drafter.bind(target)
    with torch.no_grad():
        assert torch.allclose(drafter.head_logits(hidden), model(hidden), atol=1e-5)


def test_oversampling_by_index_draws_what_copies_would(tmp_path: Path) -> None:
    """Listing a set's inputs twice over one copy of its states gives every batch the same states,
    labels and path tokens as concatenating two copies of it (what the recipe did before)."""
    target = tiny_random_target(vocab_size=16, seed=1, hidden_size=32)
    a = precompute(target, greedy_sequences(target, 6, 20), tmp_path / "a", "a", 100)
    b = precompute(target, greedy_sequences(target, 3, 20), tmp_path / "b", "b", 100)
    copies = concat([a, a, b])
    once, inputs = oversampled({"a": a, "b": b}, {"a": 2}, num_heads=3)
    assert len(once.choice) == len(a.choice) + len(b.choice) and once.hidden.dtype == torch.float16
    assert len(inputs) == len(copies.inputs(3))
    for step in range(5):
        new, old = batch_positions(inputs, step, 64, 0), batch_positions(copies.inputs(3), step, 64, 0)
        assert torch.equal(once.states(new), copies.states(old))
        assert torch.equal(once.labels(new, 3), copies.labels(old, 3))
        assert torch.equal(once.path_tokens(new, 3), copies.path_tokens(old, 3))


def test_training_resumes_from_checkpoint(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    target = tiny_random_target(vocab_size=16, seed=1, hidden_size=32)
    data = concat([precompute(target, greedy_sequences(target, 8, 20), tmp_path / "c", "t", 100)])
    ckpt = tmp_path / "ckpt.pt"
    _, first = train(tiny_cfg(tmp_path, max_steps=20), target, data, {}, ckpt)
    resumed, log = train(tiny_cfg(tmp_path, max_steps=40), target, data, {}, ckpt)
    assert first["steps"] == 20 and log["steps"] == 40
    # the resumed run continued the same history (first 20 steps are the checkpoint's)
    assert log["loss_history_every_50"][0] == first["loss_history_every_50"][0]
    state = torch.load(ckpt)
    assert state["step"] == 40 and len(state["history"]) == 40


def test_resumed_training_ends_where_an_uninterrupted_run_does(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """Each step's batch is a function of the step: a run interrupted after its checkpoint at step 20
    and resumed reaches step 40 with exactly the weights of a run that was never interrupted."""
    import specdraft.train.medusa as recipe

    torch.set_num_threads(1)
    target = tiny_random_target(vocab_size=16, seed=1, hidden_size=32)
    data = precompute(target, greedy_sequences(target, 8, 20), tmp_path / "c", "t", 100)
    cfg = tiny_cfg(tmp_path, max_steps=40)
    whole, _ = train(cfg, target, data, {}, tmp_path / "whole.pt")

    draw = recipe.batch_positions

    def interrupted(inputs, step, batch_size, seed):  # noqa: ANN001, ANN202
        if step == 20:
            raise KeyboardInterrupt  # the process dies right after the step-20 checkpoint
        return draw(inputs, step, batch_size, seed)

    monkeypatch.setattr(recipe, "batch_positions", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, target, data, {}, tmp_path / "resumed.pt")
    assert torch.load(tmp_path / "resumed.pt")["step"] == 20
    monkeypatch.setattr(recipe, "batch_positions", draw)
    resumed, log = train(cfg, target, data, {}, tmp_path / "resumed.pt")
    assert log["steps"] == 40
    expected = {n: p for n, p in whole.named_parameters() if p.requires_grad}
    got = {n: p for n, p in resumed.named_parameters() if p.requires_grad}
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[n], got[n]) for n in expected)


def test_pruned_vocab_training_and_drafter(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    target = tiny_random_target(vocab_size=16, seed=1, hidden_size=32)
    data = precompute(target, greedy_sequences(target, 12, 20), tmp_path / "c", "t", 1000)
    vocab = build_pruned_vocab(data.choice, 10, 16)
    model, _ = train(tiny_cfg(tmp_path, max_steps=30), target, data, {}, tmp_path / "ck.pt", vocab)
    acc_pruned = evaluate(model, data, 3, 500, vocab)
    assert all(0 <= x <= 1 for x in acc_pruned["top1"])
    out = tmp_path / "heads"
    save_heads(model, out, {"command": "test"})
    vocab.save(out / VOCAB_FILE)
    drafter = MedusaDrafter(heads=str(out), tree=None)  # pruned_vocab "auto": the file saved with the heads
    drafter.bind(target)
    hidden = data.states(torch.arange(6))
    full = drafter.head_logits(hidden)  # [6, K, 10]
    assert full.shape == (6, 3, 10)
    ctx = DraftContext(torch.tensor([[1]]), hidden[:1], SamplingConfig(temperature=1.0), torch.Generator())
    draft = drafter.propose(ctx, 3)
    assert set(draft.token_ids[0].tolist()) <= set(vocab.ids.tolist())
    assert draft.probs.shape == (1, 3, 16)
    outside = torch.ones(16, dtype=torch.bool)
    outside[vocab.ids] = False
    assert draft.probs[..., outside].sum() == 0


def test_recurrent_heads_train_save_in_float16_and_draft(tmp_path: Path) -> None:
    """recurrent=true: every head's loss goes down with teacher-forced path tokens, the adapter is
    stored in float16 (half the bytes) and reloads to the same logits up to that rounding, and the
    drafter proposes from it; export refuses it (no engine has this architecture)."""
    from drafters.medusa_export import export

    torch.set_num_threads(1)
    target = tiny_random_target(vocab_size=16, seed=1, hidden_size=32)
    cfg = tiny_cfg(tmp_path)
    cfg.recurrent, cfg.num_layers = True, 1
    data = precompute(target, greedy_sequences(target, 24, 30), Path(cfg.cache_dir), "tiny", 200)
    assert torch.equal(data.path_tokens(torch.tensor([0]), 3)[0], data.ids[1:4])
    model, log = train(cfg, target, data, {}, Path(cfg.cache_dir) / "ck.pt")
    first = torch.tensor(log["loss_history_every_50"][0][1:])
    with torch.no_grad():
        final = head_losses(CompiledHeads(model), data, data.inputs(3)[:256], "ce")
    assert (final < first).all(), (first, final)
    out = tmp_path / "heads"
    save_heads(model, out, {"command": "test"}, dtype=torch.float16)
    from safetensors.torch import load_file

    stored = load_file(out / "adapter_model.safetensors")
    assert {v.dtype for v in stored.values()} == {torch.float16}
    assert (out / "README.md").read_text().startswith("# 3 recurrent Medusa heads")
    assert any(".inputs." in k for k in stored)
    embed = target.model.get_input_embeddings().weight
    reloaded = load_heads(out, target.lm_head.weight, embed)
    hidden, tokens = data.states(torch.arange(20)), data.path_tokens(torch.arange(20), 3)
    with torch.no_grad():
        assert torch.allclose(reloaded(hidden, tokens), model(hidden, tokens), atol=1e-2)
    with pytest.raises(ValueError, match="embed"):
        load_heads(out, target.lm_head.weight)
    drafter = MedusaDrafter(heads=str(out), tree=None)
    drafter.bind(target)
    ctx = DraftContext(torch.tensor([[1, 2]]), hidden[:1], SamplingConfig(), torch.Generator())
    assert drafter.propose(ctx, 3).num_tokens == 3
    with pytest.raises(ValueError, match="recurrent"):
        export(model, tmp_path / "vllm")


def test_heldout_chain_length_counts_a_draft_only_while_every_earlier_head_was_right() -> None:
    """benchmarks/medusa_heldout.py: 1 + sum_k P(heads 1..k all rank the target's choice first)."""
    script = load_script(Path(__file__).resolve().parents[1] / "benchmarks" / "medusa_heldout.py")
    ranks = [[0, 0, 0], [0, 3, 0], [2, 0, 0], [0, 0, 10]]  # the label's rank in each head's list
    # P(head 1 right) = 3/4, P(heads 1-2) = 2/4, P(heads 1-3) = 1/4
    assert script.chain_accepted_length(ranks) == pytest.approx(1 + 0.75 + 0.5 + 0.25)
    assert math.isnan(script.chain_accepted_length([]))
