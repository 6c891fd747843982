"""EAGLE-3: the target's layer features from the verify forward equal Hugging Face's
`output_hidden_states` (after rollbacks, on both stacks); the drafter is greedy-exact and
statistically lossless at temperature 1 (with a negative control) on tiny random targets with
random heads; the head file is the speculators EAGLE-3 format vLLM loads and reloads with
identical drafts."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from drafters.eagle import EagleDrafter
from specdraft.decode import SpeculativeDecoder
from specdraft.formats.eagle_head import default_aux_layers, load_head, random_head, save_head
from specdraft.models import tiny_random_target
from specdraft.protocol import DraftContext
from specdraft.sampling import SamplingConfig
from specdraft.tree import tree_depth
from specdraft.target import TargetModel
from tests.helpers import exact_two_token_distribution, load_script, plain_greedy, pooled_chisquare, sample_two_tokens

LAYERS = (0, 1, 3)  # a 4-layer tiny target: the embeddings, a middle and the last layer's input
EVEN = list(range(0, 16, 2))


def four_layer_target(seed: int = 3, fast: bool | str = "auto") -> TargetModel:
    return tiny_random_target(vocab_size=16, seed=seed, num_layers=4, fast=fast)


def drafter(seed: int = 0, draft_ids: list[int] | None = None) -> EagleDrafter:
    return EagleDrafter(None, seed=seed, aux_layers=LAYERS, draft_ids=draft_ids, tree=None)  # a chain


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "hf"])
def test_verify_forward_features_equal_hf_hidden_states_after_rollbacks(fast: bool) -> None:
    target = four_layer_target(fast=fast)
    ids = torch.tensor([[1, 5, 2, 7, 3, 3, 9, 4, 6, 6, 6, 2]])
    target.reset()
    first = target.forward(ids[:, :6], num_logits=0, features=LAYERS)
    target.forward(torch.tensor([[8, 8, 8, 8]]), features=LAYERS)  # a draft block ...
    target.crop(7)  # ... of which one token was kept
    kept = torch.cat([ids[:, :6], torch.tensor([[8]])], dim=1)
    tail = target.forward(ids[:, 6:9], features=LAYERS)  # after the rollback
    with torch.inference_mode():
        full = torch.cat([kept, ids[:, 6:9]], dim=1)
        hs = target.model.model(input_ids=full, output_hidden_states=True).hidden_states
    want = torch.cat([hs[j] for j in LAYERS], dim=-1)  # [1, 10, 3H]
    torch.testing.assert_close(first.features, want[:, :6], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(tail.features, want[:, 7:], rtol=1e-4, atol=1e-4)
    assert target.forward(torch.tensor([[1]])).features is None  # asked for nothing: nothing computed


def test_feature_layers_out_of_range_are_a_clear_error() -> None:
    target = four_layer_target()
    with pytest.raises(ValueError, match=r"distinct layer ids in \[0, 4\)"):
        target.forward(torch.tensor([[1, 2]]), features=(1, 4))
    with pytest.raises(ValueError, match="no default EAGLE-3 feature layers"):
        default_aux_layers(4)
    assert default_aux_layers(30) == (2, 15, 27)  # vLLM's choice for SmolLM2-135M


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_equals_plain_greedy(seed: int) -> None:
    target = four_layer_target(seed=seed + 3)
    dec = SpeculativeDecoder(target, drafter(seed, EVEN if seed == 1 else None), num_draft_tokens=3)
    prompt = [1, 5, 3, 7][: 1 + seed]
    out = dec.generate(prompt, max_new_tokens=40, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(target, prompt, 40)
    assert out.stats.rounds < 40  # some draft tokens were accepted


def test_rounds_without_drafting_keep_the_features() -> None:
    """A round with K = 0 still hands the drafter its features: the next draft is the head's
    proposal after every verified pair (the same draft as a drafter that saw them one by one)."""
    target = four_layer_target()
    head = random_head(target, seed=5, aux_layers=LAYERS)
    prompt = [1, 5, 3, 7, 2]
    dec = SpeculativeDecoder(target, EagleDrafter(head, tree=None), num_draft_tokens=0)
    plain = dec.generate(prompt, max_new_tokens=6, stop_token_ids=[]).token_ids[0].tolist()
    committed = torch.tensor([prompt + plain])  # [1, 11]
    lazy, eager = EagleDrafter(head, tree=None), EagleDrafter(head, tree=None)
    lazy.bind(target), eager.bind(target)
    with torch.inference_mode():
        hs = target.model.model(input_ids=committed, output_hidden_states=True).hidden_states
    feats = torch.cat([hs[j] for j in LAYERS], dim=-1)  # [1, 11, 3H]
    ctx = lambda t, n: DraftContext(committed[:, :t], None, SamplingConfig(), torch.Generator(),  # noqa: E731
                                    target_features=feats[:, t - 1 - n : t - 1])
    eager.propose(ctx(5, 4), 2)
    lazy.commit(ctx(5, 4), [0])
    for t in range(6, 12):  # the eager drafter drafts every round, the lazy one only collects
        eager.commit(ctx(t, 1), [0])
        eager.propose(ctx(t, 1), 2)
        lazy.commit(ctx(t, 1), [0])
    a, b = eager.propose(ctx(11, 1), 3), lazy.propose(ctx(11, 1), 3)
    assert a.token_ids.tolist() == b.token_ids.tolist()
    torch.testing.assert_close(a.probs, b.probs)


def _two_token_pvalue(target: TargetModel, seed: int = 0) -> float:
    sampling = SamplingConfig(temperature=1.0)
    dec = SpeculativeDecoder(target, drafter(seed), num_draft_tokens=2, sampling=sampling)
    counts = sample_two_tokens(dec, [2, 9, 4], n=1200, vocab=target.vocab_size)
    return pooled_chisquare(counts, exact_two_token_distribution(target, [2, 9, 4], sampling))


def test_chain_is_lossless_at_temperature_one() -> None:
    assert _two_token_pvalue(four_layer_target(seed=1)) > 1e-4


def test_lossless_test_catches_a_q_that_is_not_the_drafts_law(monkeypatch) -> None:  # noqa: ANN001
    """Negative control: drafting the argmax while reporting the head's distribution as q must fail."""
    import specdraft.draft_loop

    monkeypatch.setattr(specdraft.draft_loop, "draw", lambda q, sampling, generator: q.argmax(dim=-1))
    assert _two_token_pvalue(four_layer_target(seed=1)) < 1e-6


def test_batches_are_refused_with_a_clear_error() -> None:
    dec = SpeculativeDecoder(four_layer_target(), drafter(), num_draft_tokens=2)
    with pytest.raises(ValueError, match="one sequence at a time"):
        dec.generate_batch([[1, 2], [3, 4, 5]], 4)


# ------------------------------------------------------------------ the file vLLM loads
VLLM_WEIGHTS = {  # name -> shape for a head on the 4-layer tiny target (H 32, 4 heads of 8, I 64)
    "fc.weight": (32, 96), "midlayer.input_layernorm.weight": (32,), "midlayer.hidden_norm.weight": (32,),
    "midlayer.post_attention_layernorm.weight": (32,), "midlayer.self_attn.q_proj.weight": (32, 64),
    "midlayer.self_attn.k_proj.weight": (32, 64), "midlayer.self_attn.v_proj.weight": (32, 64),
    "midlayer.self_attn.o_proj.weight": (32, 32), "midlayer.mlp.gate_proj.weight": (64, 32),
    "midlayer.mlp.up_proj.weight": (64, 32), "midlayer.mlp.down_proj.weight": (32, 64),
    "norm.weight": (32,), "lm_head.weight": (8, 32), "d2t": (8,), "t2d": (16,),
}


def test_saved_head_is_the_speculators_format_and_reloads_with_identical_drafts(tmp_path) -> None:  # noqa: ANN001
    from safetensors.torch import load_file

    target = four_layer_target()
    head = random_head(target, seed=2, draft_ids=EVEN, aux_layers=LAYERS)
    save_head(head, tmp_path / "eagle", target, verifier="tiny-random", speculative_tokens=3, dtype=torch.float32)
    tensors = load_file(str(tmp_path / "eagle" / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == VLLM_WEIGHTS
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert (torch.arange(8) + tensors["d2t"]).tolist() == EVEN  # vLLM: target id = draft id + d2t[draft id]
    assert tensors["t2d"].nonzero().flatten().tolist() == EVEN
    config = json.loads((tmp_path / "eagle" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["architectures"] == ["Eagle3Speculator"]
    assert config["eagle_aux_hidden_state_layer_ids"] == list(LAYERS)
    assert config["draft_vocab_size"] == 8 and config["target_hidden_size"] == 32
    assert config["norm_before_residual"] is False
    assert config["transformer_layer_config"]["num_hidden_layers"] == 1
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert config["speculators_config"]["verifier"]["name_or_path"] == "tiny-random"

    prompt = [1, 5, 3, 7]
    outs = []
    for source in (head, tmp_path / "eagle"):
        dec = SpeculativeDecoder(target, EagleDrafter(source), num_draft_tokens=3)
        result = dec.generate(prompt, max_new_tokens=24, stop_token_ids=[])
        outs.append((result.token_ids[0].tolist(), result.stats.rounds))
    assert outs[0] == outs[1]
    assert isinstance(load_head(tmp_path / "eagle", target).config.aux_layers, tuple)


def test_loading_a_head_for_another_target_names_both(tmp_path) -> None:  # noqa: ANN001
    target = four_layer_target()
    save_head(random_head(target, aux_layers=LAYERS), tmp_path / "eagle", target, verifier="tiny")
    other = tiny_random_target(vocab_size=16, seed=3, num_layers=4, hidden_size=48)
    with pytest.raises(ValueError, match="hidden size 32.*this target has hidden size 48"):
        EagleDrafter(tmp_path / "eagle").bind(other)
    with pytest.raises(ValueError, match="not an EAGLE-3 head directory"):
        EagleDrafter(tmp_path).bind(target)


# ------------------------------------------------------------------ training (training-time test)
def greedy_sequences(target: TargetModel, n: int, seed: int, new: int = 24) -> list[tuple[torch.Tensor, int]]:
    """The target's own greedy answers to random prompts: (prompt + answer ids, answer start - 1)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        prompt = torch.randint(16, (int(torch.randint(3, 9, (1,), generator=gen)),), generator=gen).tolist()
        answer = plain_greedy(target, prompt, new)
        out.append((torch.tensor(prompt + answer), len(prompt) - 1))
    return out


def feature_seqs(target: TargetModel, seqs, tmp_path, name: str):  # noqa: ANN001, ANN201
    from specdraft.train.eagle import feature_sequences

    return feature_sequences(target, seqs, LAYERS, tmp_path, name)


def test_unrolled_training_steps_are_what_the_drafter_computes(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """The training-time test's step s at anchor j gives the distribution the drafter gives for
    its (s+1)-th draft token after pair j, when the drafts before it were the sequence's tokens."""
    import specdraft.draft_loop
    from specdraft.train.eagle import unroll
    from specdraft.vocab import PrunedVocab

    target = four_layer_target()
    head = random_head(target, seed=4, aux_layers=LAYERS)
    (seq,) = feature_seqs(target, greedy_sequences(target, 1, seed=0), tmp_path, "one")
    embed, rotary = target.model.get_input_embeddings(), target.model.base_model.rotary_emb
    every = dataclasses.replace(seq, first=0)  # every anchor unrolled
    with torch.no_grad():
        logits = [u.logits for u in unroll(head, embed, rotary, every, 0, seq.ids.shape[0], 3, PrunedVocab(torch.arange(16), 16))]
    for j in (2, 7, 15):
        truth = seq.ids[j + 2 : j + 5].tolist()  # the drafts "drawn": the sequence's own tokens
        monkeypatch.setattr(specdraft.draft_loop, "draw", lambda q, s, g, it=iter(truth): torch.tensor([next(it)]))
        d = EagleDrafter(head, tree=None)
        d.bind(target)
        ctx = DraftContext(seq.ids[None, : j + 2], None, SamplingConfig(temperature=1.0), torch.Generator(),
                           target_features=seq.features[None, : j + 1].float())
        draft = d.propose(ctx, 3)
        assert draft.token_ids[0].tolist() == truth
        for s in range(3):
            torch.testing.assert_close(draft.probs[0, s], torch.softmax(logits[s][j].float(), -1), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("start", [0, 3])
def test_unroll_skips_only_anchors_whose_chains_end_before_the_answer(tmp_path, start: int) -> None:  # noqa: ANN001
    """Anchors that no step scores give step 0 their keys alone; the anchors unrolled get exactly the
    logits of an unroll of every anchor, and every scored step is among them."""
    from specdraft.train.eagle import unroll
    from specdraft.vocab import PrunedVocab

    target = four_layer_target()
    head = random_head(target, seed=4, aux_layers=LAYERS)
    (seq,) = feature_seqs(target, [(torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7] + list(range(12))), 11)],
                          tmp_path, "long")
    embed, rotary = target.model.get_input_embeddings(), target.model.base_model.rotary_emb
    vocab = PrunedVocab(torch.arange(16), 16)
    end = seq.ids.shape[0]
    with torch.no_grad():
        part = unroll(head, embed, rotary, seq, start, end, 3, vocab)
        every = unroll(head, embed, rotary, dataclasses.replace(seq, first=0), start, end, 3, vocab)
    skipped = seq.first - start - 2  # anchors start .. first - 3 reach no answer token in 3 steps
    assert skipped > 0 and all(len(u.logits) == end - start - 1 - skipped for u in part)
    for s, (p, e) in enumerate(zip(part, every)):
        torch.testing.assert_close(p.logits, e.logits[skipped:], rtol=1e-5, atol=1e-5)
        scored_every = e.scored & (start + torch.arange(end - start - 1) + 1 + s >= seq.first + 1)
        assert not scored_every[:skipped].any()  # nothing scored was skipped
        assert torch.equal(p.scored, scored_every[skipped:])


def test_chain_acceptance_counts_leading_right_steps_by_hand() -> None:
    from specdraft.train.eagle import chain_acceptance

    right = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 1]], dtype=torch.bool)  # [A=4, S=3]
    per_position, expected = chain_acceptance(right)
    # step 0 right for 3 of 4; step 1 for 2 of those 3; step 2 for 1 of those 2; accepted 2, 1, 0, 3
    assert per_position == pytest.approx([3 / 4, 2 / 3, 1 / 2]) and expected == pytest.approx(6 / 4)
    assert chain_acceptance(torch.zeros((0, 3), dtype=torch.bool)) == ([0.0, 0.0, 0.0], 0.0)


def test_held_out_counts_a_choice_outside_the_draft_vocabulary_as_a_miss(tmp_path) -> None:  # noqa: ANN001
    """A smaller draft vocabulary scores the same anchors (none is dropped for being hard), and misses
    every position whose target choice it cannot draft."""
    from specdraft.train.eagle import evaluate
    from specdraft.vocab import PrunedVocab

    target = four_layer_target()
    head = random_head(target, seed=4, aux_layers=LAYERS)
    seqs = feature_seqs(target, greedy_sequences(target, 3, seed=0), tmp_path, "eval")
    embed, rotary = target.model.get_input_embeddings(), target.model.base_model.rotary_emb
    full = evaluate(head, embed, rotary, seqs, 64, 3, PrunedVocab(torch.arange(16), 16))
    counts = torch.bincount(torch.cat([s.choice for s in seqs]), minlength=16)
    never = int(counts.argmin())
    assert counts[never] == 0  # these seeds leave a token the target never chooses
    narrow = evaluate(head, embed, rotary, seqs, 64, 3, PrunedVocab(torch.tensor([never]), 16))
    assert narrow["anchors"] == full["anchors"] > 0
    assert narrow["top1_per_step"] == [0.0, 0.0, 0.0] and narrow["expected_accepted_length"] == 0.0


def test_soft_loss_is_the_cross_entropy_with_the_top_tokens_inside_the_draft_vocabulary() -> None:
    from specdraft.train.eagle import UnrollStep, step_loss

    logits = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))  # [m=3, M=4]
    labels = torch.tensor([0, -100, 3])  # anchor 1 not trained
    top_index = torch.tensor([[0, -1, 2], [1, 2, 3], [3, -1, -1]])  # -1: outside the draft vocabulary
    top_logits = torch.log(torch.tensor([[0.5, 0.3, 0.1], [0.4, 0.4, 0.2], [0.7, 0.2, 0.1]])).half()
    logq = torch.log_softmax(logits, -1)
    expected = -((0.5 * logq[0, 0] + 0.1 * logq[0, 2]) / 0.6 + logq[2, 3]) / 2  # renormalised over the inside ones
    step = UnrollStep(logits, labels, labels >= 0, top_index, top_logits)
    torch.testing.assert_close(step_loss(step, soft_labels=True), expected, rtol=2e-3, atol=2e-3)
    # hard labels: the cross-entropy with the choices
    torch.testing.assert_close(step_loss(step, soft_labels=False), -(logq[0, 0] + logq[2, 3]) / 2)
    none = step._replace(labels=torch.full((3,), -100))
    assert float(step_loss(none, soft_labels=True)) == 0.0 == float(step_loss(none, soft_labels=False))


@pytest.mark.parametrize("soft_labels", [True, False])
def test_training_raises_held_out_acceptance(tmp_path, soft_labels: bool) -> None:  # noqa: ANN001
    from omegaconf import OmegaConf

    from specdraft.train.eagle import evaluate, new_head, train_head
    from specdraft.vocab import build_pruned_vocab

    target = four_layer_target(seed=5)
    train_seqs = feature_seqs(target, greedy_sequences(target, 24, seed=1), tmp_path, "train")
    eval_seqs = feature_seqs(target, greedy_sequences(target, 6, seed=2), tmp_path, "eval")
    vocab = build_pruned_vocab([s.choice for s in train_seqs], 12, 16)
    cfg = OmegaConf.create({"aux_layers": list(LAYERS), "seed": 0, "resume": False, "window": 64, "ttt_steps": 3,
                            "decay": 0.8, "soft_labels": soft_labels, "train": {"max_steps": 200, "lr": 0.003, "warmup_steps": 5,
                                                    "checkpoint_every": 0}})
    embed, rotary = target.model.get_input_embeddings(), target.model.base_model.rotary_emb
    before = evaluate(new_head(target, vocab, LAYERS, 0), embed, rotary, eval_seqs, 64, 3, vocab)
    head, log = train_head(cfg, target, train_seqs, eval_seqs, vocab, tmp_path / "ckpt.pt")
    after = evaluate(head, embed, rotary, eval_seqs, 64, 3, vocab)
    assert log["steps"] == 200 and after["anchors"] == before["anchors"] > 0
    # a random tiny target's text is hard to predict: far from perfect, but far above the fresh head
    assert after["expected_accepted_length"] > before["expected_accepted_length"] + 0.4
    assert after["acceptance_per_position"][0] > 3 * before["acceptance_per_position"][0]
    assert all(a > b for a, b in zip(after["acceptance_per_position"], before["acceptance_per_position"]))  # every position
    # the trained head drafts for the decoder: greedy output unchanged, fewer rounds than plain decoding
    prompt = greedy_sequences(target, 1, seed=9)[0][0][:6].tolist()
    rounds = []
    for h in (new_head(target, vocab, LAYERS, 0), head):
        out = SpeculativeDecoder(target, EagleDrafter(h, tree=None, copy_ngram=None), num_draft_tokens=3).generate(
            prompt, 30, stop_token_ids=[])
        assert out.token_ids[0].tolist() == plain_greedy(target, prompt, 30)
        rounds.append(out.stats.rounds)
    assert rounds[1] < rounds[0], rounds


# ------------------------------------------------------------------ EAGLE-2 dynamic trees
def test_grow_tree_expands_the_best_paths_and_keeps_ancestors() -> None:
    from drafters.eagle_tree import best_nodes, grow_tree

    logp = torch.log(torch.tensor([0.5, 0.3, 0.2]))  # the same children under every node
    seen = []

    def expand(nodes, tokens, parents):  # noqa: ANN001, ANN202
        seen.append((list(nodes), tokens.tolist(), list(parents)))
        return logp.expand(len(nodes), 3)

    tree = grow_tree(logp, expand, topk=2, depth=3)
    assert seen[0] == ([0, 1], [0, 1], [-1, -1])  # depth 0: the root's best two tokens
    # depth 1: the best 2 of {0.25, 0.15, 0.1 | 0.15, 0.09, 0.06}: token 0 then token 1 under node 0
    assert tree.tokens[2:4].tolist() == [0, 1] and tree.parents[2:4].tolist() == [0, 0]
    torch.testing.assert_close(tree.scores[2:4].exp(), torch.tensor([0.25, 0.15]))
    assert seen[1][0] == [2, 3] and len(tree.tokens) == 6
    tokens, parents = best_nodes(tree, 4)  # 0.5, 0.3, 0.25, 0.15 (node 3 wins the tie with node 1's child)
    assert tokens.tolist() == [0, 1, 0, 1] and parents.tolist() == [-1, -1, 0, 0]
    tokens, parents = best_nodes(tree, 5)  # + 0.125 at depth 2, under node 2 (kept index 2)
    assert parents.tolist() == [-1, -1, 0, 0, 2]


def test_node_budget_takes_nodes_while_they_pay_for_their_verification() -> None:
    from drafters.eagle_tree import node_budget

    scores = torch.log(torch.tensor([0.9, 0.5, 0.05]))
    assert node_budget(scores, [1.0, 1.0, 1.0, 1.0]) == 3  # free verification: every node
    assert node_budget(scores, [1.0, 1.2, 1.4, 1.6]) == 2  # 1.9/1.2 > 1, 2.4/1.4 is best, 2.45/1.6 not
    assert node_budget(scores, [1.0, 2.0, 3.0, 4.0]) == 0  # verification too dear: no draft


def test_expansion_mask_sees_verified_pairs_ancestors_and_itself() -> None:
    from drafters.eagle_tree import expansion_mask

    mask = expansion_mask(past=2, cache_length=4, ancestor_slots=[[2], [3]], dtype=torch.float32)
    allowed = (mask == 0).int().tolist()
    assert allowed == [[1, 1, 1, 0, 1, 0], [1, 1, 0, 1, 0, 1]]


def test_the_packed_inference_form_computes_the_heads_pass() -> None:
    """Drafting runs `PackedEagleHead` (fused, packed projections); it must be the module's pass:
    logits, outputs and cache agree to float32 rounding, with and without a cache and a mask."""
    target = four_layer_target(seed=5)
    head = random_head(target, seed=3, aux_layers=LAYERS)
    packed = head.inference_form()
    gen = torch.Generator().manual_seed(0)
    h = target.hidden_size
    feats = torch.randn(1, 5, 3 * h, generator=gen)  # [1, 5, 3H]
    embeds = torch.randn(1, 5, h, generator=gen)  # [1, 5, H]
    rotary = target.model.base_model.rotary_emb
    with torch.inference_mode():
        cos_sin = rotary(embeds, position_ids=torch.arange(5)[None])
        want = head(embeds, head.fuse(feats), cos_sin)
        got = packed(embeds, packed.fuse(feats), cos_sin)
        mask = torch.zeros(2, 7).masked_fill(torch.tensor([[0, 0, 0, 0, 0, 0, 1], [0] * 7]).bool(), float("-inf"))
        cos_sin2 = rotary(embeds[:, :2], position_ids=torch.tensor([[5, 5]]))
        want2 = head(embeds[:, :2], want[1][:, -2:], cos_sin2, want[2], mask)
        got2 = packed(embeds[:, :2], got[1][:, -2:], cos_sin2, got[2], mask)
    for w, g in ((want, got), (want2, got2)):
        for a, b in ((w[0], g[0]), (w[1], g[1]), (w[2].keys, g[2].keys), (w[2].values, g[2].values)):
            assert a.shape == b.shape
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_the_trees_best_path_is_the_greedy_chain() -> None:
    """Siblings share the head's cache in one pass; the tree mask keeps them apart, so the path of
    top-1 children is exactly what the chain drafter drafts greedily."""
    target = four_layer_target(seed=4)
    head = random_head(target, seed=2, aux_layers=LAYERS)
    prompt = torch.tensor([[1, 5, 3, 7, 2, 9]])
    with torch.inference_mode():
        hs = target.model.model(input_ids=prompt, output_hidden_states=True).hidden_states
    feats = torch.cat([hs[j] for j in LAYERS], dim=-1)[:, :-1]  # [1, 5, 3H]
    ctx = DraftContext(prompt, None, SamplingConfig(), torch.Generator(), target_features=feats)
    chain, tree = EagleDrafter(head, tree=None), EagleDrafter(head, tree=32, tree_topk=3, tree_depth=4)
    chain.bind(target), tree.bind(target)
    want = chain.propose(ctx, 4).token_ids[0].tolist()
    draft = tree.propose(ctx, 20)
    parents, tokens = draft.parents[0].tolist(), draft.token_ids[0].tolist()
    assert len(tokens) == 3 + 3 * 3  # 3 roots, then the 3 best children at each further depth
    shallow = tree.propose(ctx, 2)  # the round's K bounds the depth, not the node count
    assert tree_depth(shallow.parents[0].tolist()) == 2 and shallow.num_tokens == 3 + 3
    path, node = [], -1
    for _ in range(4):  # follow the first child of every node: the most probable one
        node = parents.index(node)
        path.append(tokens[node])
    assert path == want


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("nodes", ["auto", 5])
def test_tree_greedy_equals_plain_greedy(seed: int, nodes: int | str) -> None:
    target = four_layer_target(seed=seed + 3)
    dec = SpeculativeDecoder(target, EagleDrafter(None, seed=seed, aux_layers=LAYERS, tree=nodes, tree_topk=2,
                                                  draft_ids=EVEN if seed == 1 else None), num_draft_tokens=6)
    prompt = [1, 5, 3, 7][: 2 + seed]
    out = dec.generate(prompt, max_new_tokens=40, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(target, prompt, 40)
    if nodes == 5:
        assert out.stats.rounds < 40  # some draft tokens were accepted


def _tree_pvalue() -> float:
    target = four_layer_target(seed=1)
    sampling = SamplingConfig(temperature=1.0)
    drafter_ = EagleDrafter(None, aux_layers=LAYERS, tree=4, tree_topk=2)
    dec = SpeculativeDecoder(target, drafter_, num_draft_tokens=4, sampling=sampling)
    counts = sample_two_tokens(dec, [2, 9, 4], n=1200, vocab=target.vocab_size, new_tokens=5)  # a 4-node tree first
    return pooled_chisquare(counts, exact_two_token_distribution(target, [2, 9, 4], sampling))


def test_tree_is_lossless_at_temperature_one() -> None:
    assert _tree_pvalue() > 1e-4


def test_tree_lossless_test_catches_a_residual_that_keeps_rejected_siblings(monkeypatch) -> None:  # noqa: ANN001
    import specdraft.tree

    monkeypatch.setattr(specdraft.tree, "_without", lambda dist, token: dist)  # negative control
    assert _tree_pvalue() < 1e-6


def test_bad_tree_settings_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="tree_topk must be an integer >= 1"):
        EagleDrafter(None, tree_topk=0)
    with pytest.raises(ValueError, match=r"tree must be null \(a chain\), \"auto\" or a node count in \[1, 32\]"):
        EagleDrafter(None, tree=64)
    with pytest.raises(ValueError, match="tree_depth must be an integer >= 1"):
        EagleDrafter(None, tree_depth=0)


@pytest.mark.usefixtures("hydra_conf")
def test_export_for_vllm_round_trips_with_identical_drafts(tmp_path) -> None:  # noqa: ANN001
    """specdraft-export kind=eagle: the speculators layout, the verifier named, the head's
    record kept, and the export drafts exactly what the trained head drafts."""
    from hydra import compose
    from omegaconf import OmegaConf
    from safetensors.torch import load_file

    from specdraft.export import export_from_config

    target = four_layer_target()
    head = random_head(target, seed=2, draft_ids=EVEN, aux_layers=LAYERS)
    save_head(head, tmp_path / "trained", target, verifier="tiny", speculative_tokens=4,
              provenance={"command": "specdraft-train-eagle x=1"}, dtype=torch.float32)
    cfg = compose("export", overrides=[f"source={tmp_path / 'trained'}", f"out_dir={tmp_path / 'vllm'}", "dtype=float32"])
    OmegaConf.set_struct(cfg, False)
    cfg.target = {"_target_": "specdraft.models.tiny_random_target", "vocab_size": 16, "seed": 3, "num_layers": 4}
    out = export_from_config(cfg)
    tensors = load_file(str(out / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == VLLM_WEIGHTS
    assert all(v.dtype == torch.float32 for k, v in tensors.items() if k not in ("d2t", "t2d"))
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == "specdraft.models.tiny_random_target"
    assert config["speculators_config"]["verifier"]["architectures"] == ["LlamaForCausalLM"]
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    assert config["specdraft"]["command"] == "specdraft-train-eagle x=1"
    drafts = [SpeculativeDecoder(target, EagleDrafter(src, tree=None), num_draft_tokens=3)
              .generate([1, 5, 3, 7], max_new_tokens=20, stop_token_ids=[]) for src in (head, out)]
    assert drafts[0].token_ids.tolist() == drafts[1].token_ids.tolist()
    assert drafts[0].stats.rounds == drafts[1].stats.rounds
    with pytest.raises(FileExistsError, match="overwrite=true"):
        export_from_config(cfg)  # the folder is full now
    cfg.format, cfg.overwrite = "medusa", True
    with pytest.raises(ValueError, match="format=medusa is not a layout for kind=eagle"):
        export_from_config(cfg)



def test_shipped_head_is_the_default_and_only_new_weights() -> None:
    """`EagleDrafter()` names the head shipped for the default target: the speculators files, <= 15 MB,
    vLLM's default feature layers for a 30-layer target, no embedding, and how it was made."""
    from safetensors import safe_open

    from specdraft.shipped import require_artifact

    assert EagleDrafter().head_source == "smollm2-135m"
    shipped = require_artifact("smollm2-135m", "EAGLE-3 head", default="eagle")
    assert shipped == require_artifact("smollm2-135m/eagle", "EAGLE-3 head")
    assert sum(f.stat().st_size for f in shipped.iterdir()) <= 15 * 10**6
    config = json.loads((shipped / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27] and config["draft_vocab_size"] == 4096
    assert "specdraft-train-eagle" in config["specdraft"]["command"]
    assert len(config["specdraft"]["eval"]["acceptance_per_position"]) == 3  # held-out, per draft position
    with safe_open(str(shipped / "model.safetensors"), "pt") as f:
        assert not any("embed" in k for k in f.keys())

@pytest.mark.slow
@pytest.mark.parametrize("tree", [None, "auto"])
def test_shipped_head_greedy_exact_on_default_target(default_target: TargetModel, tree) -> None:  # noqa: ANN001
    """`drafter=eagle` loads the shipped head with no extra step; chain and tree are greedy-exact."""
    from specdraft.build import make_drafter

    drafter_ = make_drafter({"_target_": "drafters.eagle.EagleDrafter", "head": "smollm2-135m", "tree": tree})
    dec = SpeculativeDecoder(default_target, drafter_, num_draft_tokens=8 if tree else 3)
    prompt = default_target.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a short note to a neighbour about a lost cat."}],
        add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    out = dec.generate(prompt, max_new_tokens=32, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(default_target, prompt, 32)
    assert out.stats.rounds < 32  # the trained head's drafts are accepted


@pytest.mark.parametrize("tree", [None, 5], ids=["chain", "tree"])
def test_copy_first_rounds_keep_the_head_on_the_features(tree: int | None) -> None:
    """With copy_ngram=1 most rounds copy; the head still takes every round's verified features (it
    would raise "lost track" otherwise), and the output is plain greedy's."""
    target = four_layer_target(seed=4)
    drafter_ = EagleDrafter(None, seed=2, aux_layers=LAYERS, tree=tree, tree_topk=2, copy_ngram=1)
    head_rounds = []
    head_draft = drafter_._head_draft
    drafter_._head_draft = lambda ctx, k: head_rounds.append(k) or head_draft(ctx, k)  # type: ignore[method-assign]
    prompt = [1, 5, 3, 7, 1]
    out = SpeculativeDecoder(target, drafter_, num_draft_tokens=5).generate(prompt, 40, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(target, prompt, 40)
    assert 0 < len(head_rounds) < out.stats.rounds


def test_the_online_heldout_benchmark_counts_rounds_per_position(tmp_path, capsys) -> None:  # noqa: ANN001
    """benchmarks/eagle_heldout.py --online: each head decodes the prompts drafting a fixed chain; the row
    reports the rounds, per position accepted / reached (a probability, and reaching position i needs
    i accepted drafts before it) and tokens per round (>= 1), for a head named by its directory."""
    from pathlib import Path

    module = load_script(Path(__file__).resolve().parents[1] / "benchmarks" / "eagle_heldout.py")
    target = four_layer_target(seed=6)
    save_head(random_head(target, seed=1, aux_layers=LAYERS), tmp_path / "eagle", target, verifier="tiny")
    prompts = [torch.tensor([1, 5, 3, 7]), torch.tensor([2, 4, 6])]
    module.online(target, [str(tmp_path / "eagle")], prompts, 3)
    row = capsys.readouterr().out.strip().splitlines()[-1].split(" | ")
    rounds, acceptance, per_round = int(row[1]), [float(x) for x in row[2].split(" / ")], float(row[3].rstrip(" |"))
    assert rounds > 0 and len(acceptance) == 3 and all(0.0 <= a <= 1.0 for a in acceptance)
    assert per_round >= 1.0 and (per_round > 1.0) == (acceptance[0] > 0)


def test_training_resumes_its_own_checkpoint_and_refuses_another_runs(tmp_path, capsys) -> None:  # noqa: ANN001
    """The same run resumes (more steps allowed); a run with other settings or other data is refused
    with the fix named, and the checkpoint is left as it was."""
    from omegaconf import OmegaConf

    from specdraft.train.eagle import train_head
    from specdraft.vocab import build_pruned_vocab

    target = four_layer_target(seed=5)
    seqs = feature_seqs(target, greedy_sequences(target, 4, seed=1), tmp_path, "train")
    vocab = build_pruned_vocab([s.choice for s in seqs], 12, 16)

    def cfg(steps: int, soft: bool = True):  # noqa: ANN202
        return OmegaConf.create({"aux_layers": list(LAYERS), "seed": 0, "resume": True, "window": 64, "ttt_steps": 3,
                                 "decay": 0.8, "soft_labels": soft, "train": {"max_steps": steps, "lr": 0.003,
                                                                              "warmup_steps": 1, "checkpoint_every": 0}})

    ckpt = tmp_path / "ckpt.pt"
    train_head(cfg(3), target, seqs, [], vocab, ckpt)
    capsys.readouterr()
    _, log = train_head(cfg(5), target, seqs, [], vocab, ckpt)
    out = capsys.readouterr().out
    assert log["steps"] == 5 and f"resumed from {ckpt} at step 3" in out
    saved = ckpt.read_bytes()
    with pytest.raises(ValueError, match=r"made by another run \(it differs in: soft_labels\).*resume=false"):
        train_head(cfg(8, soft=False), target, seqs, [], vocab, ckpt)
    with pytest.raises(ValueError, match=r"differs in: vocab, windows.*checkpoint=<another file>"):
        train_head(cfg(8), target, seqs[:2], [], build_pruned_vocab([s.choice for s in seqs[:2]], 10, 16), ckpt)
    assert ckpt.read_bytes() == saved
