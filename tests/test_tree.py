"""Candidate trees: shapes as plain data, the tree mask, greedy tree verification on hand-written
arrays, tree choice from accuracies, and KV-cache compaction equal to a plain forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specdraft.protocol import Draft
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel
from specdraft.tree import (
    MAX_TREE_NODES,
    accepted_positions,
    choose_tree,
    expected_accepted,
    greedy_verify_tree,
    grow_tree,
    load_tree,
    tree_attention,
    tree_depths,
    tree_draft,
    tree_forward,
    tree_parents,
    validate_paths,
    verify_cost,
)

PATHS = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


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
    tree = choose_tree(acc, max_nodes=16)
    assert 1 <= len(tree) <= 16
    assert expected_accepted(tree, acc) > expected_accepted(tree[:1], acc)
    assert verify_cost(1) == 1.0 and verify_cost(40) > verify_cost(32)
    assert choose_tree([[0.0], [0.0]]) == []


def test_auto_tree_is_sized_by_the_verify_cost_curve() -> None:
    acc = [[0.6, 0.15, 0.05, 0.03], [0.4, 0.1, 0.05, 0.03], [0.3, 0.1, 0.05, 0.02]]
    flat = {1: 1.0, 33: 1.1}  # extra nodes almost free (the fast stack on CPU, a GPU)
    steep = {1: 1.0, 33: 17.0}  # each node costs half a forward
    big, small = choose_tree(acc, cost=flat), choose_tree(acc, cost=steep)
    assert len(small) < len(big) <= MAX_TREE_NODES
    shipped = Path(__file__).resolve().parent.parent / "specdraft/artifacts/smollm2-135m/medusa"
    auto_flat = load_tree("auto", shipped, 3, cost=flat)
    assert len(load_tree("auto", shipped, 3, cost=steep)) < len(auto_flat)
    fixed = load_tree(16, shipped, 3)  # a node count: the best-first tree of exactly that size
    assert len(auto_flat) >= 16 and fixed == auto_flat[:16]
    for bad in (0, True, [0, 1], "big"):  # zero nodes, a bool, paths that are not lists, a typo
        with pytest.raises(ValueError, match="node count"):
            load_tree(bad, shipped, 3)


def test_tree_kv_rollback_equals_plain_forward(tiny_target: TargetModel) -> None:
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
    chain, out = tree_forward(tiny_target, torch.cat([prompt[:, -1:], tokens], 1), draft, SamplingConfig())
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


def test_tree_forward_refuses_sampling(tiny_target: TargetModel) -> None:
    draft = Draft(token_ids=torch.tensor([[1]]), parents=torch.tensor([[-1]]))
    with pytest.raises(ValueError, match="temperature 0"):
        tree_forward(tiny_target, torch.tensor([[2, 1]]), draft, SamplingConfig(temperature=1.0))


def test_joint_label_ranks_capture_correlated_heads() -> None:
    # heads right together or wrong together: a deep path is as likely as its first node
    ranks = torch.tensor([[0, 0, 0]] * 5 + [[10, 10, 10]] * 5)
    acc = [[0.5] + [0.0] * 9] * 3
    chain = [(0,), (0, 0), (0, 0, 0)]
    assert expected_accepted(chain, acc, ranks) == pytest.approx(1.5)
    assert expected_accepted(chain, acc) == pytest.approx(0.5 + 0.25 + 0.125)
    assert grow_tree(acc, 3, ranks) == chain
