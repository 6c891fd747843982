"""Suffix decoding: the index against brute force on random token arrays, eviction within budget,
the store's file round trip, greedy exactness (chain and tree) and statistical losslessness at
temperature 1 with negative controls, on tiny random targets; batches equal one prompt at a time."""

from __future__ import annotations

import random

import pytest
import torch

from drafters.suffix import SourceTrust, SuffixDrafter, expected_tokens
from drafters.suffix_index import Candidate, Match, SuffixIndex, best_chain, continuation_tree
from specdraft.check.broken import always_accept
from specdraft.costs import nodes_worth_verifying
from specdraft.decode import SpeculativeDecoder
from specdraft.models import tiny_random_target
from specdraft.protocol import DraftContext
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel
from tests.helpers import exact_two_token_distribution, plain_greedy, pooled_chisquare, sample_two_tokens
from tests.test_ngram import auto_decoder, check_batches, flat_verify_costs


# ------------------------------------------------------------------------------- brute force
def brute_match(seqs: list[list[int]], context: list[int], max_match: int) -> Match | None:
    """Longest suffix of context (<= max_match) occurring with a next token, and all its occurrences."""
    for length in range(min(max_match, len(context)), 0, -1):
        want = context[len(context) - length :]
        occ = [(sid, end) for sid, seq in enumerate(seqs) for end in range(length - 1, len(seq) - 1)
               if seq[end - length + 1 : end + 1] == want]
        if occ:
            return Match(length, tuple(occ))
    return None


def random_seqs(rng: random.Random, n: int, vocab: int, lo: int = 0, hi: int = 60) -> list[list[int]]:
    return [[rng.randrange(vocab) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_match_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    vocab, anchor, max_match = 2 + seed % 3, 1 + seed % 4, 3 + seed
    seqs = random_seqs(rng, 4, vocab)
    index = SuffixIndex(anchor)
    for s in seqs:
        index.add(s)
    for _ in range(40):
        context = [rng.randrange(vocab) for _ in range(rng.randrange(1, 20))]
        got = index.match(context, max_match, max_occurrences=10_000)
        want = brute_match(seqs, context, max_match)
        if want is None:
            assert got is None
            continue
        assert got is not None and got.length == want.length, context
        assert sorted(got.occurrences) == sorted(want.occurrences)


def test_most_recent_occurrences_are_examined_first() -> None:
    index = SuffixIndex(anchor=2)
    seq = index.add([1, 2, 3, 1, 2, 4, 1, 2, 5])
    match = index.match([7, 1, 2], max_match=8, max_occurrences=2)
    assert match == Match(2, ((seq, 7), (seq, 4)))
    assert index.continuations(match, 3) == [[5], [4, 1, 2]]


def test_growing_sequence_equals_one_built_whole() -> None:
    rng = random.Random(3)
    tokens = [rng.randrange(3) for _ in range(200)]
    whole, grown = SuffixIndex(3), SuffixIndex(3)
    whole.add(tokens)
    seq = grown.start()
    i = 0
    while i < len(tokens):
        step = rng.randrange(1, 6)
        grown.extend(seq, tokens[i : i + step])
        i += step
    assert grown._occurrences == whole._occurrences
    # a growing sequence never matches its own last token: the suffix must have been followed
    assert whole.match(tokens, 50, 100).occurrences[0][1] < len(tokens) - 1


def test_eviction_keeps_the_budget_and_equals_a_fresh_index() -> None:
    rng = random.Random(7)
    budget = 150
    index = SuffixIndex(3, max_tokens=budget)
    kept: list[list[int]] = []
    for seq in random_seqs(rng, 30, 3, lo=1, hi=70):
        index.add(seq)
        kept.append(seq)
        while sum(map(len, kept)) > budget:
            kept.pop(0)
        assert index.num_tokens == sum(map(len, kept)) <= budget
    fresh = SuffixIndex(3)
    for seq in kept:
        fresh.add(seq)
    assert list(index.sequences.values()) == kept
    assert {g: [index.sequences[s][e] for s, e in occ] for g, occ in index._occurrences.items()} == \
        {g: [fresh.sequences[s][e] for s, e in occ] for g, occ in fresh._occurrences.items()}


def test_a_sequence_longer_than_the_budget_keeps_its_tail() -> None:
    index = SuffixIndex(2, max_tokens=5)
    index.add(list(range(20)))
    assert list(index.sequences.values()) == [[15, 16, 17, 18, 19]] and index.num_tokens == 5


def test_continuation_tree_counts_and_order() -> None:
    windows = [[1, 2, 3], [1, 2, 4], [1, 5], [6], [1, 2, 3]]
    nodes = continuation_tree(windows, max_nodes=10, min_prob=0.0)
    paths: list[tuple[int, ...]] = []
    for i, n in enumerate(nodes):
        assert n.parent < i  # parents first
        paths.append((n.token,) if n.parent < 0 else (*paths[n.parent], n.token))
        assert n.depth == len(paths[-1])
    by_path = {p: n.prob for p, n in zip(paths, nodes)}
    assert by_path == {(1,): 0.8, (1, 2): 0.6, (1, 2, 3): 0.4, (1, 2, 4): 0.2, (1, 5): 0.2, (6,): 0.2}
    assert [n.prob for n in nodes] == sorted((n.prob for n in nodes), reverse=True)
    assert len(continuation_tree(windows, max_nodes=10, min_prob=0.3)) == 3
    top2 = continuation_tree(windows, max_nodes=2, min_prob=0.0)
    assert [(n.token, n.parent) for n in top2] == [(1, -1), (2, 0)]


def test_best_chain_follows_the_majority() -> None:
    chain = best_chain([[1, 2, 3], [1, 2, 4], [1, 5], [6], [1, 2, 3]], min_prob=0.3)
    assert [(c.token, c.parent, c.depth) for c in chain] == [(1, -1, 1), (2, 0, 2), (3, 1, 3)]
    assert [c.prob for c in chain] == [0.8, 0.6, 0.4]


def test_trust_discounts_every_further_token() -> None:
    windows = [[1, 2, 3], [1, 2, 4], [1, 5], [6], [1, 2, 3]]
    chain = best_chain(windows, min_prob=0.0, trust=0.5)
    assert [c.prob for c in chain] == pytest.approx([0.8 * 0.5, 0.6 * 0.25, 0.4 * 0.125])
    assert [c.token for c in best_chain(windows, min_prob=0.1, trust=0.5)] == [1, 2]  # 0.05 < min_prob
    nodes = continuation_tree(windows, max_nodes=10, min_prob=0.0, trust=0.5)
    paths: list[tuple[int, ...]] = []
    for i, n in enumerate(nodes):
        assert n.parent < i  # still parents first
        paths.append((n.token,) if n.parent < 0 else (*paths[n.parent], n.token))
    # ranked by the discounted probability: the shallow rare (6,) now comes before the deep frequent (1, 2, 3)
    assert paths == [(1,), (1, 2), (6,), (1, 5), (1, 2, 3), (1, 2, 4)]
    assert [n.prob for n in nodes] == pytest.approx([0.4, 0.15, 0.1, 0.05, 0.05, 0.025])
    with pytest.raises(ValueError, match=r"trust must be in \(0, 1\]"):
        best_chain(windows, min_prob=0.0, trust=1.5)


def test_source_trust_follows_what_the_target_kept() -> None:
    trust = SourceTrust(prior=0.8, weight=4.0)
    assert trust.of("corpus") == pytest.approx(0.8)  # before any evidence: the prior
    trust.observe("corpus", promised=4.0, kept=0)
    assert trust.of("corpus") == pytest.approx(3.2 / 8.0)
    assert trust.of("request") == pytest.approx(0.8)  # every source has its own
    trust.observe("request", promised=2.0, kept=6)
    assert trust.of("request") == 1.0  # never above the occurrence shares
    assert SourceTrust(prior=None, weight=4.0).of("corpus") == 1.0  # no discount


def test_a_source_that_keeps_missing_drafts_less_in_this_request_only() -> None:
    drafter = SuffixDrafter(anchor=2, store_tokens=0, corpus=None, spec_factor=1.0, spec_offset=1.0, trust_prior=0.8,
                            trust_weight=2.0)
    drafter.bind(flat_costs(tiny_random_target(vocab_size=16, seed=1)))
    ctx = DraftContext(torch.tensor([[1, 2, 3, 4, 5, 6, 1, 2]]), None, SamplingConfig(), torch.Generator())
    sizes = []
    for _ in range(6):  # [1, 2] matched: 3 deep, 0.8 / 0.64 / 0.51 at first; the target keeps none of it
        sizes.append(drafter.propose(ctx, 8).num_tokens)
        drafter.commit(ctx, [0])
    assert sizes[0] == 3 and sizes[-1] == 1 and sizes == sorted(sizes, reverse=True)  # min_prob cuts the deep ones
    assert drafter.trusts[0].of("request") < 0.3
    drafter.reset()  # a new request starts from the prior again
    assert drafter.propose(ctx, 8).num_tokens == 3


def test_nodes_are_verified_only_while_they_pay() -> None:
    nodes = [Candidate(1, -1, 1, 0.9), Candidate(2, 0, 2, 0.8), Candidate(3, 1, 3, 0.05)]
    flat = [1.0, 1.0, 1.0, 1.0]
    probs = [n.prob for n in nodes]
    assert nodes_worth_verifying(probs, flat) == 3  # free verification: take everything
    steep = [1.0, 1.5, 2.0, 3.0]
    assert nodes_worth_verifying(probs, steep) == 2  # (1 + 1.7) / 2.0 beats 1.9/1.5 and 2.75/3
    assert nodes_worth_verifying([Candidate(1, -1, 1, 0.2).prob], steep) == 0  # 1.2 / 1.5 < 1
    assert expected_tokens(nodes) == pytest.approx(2.75)


# ------------------------------------------------------------------------------- the drafter
def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="anchor must be an integer >= 1"):
        SuffixDrafter(anchor=0)
    with pytest.raises(ValueError, match="min_prob must be in"):
        SuffixDrafter(min_prob=2.0)
    with pytest.raises(ValueError, match="trust_prior must be in"):
        SuffixDrafter(trust_prior=0.0)
    with pytest.raises(ValueError, match="trust_weight must be a number > 0"):
        SuffixDrafter(trust_weight=0)
    with pytest.raises(ValueError, match="no such file"):
        SuffixDrafter(store_path="/nonexistent/store.json")


def warm_store(drafter: SuffixDrafter, target: TargetModel, prompts: list[list[int]], n: int = 40) -> None:
    """Teach the store sampled continuations of the prompts (what earlier traffic left behind)."""
    dec = SpeculativeDecoder(target, None, num_draft_tokens=0, sampling=SamplingConfig(temperature=1.0))
    for i in range(n):
        prompt = prompts[i % len(prompts)]
        out = dec.generate(prompt, 6, stop_token_ids=[], sampling=SamplingConfig(temperature=1.0, seed=i))
        drafter.learn(torch.tensor(prompt[-2:] + out.token_ids[0].tolist()), 0)


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_equals_plain_greedy(tree: bool, seed: int) -> None:
    target = flat_costs(tiny_random_target(vocab_size=16, seed=30 + seed))
    drafter = SuffixDrafter(tree=tree, anchor=2, min_prob=0.0, store_min_match=1)
    prompts = [[1, 5, 3, 7, 1, 5, 3, 7, 1, 5], [2, 4, 6, 2, 4], [3, 3, 3, 3]]
    warm_store(drafter, target, prompts)
    dec = SpeculativeDecoder(target, drafter, num_draft_tokens=8, verify_curve=[1.0] * 9)
    drafted = accepted = 0
    for prompt in prompts:
        out = dec.generate(prompt, max_new_tokens=30, stop_token_ids=[])
        assert out.token_ids[0].tolist() == plain_greedy(target, prompt, 30)
        drafted += out.stats.drafted
        accepted += out.stats.accepted
    assert drafted > 0 and accepted > 0


def test_tree_proposals_branch() -> None:
    drafter = SuffixDrafter(tree=True, anchor=2, min_prob=0.0, store_min_match=1)
    drafter.bind(flat_costs(tiny_random_target(vocab_size=16, seed=1)))
    for cont in ([4, 5, 6], [4, 5, 7], [8, 9, 1]):
        drafter.store.add([1, 2, *cont])
    ctx = DraftContext(torch.tensor([[3, 1, 2]]), None, SamplingConfig(), torch.Generator())
    draft = drafter.propose(ctx, 8)
    tokens, parents = draft.token_ids[0].tolist(), draft.parents[0].tolist()
    # match [1, 2] (2 tokens): 3 deep; best first, parents first; 4 -> 5 -> {6, 7} and 8 -> 9 -> 1
    assert list(zip(tokens, parents)) == [(4, -1), (5, 0), (8, -1), (9, 2), (6, 1), (7, 1), (1, 3)]


def flat_costs(target: TargetModel) -> TargetModel:
    """Verification as cheap for 32 nodes as for none, so the drafter never trims a draft (the
    tests then do not depend on this machine's measured curve)."""
    target.verify_costs = {1: [1.0] * 33}
    return target


def two_token_pvalue(target: TargetModel, tree: bool, sampler=None, n: int = 1200) -> float:  # noqa: ANN001
    sampling = SamplingConfig(temperature=1.0)
    flat_costs(target)
    drafter = SuffixDrafter(tree=tree, anchor=2, min_prob=0.0, store_min_match=1)
    prompt = [2, 9]  # no repeat inside: the drafts come from the store, a branching tree
    warm_store(drafter, target, [prompt], n=60)
    kwargs = {} if sampler is None else {"sampler": sampler}
    dec = SpeculativeDecoder(target, drafter, num_draft_tokens=6, sampling=sampling, verify_curve=[1.0] * 9, **kwargs)
    counts = sample_two_tokens(dec, prompt, n=n, vocab=target.vocab_size)
    return pooled_chisquare(counts, exact_two_token_distribution(target, prompt, sampling))


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_lossless_at_temperature_one(tiny_target: TargetModel, tree: bool) -> None:
    assert two_token_pvalue(tiny_target, tree) > 1e-4


def test_chain_test_catches_a_verifier_that_accepts_everything(tiny_target: TargetModel) -> None:
    assert two_token_pvalue(tiny_target, tree=False, sampler=always_accept) < 1e-6


def test_tree_test_catches_a_residual_that_keeps_rejected_siblings(tiny_target: TargetModel, monkeypatch) -> None:  # noqa: ANN001
    import specdraft.tree

    monkeypatch.setattr(specdraft.tree, "_without", lambda dist, token: dist)
    assert two_token_pvalue(tiny_target, tree=True) < 1e-6


def test_a_shared_store_changes_nothing_but_speed() -> None:
    target = flat_costs(tiny_random_target(vocab_size=16, seed=5))
    prompts = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [6, 1, 2, 3, 4], [1, 2, 3]]
    warm, cold = SuffixDrafter(anchor=2, store_min_match=1), SuffixDrafter(anchor=2, store_tokens=0)
    runs = {}
    for name, drafter in (("warm", warm), ("cold", cold)):
        dec = SpeculativeDecoder(target, drafter, num_draft_tokens=8, verify_curve=[1.0] * 9)
        runs[name] = [dec.generate(p, 24, stop_token_ids=[]) for p in prompts]
    for p, w, c in zip(prompts, runs["warm"], runs["cold"]):
        assert w.token_ids[0].tolist() == c.token_ids[0].tolist() == plain_greedy(target, p, 24)
    assert warm.store_stats()["requests"] == len(prompts)  # one lesson per generate, none from calibration
    assert sum(r.stats.accepted for r in runs["warm"]) >= sum(r.stats.accepted for r in runs["cold"])


def test_auto_offers_the_whole_budget_and_learn_false_teaches_nothing() -> None:
    """The drafter sizes its own drafts (sizes_own_drafts): under "auto" the decoder offers it
    max_draft_tokens every round and measures no draft cost for it (no calibration run, which
    would also have nothing to teach the store)."""
    target = flat_costs(tiny_random_target(vocab_size=16, seed=5))
    drafter = SuffixDrafter(anchor=2)
    dec = SpeculativeDecoder(target, drafter, num_draft_tokens="auto", max_draft_tokens=4)
    assert dec.new_policy().choose(10) == 4
    dec.generate([1, 2, 3, 1, 2, 3, 1, 2], 5, stop_token_ids=[])
    assert drafter.store_stats()["requests"] == 1 and dec._measured_draft_cost == {}
    dec.generate([1, 2, 3], 5, stop_token_ids=[], learn=False)
    assert drafter.store_stats()["requests"] == 1


def test_store_file_round_trip(tmp_path) -> None:  # noqa: ANN001
    target = tiny_random_target(vocab_size=16, seed=2)
    drafter = SuffixDrafter(anchor=2, store_min_match=1)
    drafter.bind(target)
    for seq in ([1, 2, 3, 4], [5, 6, 7], [1, 2, 9, 9]):
        drafter.store.add(seq)
    path = tmp_path / "store.json"
    drafter.save_store(path)
    loaded = SuffixDrafter(anchor=2, store_min_match=1, store_path=str(path))
    loaded.bind(target)
    assert list(loaded.store.sequences.values()) == list(drafter.store.sequences.values())
    assert loaded.speculate([0, 1, 2], 8) == drafter.speculate([0, 1, 2], 8) != []
    with pytest.raises(ValueError, match="vocabulary of 16 tokens but the target has 32"):
        SuffixDrafter(store_path=str(path)).bind(tiny_random_target(vocab_size=32, seed=2))
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a specdraft-suffix-store file"):
        SuffixDrafter(store_path=str(path))


def test_store_memory_is_reported_within_its_budget() -> None:
    drafter = SuffixDrafter(anchor=3, store_tokens=100)
    rng = random.Random(0)
    for seq in random_seqs(rng, 20, 50, lo=10, hi=40):
        drafter.learn(torch.tensor([0, *seq]), 1)
        stats = drafter.store_stats()
        assert stats["tokens"] <= stats["budget_tokens"] == 100 and stats["bytes"] > 0


def test_the_store_drafts_only_from_long_matches() -> None:
    drafter = SuffixDrafter(anchor=2, store_min_match=3)
    drafter.store.add([1, 2, 3, 4])
    assert drafter.speculate([9, 2, 3], 4) == []  # a 2-token match in another request: no evidence
    assert [c.token for c in drafter.speculate([1, 2, 3], 4)] == [4]


def test_the_memory_estimate_follows_what_python_allocates() -> None:
    import tracemalloc

    rng = random.Random(1)
    seqs = random_seqs(rng, 200, 3000, lo=50, hi=150)
    tracemalloc.start()
    try:
        index = SuffixIndex(4)
        for seq in seqs:
            index.add(seq)
        measured, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 0.6 < index.memory_bytes() / measured < 1.5


# ------------------------------------------------------------------------------- batches
@pytest.mark.parametrize("k", [4, "auto"])
def test_batch_equals_one_by_one(k: int | str) -> None:
    """Per-row local indexes (and the shared store, which learns from every finished row)."""
    target = flat_verify_costs(tiny_random_target(vocab_size=16, seed=9))
    drafter = SuffixDrafter(anchor=2, min_prob=0.0)
    dec = SpeculativeDecoder(target, drafter, num_draft_tokens=k) if k != "auto" else auto_decoder(target, drafter)
    check_batches(dec)


def test_batch_drafts_a_chain_per_row_even_with_tree() -> None:
    """Trees are batch-1 only: at B > 1 every row drafts its best chain from its own context."""
    drafter = SuffixDrafter(tree=True, anchor=2, min_prob=0.0, store_tokens=0)
    drafter.bind(flat_costs(tiny_random_target(vocab_size=16, seed=1)))
    # row 0 (left padded): [1, 2, 3, 1, 2] -> 3, 1, 2; row 1: [4, 5, 6, 4, 5, 6, 4] -> 5, 6, 4
    tokens = torch.tensor([[0, 0, 1, 2, 3, 1, 2], [4, 5, 6, 4, 5, 6, 4]])
    ctx = DraftContext(tokens, None, SamplingConfig(), torch.Generator(), lengths=(5, 7))
    draft = drafter.propose(ctx, 8)
    assert draft.parents is None and draft.token_ids.shape[0] == 2
    lengths = [draft.num_tokens] * 2 if draft.lengths is None else draft.lengths.tolist()
    rows = [draft.token_ids[i, :n].tolist() for i, n in enumerate(lengths)]
    assert rows[0][:3] == [3, 1, 2] and rows[1][:3] == [5, 6, 4]
    drafter.keep_rows([1])  # row 1 alone, with its own index: a tree again at batch size 1
    alone = drafter.propose(DraftContext(tokens[1:], None, SamplingConfig(), torch.Generator()), 8)
    assert alone.parents is not None and alone.token_ids[0, :3].tolist() == [5, 6, 4]


def test_every_row_keeps_its_own_trust() -> None:
    """Row 1's copies are all kept, row 0's none: each row's trust follows its own rounds, and
    `keep_rows` keeps the surviving row's."""
    drafter = SuffixDrafter(anchor=2, min_prob=0.0, store_tokens=0, corpus=None)
    drafter.bind(flat_costs(tiny_random_target(vocab_size=16, seed=1)))
    tokens = torch.tensor([[0, 0, 1, 2, 3, 1, 2], [4, 5, 6, 4, 5, 6, 4]])
    ctx = DraftContext(tokens, None, SamplingConfig(), torch.Generator(), lengths=(5, 7))
    draft = drafter.propose(ctx, 8)
    lengths = [draft.num_tokens] * 2 if draft.lengths is None else draft.lengths.tolist()
    drafter.commit(ctx, [0, lengths[1]])
    assert drafter.trusts[0].of("request") < 0.8 < drafter.trusts[1].of("request")
    kept = drafter.trusts[1].of("request")
    drafter.keep_rows([1])
    assert len(drafter.trusts) == 1 and drafter.trusts[0].of("request") == kept
