"""Candidate trees: shapes as plain data, the tree mask, greedy tree verification on hand-written
arrays, Medusa's tree choice from accuracies over hand-written verify-cost curves
(drafters.medusa_tree), and KV-cache compaction equal to a plain forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from drafters.medusa_tree import (
    MAX_TREE_NODES,
    choose_tree,
    expected_accepted,
    grow_tree,
    resolve_tree,
    tree_draft,
    verify_cost,
)
from specdraft.check import chisquare_pvalue
from specdraft.formats.medusa_heads import load_accuracy
from specdraft.models import tiny_random_target
from specdraft.protocol import Draft
from specdraft.sampling import SamplingConfig
from specdraft.shipped import ARTIFACTS_DIR
from specdraft.target import TargetModel
from specdraft.tree import (
    accepted_positions,
    chain_with_siblings,
    greedy_verify_tree,
    sample_verify_tree,
    tree_attention,
    tree_depth,
    tree_depths,
    tree_forward,
    tree_parents,
    validate_paths,
)

PATHS = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
# hand-written verify-cost curves T_v(k)/T_v(0), k = 0..MAX_TREE_NODES draft nodes
CURVE = [1.0 + 0.064 * k for k in range(MAX_TREE_NODES + 1)]  # ~ the plain HF stack on one CPU thread
FLAT = [1.0 + 0.1 * k / MAX_TREE_NODES for k in range(MAX_TREE_NODES + 1)]  # extra nodes almost free (fast stack, GPU)
STEEP = [1.0 + 0.5 * k for k in range(MAX_TREE_NODES + 1)]  # each node costs half a forward


def test_parents_and_depths() -> None:
    parents = tree_parents(PATHS)
    assert parents == [-1, -1, 0, 0, 1, 2]
    assert tree_depths(parents) == [1, 1, 2, 2, 2, 3]


def test_validate_paths_rejects_orphans_and_duplicates() -> None:
    with pytest.raises(ValueError, match="before its parent"):
        validate_paths([[0, 0], [0]])
    with pytest.raises(ValueError, match="twice"):
        validate_paths([[0], [0]])
    assert validate_paths([[0], [0, 1]]) == [(0,), (0, 1)]


def test_tree_attention_mask_and_positions() -> None:
    mask, pos = tree_attention([-1, -1, 0], past_len=2, dtype=torch.float32)
    allowed = (mask[0, 0] == 0).int().tolist()
    # columns: 2 past, root, node0, node1, node2
    assert allowed == [
        [1, 1, 1, 0, 0, 0],  # root
        [1, 1, 1, 1, 0, 0],  # node0 (child of root)
        [1, 1, 1, 0, 1, 0],  # node1 (child of root), does not see its sibling
        [1, 1, 1, 1, 0, 1],  # node2 (child of node0)
    ]
    assert pos.tolist() == [[2, 3, 3, 4]]


def test_greedy_verify_tree_takes_longest_correct_path() -> None:
    vocab = 6
    # inputs: root, n0, n1, n2, n3; argmax after each input:
    argmax = [3, 4, 2, 5, 1]
    logits = torch.nn.functional.one_hot(torch.tensor([argmax]), vocab).float()  # [1, 5, V]
    parents = torch.tensor([[-1, -1, 0, 1]])
    # n0=1 wrong (root says 3), n1=3 right, n2 child of n0 (irrelevant), n3=2 right (after n1: 2)
    verdict = greedy_verify_tree(torch.tensor([[1, 3, 4, 2]]), parents, logits)
    assert verdict.path == [1, 3] and verdict.next_token == argmax[4]
    none = greedy_verify_tree(torch.tensor([[0, 0, 0, 0]]), parents, logits)
    assert none.path == [] and none.next_token == 3


def test_tree_draft_uses_each_heads_ranks() -> None:
    logits = torch.tensor([[0.0, 3.0, 2.0, 1.0], [5.0, 0.0, 4.0, 1.0], [0.0, 0.0, 0.0, 9.0]])
    draft = tree_draft(PATHS, logits, num_tokens=5)
    assert draft.token_ids.tolist() == [[1, 2, 0, 2, 0]]
    assert draft.parents.tolist() == [[-1, -1, 0, 0, 1]]


def test_choose_tree_from_accuracies() -> None:
    acc = [[0.6, 0.15, 0.05], [0.4, 0.1, 0.05], [0.3, 0.1, 0.0]]
    grown = grow_tree(acc, 6)
    assert grown[0] == (0,) and grown[1] == (0, 0)
    validate_paths(grown)
    tree = choose_tree(acc, CURVE, max_nodes=16)
    assert 1 <= len(tree) <= 16
    assert expected_accepted(tree, acc) > expected_accepted(tree[:1], acc)
    assert verify_cost(0, CURVE) == 1.0 and verify_cost(40, CURVE) > verify_cost(32, CURVE)
    assert verify_cost(40, CURVE) == pytest.approx(1.0 + 0.064 * 40)  # linear beyond the measured end
    assert choose_tree([[0.0], [0.0]], CURVE) == []


def test_auto_tree_is_sized_by_the_verify_cost_curve() -> None:
    acc = [[0.6, 0.15, 0.05, 0.03], [0.4, 0.1, 0.05, 0.03], [0.3, 0.1, 0.05, 0.02]]
    big, small = choose_tree(acc, FLAT), choose_tree(acc, STEEP)
    assert len(small) < len(big) <= MAX_TREE_NODES
    shipped = load_accuracy(ARTIFACTS_DIR / "smollm2-135m" / "medusa", max_depth=3)
    auto_flat = resolve_tree("auto", shipped, 3, curve=FLAT)
    assert len(resolve_tree("auto", shipped, 3, curve=STEEP)) < len(auto_flat)
    fixed = resolve_tree(16, shipped, 3)  # a node count: the best-first tree of exactly that size
    assert len(auto_flat) >= 16 and fixed == auto_flat[:16]
    for bad in (0, True, [0, 1], "big"):  # zero nodes, a bool, paths that are not lists, a typo
        with pytest.raises(ValueError, match="node count"):
            resolve_tree(bad, shipped, 3)
    with pytest.raises(ValueError, match="accuracy.json"):  # fresh heads have nothing to grow a tree from
        resolve_tree("auto", None, 3, curve=FLAT)


@pytest.mark.parametrize("kv_heads", [None, 2], ids=["mha", "gqa"])
def test_tree_kv_rollback_equals_plain_forward(tiny_target: TargetModel, kv_heads: int | None) -> None:
    """The tree forward's accepted path = a plain forward of it (logits, hidden, cache), also with
    grouped K/V heads (the fast stack then attends a group's query heads as rows of one attention)."""
    if kv_heads is not None:
        tiny_target = tiny_random_target(vocab_size=16, seed=1, num_kv_heads=kv_heads)
        assert tiny_target.fast  # the fast stack, whose grouped attention this exercises
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.inference_mode():
        greedy = tiny_target.model.generate(prompt, max_new_tokens=3, do_sample=False)[0, 5:].tolist()
    # root = prompt[-1]; the greedy continuation is the branch (1,)->(1,0) among decoys
    paths = [(0,), (1,), (0, 0), (1, 0), (1, 1)]
    wrong = [(t + 1) % 16 for t in greedy]
    tokens = torch.tensor([[wrong[0], greedy[0], wrong[1], greedy[1], wrong[1]]])
    draft = Draft(token_ids=tokens, parents=torch.tensor([tree_parents(paths)]))
    tiny_target.reset()
    tiny_target.forward(prompt[:, :-1], num_logits=0)
    chain, out, result = tree_forward(tiny_target, torch.cat([prompt[:, -1:], tokens], 1), draft,
                                      SamplingConfig(), torch.Generator())
    assert result.num_accepted.tolist() == [2] and result.next_token.tolist() == [greedy[2]]
    assert chain.token_ids.tolist() == [greedy[:2]]
    assert out.logits[0, -1].argmax().item() == greedy[2]
    assert tiny_target.cache_length == 5 + 2
    tree_cache = [(k.clone(), v.clone()) for k, v in tiny_target.cache_tensors()]

    tiny_target.reset()
    plain = tiny_target.forward(torch.cat([prompt, torch.tensor([greedy[:2]])], 1))
    assert torch.allclose(plain.hidden[:, -1], out.hidden[:, -1], atol=1e-5)
    for (k, v), (k_ref, v_ref) in zip(tree_cache, tiny_target.cache_tensors(), strict=True):
        assert torch.allclose(k, k_ref, atol=1e-5) and torch.allclose(v, v_ref, atol=1e-5)
    assert accepted_positions(3, [1, 4]) == [0, 1, 2, 3, 5, 8]


def sampled_tree_tokens(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """First emitted token over n draws of sample_verify_tree, and the second one in the draws that
    accepted node 0; with the exact laws they must follow (p at the root, p after node 0)."""
    root = torch.tensor([0.1, 0.4, 0.2, 0.3, 0.0])
    after0 = torch.tensor([0.25, 0.05, 0.5, 0.0, 0.2])  # p after node 0's token (1)
    other = torch.full((5,), 0.2)
    probs = torch.stack([root, after0, other, other])  # [root] + 3 nodes
    tokens, parents = torch.tensor([[1, 3, 2]]), torch.tensor([[-1, -1, 0]])  # siblings 1, 3; 1 -> 2
    gen = torch.Generator().manual_seed(0)
    first, second = np.zeros(5), np.zeros(5)
    for _ in range(n):
        v = sample_verify_tree(tokens, parents, probs, gen)
        emitted = [int(tokens[0, i]) for i in v.path] + [v.next_token]
        first[emitted[0]] += 1
        if v.path and v.path[0] == 0:
            second[emitted[1]] += 1
    return first, root.numpy(), second, after0.numpy()


def test_sampled_tree_verification_keeps_the_target_law() -> None:
    first, p_root, second, p_after = sampled_tree_tokens(20000)
    assert chisquare_pvalue(first, p_root) > 1e-4
    assert chisquare_pvalue(second, p_after) > 1e-4
    assert first[4] == 0  # a token with p = 0 is never emitted


def test_sampled_tree_test_catches_a_residual_that_keeps_rejected_siblings(monkeypatch) -> None:  # noqa: ANN001
    import specdraft.tree

    monkeypatch.setattr(specdraft.tree, "_without", lambda dist, token: dist)  # negative control
    first, p_root, _, _ = sampled_tree_tokens(20000)
    assert chisquare_pvalue(first, p_root) < 1e-6


def test_joint_label_ranks_capture_correlated_heads() -> None:
    # heads right together or wrong together: a deep path is as likely as its first node
    ranks = torch.tensor([[0, 0, 0]] * 5 + [[10, 10, 10]] * 5)
    acc = [[0.5] + [0.0] * 9] * 3
    chain = [(0,), (0, 0), (0, 0, 0)]
    assert expected_accepted(chain, acc, ranks) == pytest.approx(1.5)
    assert expected_accepted(chain, acc) == pytest.approx(0.5 + 0.25 + 0.125)
    assert grow_tree(acc, 3, ranks) == chain


def test_chain_with_siblings_hangs_alternatives_beside_each_chain_token() -> None:
    """Chain 5, 6, 7 with alternatives [8, 9], [], [4]: the chain nodes form the spine (each first among
    its siblings), the alternatives are leaves with the chain token's parent; the tree is as deep as
    the chain and the greedy verifier keeps a leaf where the chain misses."""
    tokens, parents = chain_with_siblings([5, 6, 7], [[8, 9], [], [4]])
    assert tokens == [5, 8, 9, 6, 7, 4]
    assert parents == [-1, -1, -1, 0, 3, 3]
    assert all(par < i for i, par in enumerate(parents))  # parent-first, as every tree here
    assert tree_depths(parents) == [1, 1, 1, 2, 3, 3] and tree_depth(parents) == 3 and tree_depth([]) == 0
    logits = torch.full((1, 7, 10), -5.0)  # [1, root + 6 nodes, V]: row i + 1 = after node i
    logits[0, 0, 5] = logits[0, 1, 6] = logits[0, 4, 4] = logits[0, 6, 1] = 0.0  # the target: 5, 6, 4, then 1
    verdict = greedy_verify_tree(torch.tensor([tokens]), torch.tensor([parents]), logits)
    assert verdict.path == [0, 3, 5] and verdict.next_token == 1  # 5, 6, then the leaf 4 where the chain drafted 7
    with pytest.raises(ValueError, match="repeats the chain"):
        chain_with_siblings([5], [[5]])
    with pytest.raises(ValueError, match="one list of alternatives"):
        chain_with_siblings([5, 6], [[1]])
