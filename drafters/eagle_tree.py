"""EAGLE-2 dynamic draft trees: grown by the draft's own confidence, cut to what verification pays for.

A tree is grown depth by depth. The root's top-k tokens are depth 0; at every further depth the
`topk` nodes of the previous depth with the highest cumulative log probability (the draft's
probability of the whole path) are expanded, each into its top-k children, and of those k * k
candidates the best `topk` by cumulative score are the new depth. Every node ever created is a
candidate; finally all of them are ranked by score and the best N kept. A child never scores
higher than its parent, so the kept set contains every kept node's ancestors.

N is chosen on the target's measured verify-cost curve (`specdraft.costs.verify_curve`,
T_v(n)/T_v(0) for n draft positions): taking the draft's path probability as the chance that a
node is accepted (EAGLE-2's observation that confidence approximates acceptance), a tree of the N
best nodes is expected to yield 1 + sum of their probabilities tokens per round, at cost
curve[N]; N maximises that ratio. Pure functions on tensors; the drafter supplies `expand`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from specdraft.costs import nodes_worth_verifying


@dataclass(frozen=True)
class GrownTree:
    """Every node grown, in creation order (a parent always before its children).

    tokens: [n] draft-vocabulary index of each node. parents: [n] parent node index, -1 = the
    root (the newest committed token). scores: [n] cumulative log probability of the path.
    """

    tokens: Tensor
    parents: Tensor
    scores: Tensor


def grow_tree(root_logp: Tensor, expand: Callable[[list[int], Tensor, list[int]], Tensor], topk: int,
              depth: int) -> GrownTree:
    """root_logp [M]: the draft's log probabilities after the root. expand(nodes, tokens [f],
    parents) -> log probabilities [f, M] of the children of those nodes (node indices into the
    tree so far, their tokens, and the parent of every node so far, -1 = the root); called once
    per depth after the first, on that depth's best `topk` nodes."""
    scores, tokens = root_logp.topk(min(topk, root_logp.shape[-1]))  # [k]
    all_tokens, all_parents, all_scores = [tokens], [torch.full_like(tokens, -1)], [scores]
    frontier = torch.arange(tokens.shape[0])  # node indices
    count = tokens.shape[0]
    for _ in range(depth - 1):
        logp = expand(frontier.tolist(), all_tokens[-1], torch.cat(all_parents).tolist())  # [f, M]
        cand = all_scores[-1][:, None] + logp  # [f, M] cumulative
        k = min(topk, cand.numel())
        best, flat = cand.reshape(-1).topk(k)  # [k]
        parent = frontier[flat // cand.shape[1]]
        child = flat % cand.shape[1]
        all_tokens.append(child)
        all_parents.append(parent)
        all_scores.append(best)
        frontier = torch.arange(count, count + k)
        count += k
    return GrownTree(torch.cat(all_tokens), torch.cat(all_parents), torch.cat(all_scores))


def best_nodes(tree: GrownTree, n: int) -> tuple[Tensor, Tensor]:
    """The n best nodes by score (ties: the earlier node), in creation order, re-indexed:
    (tokens [n] draft indices, parents [n] into the kept nodes, -1 = root)."""
    n = min(n, tree.tokens.shape[0])
    order = sorted(range(tree.tokens.shape[0]), key=lambda i: (-float(tree.scores[i]), i))[:n]
    keep = sorted(order)
    new_index = {old: new for new, old in enumerate(keep)}
    parents = [new_index[int(p)] if int(p) >= 0 else -1 for p in tree.parents[keep]]
    if any(int(tree.parents[i]) >= 0 and int(tree.parents[i]) not in new_index for i in keep):
        raise AssertionError("a kept node lost its parent")  # impossible: scores fall along a path
    return tree.tokens[keep], torch.tensor(parents, dtype=torch.long)


def node_budget(scores: Tensor, curve: Sequence[float]) -> int:
    """N maximising (1 + sum of the N best path probabilities) / curve[N] (module docstring):
    `specdraft.costs.nodes_worth_verifying` on the candidates' probabilities, best first.
    scores: cumulative log probabilities of the candidates."""
    return nodes_worth_verifying(scores.exp().sort(descending=True).values.tolist(), curve)


def expansion_mask(past: int, cache_length: int, ancestor_slots: Sequence[Sequence[int]], dtype: torch.dtype) -> Tensor:
    """Additive mask [f, cache_length + f] for f tree nodes fed to the head together after a head
    cache of `cache_length` positions, of which the first `past` are the verified pairs: node r sees
    every verified pair, the cache slots of its own ancestors (`ancestor_slots[r]`: the nodes fed by
    earlier expansions on its path) and itself, never another branch."""
    f = len(ancestor_slots)
    allowed = torch.zeros((f, cache_length + f), dtype=torch.bool)
    allowed[:, :past] = True
    for r, slots in enumerate(ancestor_slots):
        allowed[r, list(slots)] = True
        allowed[r, cache_length + r] = True
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, float("-inf"))
