"""Medusa heads and drafter: fresh heads equal the lm_head, greedy exactness (chain and tree) and
statistical losslessness at temperature 1, on tiny random targets with randomly initialised heads;
batches (a chain at B > 1) equal one prompt at a time."""

from __future__ import annotations

import pytest
import torch

from drafters.medusa import MedusaDrafter
from specdraft.decode import SpeculativeDecoder
from specdraft.formats.medusa_heads import MedusaHeads
from specdraft.protocol import DraftContext
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel
from specdraft.train.medusa import build_peft_heads
from specdraft.vocab import PrunedVocab
from tests.helpers import (
    exact_two_token_distribution,
    plain_greedy,
    pooled_chisquare,
    sample_two_tokens,
)
from tests.test_ngram import auto_decoder, batch_equals_one_by_one, check_batches, flat_verify_costs

TREE = [[0], [1], [0, 0], [2], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1]]


def random_heads(target: TargetModel, num_heads: int = 3, seed: int = 0, scale: float = 0.2,
                 recurrent: bool = False):
    """PEFT-wrapped heads with every trainable weight (blocks, token blocks, LoRA A and B) random;
    recurrent: head k also reads the token before it."""
    embed = target.model.get_input_embeddings().weight if recurrent else None
    heads = MedusaHeads(target.lm_head.weight, num_heads=num_heads, num_layers=1, recurrent=recurrent,
                        embed_weight=embed)
    model = build_peft_heads(heads, rank=4, alpha=8)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    return model.eval()


def drafter_with(target: TargetModel, tree=None, seed: int = 0, rows=None,  # noqa: ANN001
                 recurrent: bool = False, copy_ngram: int | None = None) -> MedusaDrafter:
    """Random heads (the heads alone unless copy_ngram is set: the copy-first tests set it)."""
    vocab = None if rows is None else PrunedVocab(rows, target.vocab_size)
    drafter = MedusaDrafter(heads=None, tree=tree, pruned_vocab=vocab, copy_ngram=copy_ngram)
    drafter.attach(random_heads(target, seed=seed, recurrent=recurrent))
    return drafter


def test_fresh_head_reproduces_lm_head_exactly(tiny_target: TargetModel) -> None:
    heads = MedusaHeads(tiny_target.lm_head.weight, num_heads=3, num_layers=2)
    model = build_peft_heads(heads, rank=4, alpha=8)  # LoRA B starts at zero: no delta
    hidden = torch.randn(5, tiny_target.hidden_size)  # [M, H]
    expected = tiny_target.lm_head(hidden)  # [M, V]
    with torch.no_grad():
        logits = model(hidden)  # [M, K, V]
    for k in range(3):
        assert torch.equal(logits[:, k], expected)
    drafter = MedusaDrafter(heads=None, tree=None)
    drafter.bind(tiny_target)
    # the drafter's packed inference form re-associates the same sums: equal up to rounding
    assert torch.allclose(drafter.head_logits(hidden)[:, 0], expected, rtol=0, atol=1e-5)
    assert torch.equal(drafter.head_logits(hidden).argmax(-1), expected.argmax(-1)[:, None].expand(-1, 3))


def test_heads_have_distinct_blocks_and_share_the_projection(tiny_target: TargetModel) -> None:
    heads = MedusaHeads(tiny_target.lm_head.weight, num_heads=3, num_layers=2)
    blocks = [b for head in heads.blocks for b in head]
    assert len({id(b) for b in blocks}) == 6
    assert len({b.linear.weight.data_ptr() for b in blocks}) == 6
    assert all(p.weight is tiny_target.lm_head.weight for p in heads.lm_heads)
    full = MedusaHeads(tiny_target.lm_head.weight, num_heads=2, full_projection=True)
    assert full.lm_heads[0].weight.data_ptr() != tiny_target.lm_head.weight.data_ptr()


def test_compiled_heads_match_peft_forward(tiny_target: TargetModel) -> None:
    model = random_heads(tiny_target)
    drafter = MedusaDrafter(heads=None, tree=None)
    drafter.attach(model)
    hidden = torch.randn(3, tiny_target.hidden_size)
    with torch.no_grad():
        assert torch.allclose(drafter.head_logits(hidden), model(hidden), atol=1e-5)


def test_no_hidden_state_proposes_nothing(tiny_target: TargetModel) -> None:
    drafter = drafter_with(tiny_target)
    ctx = DraftContext(torch.tensor([[1, 2]]), None, SamplingConfig(), torch.Generator())
    assert drafter.propose(ctx, 3).num_tokens == 0


def test_sampled_proposal_returns_q(tiny_target: TargetModel) -> None:
    drafter = drafter_with(tiny_target)
    hidden = torch.randn(1, tiny_target.hidden_size)
    ctx = DraftContext(torch.tensor([[1]]), hidden, SamplingConfig(temperature=1.0), torch.Generator())
    draft = drafter.propose(ctx, 2)
    assert draft.token_ids.shape == (1, 2) and draft.probs is not None
    assert draft.probs.shape == (1, 2, tiny_target.vocab_size)
    assert torch.allclose(draft.probs.sum(-1), torch.ones(1, 2))


@pytest.mark.parametrize("tree", [None, TREE])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("recurrent", [False, True], ids=["plain", "recurrent"])
def test_greedy_equals_plain_greedy(tree, seed: int, recurrent: bool) -> None:  # noqa: ANN001
    from specdraft.models import tiny_random_target

    target = tiny_random_target(vocab_size=16, seed=seed + (20 if recurrent else 10))
    rows = torch.arange(0, 16, 2)  # seed 1: a pruned vocabulary of the even ids
    drafter = drafter_with(target, tree=tree, seed=seed, rows=rows if seed == 1 else None,
                           recurrent=recurrent)
    dec = SpeculativeDecoder(target, drafter, num_draft_tokens=len(TREE) if tree else 3)
    prompt = [1, 5, 3, 7][: 1 + seed]
    out = dec.generate(prompt, max_new_tokens=40, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(target, prompt, 40)
    assert out.stats.rounds < 40  # some draft tokens were accepted


@pytest.mark.parametrize("pruned", [False, True])
@pytest.mark.parametrize("recurrent", [False, True], ids=["plain", "recurrent"])
def test_chain_is_lossless_at_temperature_one(tiny_target: TargetModel, pruned: bool, recurrent: bool) -> None:
    sampling = SamplingConfig(temperature=1.0)
    rows = torch.tensor([0, 2, 3, 5, 7, 8, 9, 11, 12, 14]) if pruned else None
    drafter = drafter_with(tiny_target, seed=3, rows=rows, recurrent=recurrent)
    dec = SpeculativeDecoder(tiny_target, drafter, num_draft_tokens=2, sampling=sampling)
    prompt = [2, 9]
    counts = sample_two_tokens(dec, prompt, n=1200, vocab=tiny_target.vocab_size)
    exact = exact_two_token_distribution(tiny_target, prompt, sampling)
    assert pooled_chisquare(counts, exact) > 1e-4


def test_tree_is_proposed_at_any_temperature(tiny_target: TargetModel) -> None:
    drafter = drafter_with(tiny_target, tree=TREE)
    hidden = torch.randn(1, tiny_target.hidden_size)
    for sampling in (SamplingConfig(), SamplingConfig(temperature=0.7)):
        ctx = DraftContext(torch.tensor([[1]]), hidden, sampling, torch.Generator())
        tree = drafter.propose(ctx, 5)
        assert tree.parents is not None and tree.num_tokens == 5


def tree_two_token_pvalue(target: TargetModel, sampling: SamplingConfig, recurrent: bool = False) -> float:
    """Chi-square p-value of the first two tokens of tree-drafted sampling vs the target's law."""
    drafter = drafter_with(target, tree=TREE, seed=4, recurrent=recurrent)
    dec = SpeculativeDecoder(target, drafter, num_draft_tokens=len(TREE), sampling=sampling)
    prompt = [2, 9]
    counts = sample_two_tokens(dec, prompt, n=1500, vocab=target.vocab_size)
    return pooled_chisquare(counts, exact_two_token_distribution(target, prompt, sampling))


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.0),
                                      SamplingConfig(temperature=0.8, top_p=0.9)], ids=["t1", "top_p"])
@pytest.mark.parametrize("recurrent", [False, True], ids=["plain", "recurrent"])
def test_tree_is_lossless_when_sampling(tiny_target: TargetModel, sampling: SamplingConfig, recurrent: bool) -> None:
    assert tree_two_token_pvalue(tiny_target, sampling, recurrent) > 1e-4


def test_tree_sampling_test_catches_a_broken_residual(tiny_target: TargetModel, monkeypatch) -> None:  # noqa: ANN001
    """Negative control: if a rejected sibling stayed in the residual (it can be tried again and
    drawn again), the same test must fail."""
    import specdraft.tree

    monkeypatch.setattr(specdraft.tree, "_without", lambda dist, token: dist)
    assert tree_two_token_pvalue(tiny_target, SamplingConfig(temperature=1.0)) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("heads", ["smollm2-135m", "smollm2-135m/medusa_recurrent"])
@pytest.mark.parametrize("tree", [None, "auto"])
def test_shipped_heads_greedy_exact_on_default_target(default_target: TargetModel, tree, heads: str) -> None:  # noqa: ANN001
    drafter = MedusaDrafter(heads=heads, tree=tree)
    dec = SpeculativeDecoder(default_target, drafter, num_draft_tokens=16 if tree else 3)
    tok = default_target.tokenizer
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Explain what a Python list comprehension is."}],
        add_generation_prompt=True,
        tokenize=True,
    )
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    out = dec.generate(prompt, max_new_tokens=32, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(default_target, list(prompt), 32)
    assert out.stats.rounds < 32
    if tree == "auto":  # sized for this target's measured verify-cost curve
        assert drafter.tree_curve is not None and drafter.paths


# ------------------------------------------------------------------ recurrent (Hydra-style) heads
def random_recurrent_heads(target: TargetModel, seed: int = 0):  # noqa: ANN201
    return random_heads(target, seed=seed, recurrent=True)


def recurrent_drafter(target: TargetModel, tree=None, seed: int = 0, rows=None) -> MedusaDrafter:  # noqa: ANN001
    return drafter_with(target, tree=tree, seed=seed, rows=rows, recurrent=True)


def test_recurrent_heads_need_the_embedding(tiny_target: TargetModel) -> None:
    with pytest.raises(ValueError, match="embed_weight"):
        MedusaHeads(tiny_target.lm_head.weight, recurrent=True)


def test_fresh_recurrent_head_reproduces_lm_head_exactly(tiny_target: TargetModel) -> None:
    embed = tiny_target.model.get_input_embeddings().weight
    heads = MedusaHeads(tiny_target.lm_head.weight, num_heads=3, num_layers=1, recurrent=True, embed_weight=embed)
    model = build_peft_heads(heads, rank=4, alpha=8)
    hidden = torch.randn(5, tiny_target.hidden_size)  # [M, H]
    tokens = torch.randint(tiny_target.vocab_size, (5, 3))  # [M, K]
    with torch.no_grad():
        logits = model(hidden, tokens)  # [M, K, V]
        expected = tiny_target.lm_head(hidden)  # [M, V]
    for k in range(3):
        assert torch.equal(logits[:, k], expected)
    # the trained parts are the blocks, the token blocks and the LoRA factors, never the target's
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any(".inputs." in n for n in trained) and not any("embed" in n for n in trained)


def test_recurrent_steps_match_the_teacher_forced_forward(tiny_target: TargetModel) -> None:
    """Stepping head by head on the drafted tokens equals the batched teacher-forced forward that
    training uses; a head's logits change with the token before it (it is conditioned on it)."""
    from drafters.medusa_forms import CompiledHeads, PackedRecurrentHeads

    model = random_recurrent_heads(tiny_target, seed=5)
    compiled = CompiledHeads(model)
    hidden = torch.randn(4, tiny_target.hidden_size)
    tokens = torch.randint(tiny_target.vocab_size, (4, 3))
    with torch.no_grad():
        forward = model(hidden, tokens)  # [4, K, V]
    state = hidden
    for k in range(3):
        state, logits = compiled.step(k, state, tokens[:, k])
        assert torch.allclose(logits, forward[:, k], atol=1e-5)
    packed = PackedRecurrentHeads(compiled)  # the drafter's inference form: same sums, packed
    state = hidden
    for k in range(3):
        state, logits = packed.step(k, state, tokens[:, k])
        assert torch.allclose(logits, forward[:, k], atol=1e-4)
    _, other = compiled.step(0, hidden, (tokens[:, 0] + 1) % tiny_target.vocab_size)
    assert not torch.allclose(other, forward[:, 0])
    with pytest.raises(ValueError, match="tokens"):
        model(hidden)


def test_recurrent_tree_children_follow_their_parent(tiny_target: TargetModel) -> None:
    """A tree node's children are its own path's head guesses: (0, 0) is head 2's best guess after
    head 1's best token, (1, 0) its best guess after head 1's second token."""
    drafter = recurrent_drafter(tiny_target, tree=[[0], [1], [0, 0], [1, 0]], seed=6)
    compiled = drafter._compiled
    hidden = torch.randn(1, tiny_target.hidden_size)
    ctx = DraftContext(torch.tensor([[4]]), hidden, SamplingConfig(), torch.Generator())
    draft = drafter.propose(ctx, 4)
    assert draft.parents[0].tolist() == [-1, -1, 0, 1]
    state, logits = compiled.step(0, hidden, torch.tensor([4]))
    first, second = logits[0].topk(2).indices.tolist()
    toks = draft.token_ids[0].tolist()
    assert toks[:2] == [first, second]
    for node, parent_token in ((2, first), (3, second)):
        _, child = compiled.step(1, state, torch.tensor([parent_token]))
        assert toks[node] == int(child[0].argmax())


def test_recurrent_chain_test_catches_a_q_that_is_not_the_drafts_law(tiny_target: TargetModel,
                                                                       monkeypatch) -> None:  # noqa: ANN001
    """Negative control: drafting each head's argmax while reporting its full distribution as q
    (q no longer the law the tokens were drawn from) must fail the same test."""
    import drafters.medusa

    monkeypatch.setattr(drafters.medusa, "sample", lambda q, generator: q.argmax(dim=-1))
    sampling = SamplingConfig(temperature=1.0)
    drafter = recurrent_drafter(tiny_target, seed=3)
    dec = SpeculativeDecoder(tiny_target, drafter, num_draft_tokens=2, sampling=sampling)
    counts = sample_two_tokens(dec, [2, 9], n=1200, vocab=tiny_target.vocab_size)
    assert pooled_chisquare(counts, exact_two_token_distribution(tiny_target, [2, 9], sampling)) < 1e-6


# ------------------------------------------------------------------ the lazy tree sizing
def heads_dir_with_accuracy(target: TargetModel, path, accuracy: list[list[float]]):  # noqa: ANN001, ANN201
    """Random heads saved as specdraft-train-medusa does, with hand-written held-out accuracies."""
    from specdraft.formats.medusa_heads import save_accuracy, save_heads

    save_heads(random_heads(target, seed=7), path, {"command": "test"})
    save_accuracy(path, {"selfgen": {"rank_accuracy": accuracy, "label_ranks": []}})
    return path


def test_auto_tree_is_sized_on_first_proposal_for_the_measured_curve(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """Building and binding do no timing; the first proposal measures the target's verify-cost curve
    (specdraft.costs, once per model), sizes the tree for it, and leaves the target's cache as it was
    (greedy output equals plain greedy)."""
    import specdraft.costs
    from drafters.medusa_tree import MAX_TREE_NODES, choose_tree
    from specdraft.models import tiny_random_target

    target = tiny_random_target(vocab_size=16, seed=3)  # a fresh model: no curve memoised on it
    accuracy = [[0.6, 0.2, 0.1], [0.4, 0.1, 0.05], [0.3, 0.1, 0.05]]
    heads = heads_dir_with_accuracy(target, tmp_path / "heads", accuracy)
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path / "cache"))  # nothing cached: it must be measured
    measure = specdraft.costs.measure_verify_curve
    calls: list[int] = []

    def refuse(target, max_k, **kwargs):  # noqa: ANN001, ANN202
        raise AssertionError("the target was timed while building or binding the drafter")

    def record(target, max_k, **kwargs):  # noqa: ANN001, ANN202
        calls.append(max_k)
        return measure(target, max_k, **kwargs)

    monkeypatch.setattr(specdraft.costs, "measure_verify_curve", refuse)
    drafter = MedusaDrafter(heads=str(heads), tree="auto", pruned_vocab=None)
    dec = SpeculativeDecoder(target, drafter, num_draft_tokens=8)  # binds
    drafter.bind(target)
    assert drafter.paths is None and drafter.tree_curve is None

    monkeypatch.setattr(specdraft.costs, "measure_verify_curve", record)
    prompt = [1, 5, 3, 7]
    out = dec.generate(prompt, max_new_tokens=24, stop_token_ids=[])
    assert calls == [MAX_TREE_NODES]
    assert drafter.tree_curve == target.verify_costs[1][: MAX_TREE_NODES + 1]
    assert drafter.paths == choose_tree(accuracy, drafter.tree_curve)
    assert out.token_ids[0].tolist() == plain_greedy(target, prompt, 24)
    dec.generate(prompt, max_new_tokens=8, stop_token_ids=[])
    assert calls == [MAX_TREE_NODES]  # measured once per model


def test_auto_tree_follows_the_curve_it_is_given(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """A steeper measured curve gives a smaller tree: the sizing reads specdraft.costs.verify_curve."""
    import specdraft.costs
    from drafters.medusa_tree import MAX_TREE_NODES
    from specdraft.models import tiny_random_target

    target = tiny_random_target(vocab_size=16, seed=3)
    accuracy = [[0.6, 0.2, 0.1, 0.05], [0.4, 0.1, 0.05, 0.03], [0.3, 0.1, 0.05, 0.02]]
    heads = heads_dir_with_accuracy(target, tmp_path / "heads", accuracy)
    hidden = torch.randn(1, target.hidden_size)
    sizes = {}
    for name, slope in (("flat", 0.003), ("steep", 0.5)):
        curve = [1.0 + slope * k for k in range(MAX_TREE_NODES + 1)]
        monkeypatch.setattr(specdraft.costs, "verify_curve", lambda t, max_k, c=curve: c[: max_k + 1])
        drafter = MedusaDrafter(heads=str(heads), pruned_vocab=None)
        drafter.bind(target)
        ctx = DraftContext(torch.tensor([[4]]), hidden, SamplingConfig(), torch.Generator())
        draft = drafter.propose(ctx, MAX_TREE_NODES)
        assert drafter.tree_curve == curve and draft.num_tokens == len(drafter.paths)
        sizes[name] = len(drafter.paths)
    assert 1 <= sizes["steep"] < sizes["flat"]


# ------------------------------------------------------------------------------- batches
@pytest.mark.parametrize("k", [3, "auto"])
@pytest.mark.parametrize("recurrent", [False, True], ids=["plain", "recurrent"])
def test_batch_equals_one_by_one(k: int | str, recurrent: bool) -> None:
    from specdraft.models import tiny_random_target

    target = flat_verify_costs(tiny_random_target(vocab_size=16, seed=17 if recurrent else 11))  # heads that hit
    drafter = drafter_with(target, seed=0, recurrent=recurrent)
    dec = SpeculativeDecoder(target, drafter, num_draft_tokens=k) if k != "auto" else auto_decoder(target, drafter, 3)
    check_batches(dec)


@pytest.mark.parametrize("recurrent", [False, True], ids=["plain", "recurrent"])
def test_batch_proposes_a_chain_for_every_row(tiny_target: TargetModel, recurrent: bool) -> None:
    """Trees at batch size 1 only: at B > 1 the heads' chain for all rows at once, row i's the
    same as row i alone (greedy), and a q per row when sampling."""
    drafter = drafter_with(tiny_target, tree=TREE, recurrent=recurrent)
    hidden = torch.randn(3, tiny_target.hidden_size)  # [B, H]
    tokens = torch.tensor([[1, 4], [0, 2], [3, 5]])
    greedy = DraftContext(tokens, hidden, SamplingConfig(), torch.Generator(), lengths=(2, 1, 2))
    draft = drafter.propose(greedy, 3)
    assert draft.parents is None and draft.token_ids.shape == (3, 3) and draft.lengths is None
    chain = MedusaDrafter(heads=None, tree=None)
    chain.attach(drafter.model)
    for i in range(3):
        alone = chain.propose(DraftContext(tokens[i : i + 1], hidden[i : i + 1], SamplingConfig(), torch.Generator()), 3)
        assert torch.equal(draft.token_ids[i], alone.token_ids[0])
    sampled = DraftContext(tokens, hidden, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
    draft = drafter.propose(sampled, 2)
    assert draft.token_ids.shape == (3, 2) and draft.probs.shape == (3, 2, tiny_target.vocab_size)
    assert torch.allclose(draft.probs.sum(-1), torch.ones(3, 2))
    drafter.keep_rows([2])  # the heads keep no per-row state (copying is off here)
    assert drafter.propose(DraftContext(tokens[2:], hidden[2:], SamplingConfig(), torch.Generator()), 5).parents is not None


def test_a_tree_drafter_in_a_batch_that_shrinks_to_one_row(tiny_target: TargetModel) -> None:
    """Row 1 stops on its 2nd token; row 0 goes on alone, where the drafter proposes its tree."""
    dec = SpeculativeDecoder(tiny_target, drafter_with(tiny_target, tree=TREE), num_draft_tokens=len(TREE))
    prompts = [[1, 5, 3, 7], [4, 5]]
    stop = [int(dec.generate(prompts[1], 12, stop_token_ids=[]).token_ids[0, 1])]
    batch = batch_equals_one_by_one(dec, prompts, 12, stop)
    assert batch[1].stats.new_tokens == 2 and batch[0].stats.new_tokens > batch[1].stats.new_tokens + 1


# ------------------------------------------------------------------------------- copy first
def test_copy_first_drafts_the_copy_where_the_context_repeats(tiny_target: TargetModel) -> None:
    """The last 2 tokens [1, 2] occurred before, followed by [3, 4, 1]: that is the draft (one-hot q,
    even when sampling); a context without a repeat gets the heads' draft, the same as the heads alone."""
    drafter = drafter_with(tiny_target, tree=TREE, copy_ngram=2)
    heads_alone = MedusaDrafter(heads=None, tree=TREE, copy_ngram=None)
    heads_alone.attach(drafter.model)
    hidden = torch.randn(1, tiny_target.hidden_size)
    for sampling in (SamplingConfig(), SamplingConfig(temperature=1.0)):
        ctx = DraftContext(torch.tensor([[1, 2, 3, 4, 1, 2]]), hidden, sampling, torch.Generator())
        draft = drafter.propose(ctx, 3)
        assert draft.token_ids.tolist() == [[3, 4, 1]] and draft.probs is None and draft.parents is None
    drafter.reset()
    ctx = DraftContext(torch.tensor([[1, 2, 3, 4]]), hidden, SamplingConfig(), torch.Generator())
    draft, alone = drafter.propose(ctx, 5), heads_alone.propose(ctx, 5)
    assert draft.parents is not None and torch.equal(draft.token_ids, alone.token_ids)
    with pytest.raises(ValueError, match="copy_ngram"):
        MedusaDrafter(heads=None, copy_ngram=3, copy_max_ngram=2)


@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
@pytest.mark.parametrize("recurrent", [False, True], ids=["plain", "recurrent"])
def test_copy_first_greedy_equals_plain_greedy(tree, recurrent: bool) -> None:  # noqa: ANN001
    from specdraft.models import tiny_random_target

    target = tiny_random_target(vocab_size=16, seed=9)  # a seed whose outputs repeat
    drafter = drafter_with(target, tree=tree, seed=1, recurrent=recurrent, copy_ngram=2)
    dec = SpeculativeDecoder(target, drafter, num_draft_tokens=len(TREE) if tree else 3)
    prompt = [1, 5, 3, 7, 1, 5]
    out = dec.generate(prompt, max_new_tokens=40, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(target, prompt, 40)
    assert out.stats.rounds < 40


def test_copy_and_model_rounds_get_their_own_k_policy(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """Under "auto" a copy-first drafter's two sources get one cost model each (costs measured per
    source), every round records its source, and greedy output stays the plain greedy output. A
    `source_of` that answers out of range is a clear error."""
    from specdraft.draft_length import PerSourceDraftLength
    from specdraft.models import tiny_random_target

    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path))
    target = flat_verify_costs(tiny_random_target(vocab_size=16, seed=9))
    drafter = drafter_with(target, seed=1, copy_ngram=2)
    assert drafter.draft_sources == ("copy", "model")
    dec = SpeculativeDecoder(target, drafter, num_draft_tokens="auto", max_draft_tokens=4)
    prompt = [1, 5, 3, 7, 1, 5]
    out = dec.generate(prompt, max_new_tokens=40, stop_token_ids=[])
    assert out.token_ids[0].tolist() == plain_greedy(target, prompt, 40)
    assert set(out.stats.source_per_round) == {0, 1} and len(out.stats.source_per_round) == out.stats.rounds
    policy = dec.new_policy()
    assert isinstance(policy, PerSourceDraftLength) and len(policy.policies) == 2
    assert len(dec.draft_costs_per_token(SamplingConfig())) == 2
    assert MedusaDrafter(heads=None, copy_ngram=None).draft_sources == ()
    monkeypatch.setattr(drafter, "source_of", lambda ctx: [2])
    with pytest.raises(ValueError, match="source_of returned \\[2\\]"):
        dec.generate(prompt, max_new_tokens=4)


@pytest.mark.parametrize("k", [3, "auto"])
@pytest.mark.parametrize("recurrent", [False, True], ids=["plain", "recurrent"])
def test_copy_first_batch_equals_one_by_one(recurrent: bool, k: int | str) -> None:
    """Rows of a batch copy or ask the heads each on their own; under "auto" each source has its own
    K policy and a round drafts the largest K its rows' sources choose."""
    from specdraft.models import tiny_random_target

    target = flat_verify_costs(tiny_random_target(vocab_size=16, seed=9))
    drafter = drafter_with(target, seed=0, recurrent=recurrent, copy_ngram=2)
    free = check_batches(SpeculativeDecoder(target, drafter, num_draft_tokens=3) if k == 3 else auto_decoder(target, drafter))[0]
    rounds = zip(*(row.stats.source_per_round for row in free))  # the rows' sources, round by round
    assert any(len(set(sources)) > 1 for sources in rounds)  # some round mixed copies and head drafts


def test_copy_first_is_lossless_at_temperature_one(tiny_target: TargetModel) -> None:
    """The prompt ends in a repeat, so the first round drafts the copy; the rest as the heads say."""
    sampling = SamplingConfig(temperature=1.0)
    drafter = drafter_with(tiny_target, seed=3, copy_ngram=1)
    dec = SpeculativeDecoder(tiny_target, drafter, num_draft_tokens=2, sampling=sampling)
    prompt = [2, 9, 4, 2, 9]
    counts = sample_two_tokens(dec, prompt, n=1200, vocab=tiny_target.vocab_size, new_tokens=3)
    exact = exact_two_token_distribution(tiny_target, prompt, sampling)
    assert pooled_chisquare(counts, exact) > 1e-4


def test_copy_first_sampled_batch_is_lossless_and_a_wrong_copy_q_is_caught(monkeypatch) -> None:  # noqa: ANN001
    """Rows 0 and 2 end in a repeat (their first round copies), rows 1 and 3 do not (the heads draft):
    every row's first two tokens follow the target's law. Negative control: the same batches with the
    copied rows' q claimed uniform instead of one-hot must fail."""
    import drafters.copy_first
    from specdraft.models import tiny_random_target
    from tests.test_generate_batch import batch_pvalue

    target = tiny_random_target(vocab_size=16, seed=1)
    prompts = [[1, 2, 3, 1, 2], [4, 5], [6, 1, 6, 1, 6], [2, 9, 3]]
    sampling = SamplingConfig(temperature=1.0)
    dec = SpeculativeDecoder(target, drafter_with(target, seed=3, copy_ngram=1), 2, sampling)
    assert batch_pvalue(target, dec, prompts) > 1e-4

    merge = drafters.copy_first.copy_first

    def uniform_copy_q(copy, model, vocab_size):  # noqa: ANN001, ANN202
        out = merge(copy, model, vocab_size)
        if out.probs is not None and copy.lengths is not None:
            for row, n in enumerate(copy.lengths.tolist()):
                out.probs[row, :n] = 1.0 / vocab_size
        return out

    monkeypatch.setattr(drafters.copy_first, "copy_first", uniform_copy_q)
    assert batch_pvalue(target, dec, prompts) < 1e-6
