"""Medusa's candidate trees: which tree to draft, and its node tokens from the heads' guesses.

A tree is a list of rank paths (`specdraft.tree`, where it is verified): (0, 1) is "head 1's best
guess, then head 2's second guess". The tree is grown from the heads' held-out rank accuracies
(`specdraft.formats.medusa_heads.HeadAccuracy`): a node's chance of being accepted is the
probability of its path (measured jointly when per-position label ranks are saved, else the product
of its ranks' accuracies), best-first search adds the most probable nodes, and `choose_tree` keeps
the size that maximises expected tokens per round over the target's verify-cost curve
(`specdraft.costs.verify_curve`: verifying more nodes is not free). Pure functions: the curve is
an argument, so the drafter measures it once and tests pass hand-written ones.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from specdraft.formats.medusa_heads import HeadAccuracy
from specdraft.protocol import Draft
from specdraft.tree import Path_, tree_depths, tree_parents, validate_paths
from specdraft.vocab import PrunedVocab

TreeSpec = str | int | Sequence[Sequence[int]] | None
MAX_TREE_NODES = 32  # the largest tree "auto" considers (the verify curve is measured up to it)
AUTO = "auto"


# ------------------------------------------------------------------------------- drafting
def _to_target(index: Tensor, vocab: PrunedVocab | None) -> Tensor:
    """Column indices of the heads' logits -> target token ids."""
    return index if vocab is None else vocab.to_target(index)


def tree_draft(
    paths: Sequence[Path_], head_logits: Tensor, num_tokens: int, vocab: PrunedVocab | None = None
) -> Draft:
    """A tree Draft from Medusa head logits [K, M]: node (r_1..r_d) is head d's rank-r_d token.

    The first `num_tokens` paths (of depth <= K) form the tree. vocab: the pruned vocabulary the
    logits' columns index (None = the columns are the target's ids).
    """
    k = head_logits.shape[0]
    use = [p for p in paths if len(p) <= k][: max(num_tokens, 0)]
    if not use:
        empty = torch.empty((1, 0), dtype=torch.long, device=head_logits.device)
        return Draft(token_ids=empty)
    width = max(max(p) for p in use) + 1
    top = _to_target(head_logits.topk(width, dim=-1).indices, vocab)  # [K, width]
    tokens = torch.stack([top[len(p) - 1, p[-1]] for p in use])[None]  # [1, N]
    parents = torch.tensor([tree_parents(use)], dtype=torch.long, device=head_logits.device)
    return Draft(token_ids=tokens, parents=parents)


def path_tree_draft(
    paths: Sequence[Path_],
    step: Callable[[int, Tensor, Tensor], tuple[Tensor, Tensor]],
    hidden: Tensor,
    newest: Tensor,
    num_tokens: int,
    vocab: PrunedVocab | None = None,
) -> Draft:
    """A tree Draft from heads whose guesses depend on the path (recurrent Medusa heads).

    step(k, states [P, H], tokens [P]) -> (states [P, H], logits [P, M]) runs head k on the
    previous head's states and the tokens before it. The root is expanded from hidden [1, H] and
    the newest token [1]; node (r_1..r_d) is the rank-r_d token of its parent's logits, and every
    node with children is expanded with head d (all nodes of one depth in one batched step). The
    first `num_tokens` paths (of depth <= the number of heads, `resolve_tree` ensures it) form the
    tree. vocab: the pruned vocabulary the logits' columns index (None = the target's ids).
    """
    use = list(paths)[: max(num_tokens, 0)]
    if not use:
        return Draft(token_ids=newest.new_empty((1, 0)))
    parents = tree_parents(use)
    depths = tree_depths(parents)
    expand = set(parents)  # nodes (and -1, the root) whose children are drafted
    states, logits = step(0, hidden, newest)  # root: [1, H], [1, M]
    frontier = {-1: 0}  # expanded node -> row in (states, logits)
    tokens = [0] * len(use)
    for depth in range(1, max(depths) + 1):
        level = [i for i, d in enumerate(depths) if d == depth]
        width = max(use[i][-1] for i in level) + 1
        top = _to_target(logits.topk(min(width, logits.shape[-1]), dim=-1).indices, vocab)  # [P, width]
        for i in level:
            tokens[i] = int(top[frontier[parents[i]], use[i][-1]])
        grow = [i for i in level if i in expand]
        if not grow:
            break
        rows_of = torch.tensor([frontier[parents[i]] for i in grow], device=states.device)
        toks = torch.tensor([tokens[i] for i in grow], device=states.device)
        states, logits = step(depth, states[rows_of], toks)  # [P', H], [P', M]
        frontier = {i: j for j, i in enumerate(grow)}
    ids = torch.tensor([tokens], dtype=torch.long, device=newest.device)  # [1, N]
    return Draft(token_ids=ids, parents=torch.tensor([parents], dtype=torch.long, device=newest.device))


# ------------------------------------------------------------------------------- tree choice
def expected_accepted(
    paths: Sequence[Path_], rank_accuracy: Sequence[Sequence[float]], label_ranks: Tensor | None = None
) -> float:
    """Expected accepted tokens per round: the sum over nodes of P(node on the accepted path).

    P is measured jointly when label_ranks [N, K] (the rank of the target's token in each head's
    list, per held-out position) is given: heads are strongly correlated (easy positions are easy
    for every head), so the product of per-head accuracies badly underestimates deep paths.
    Without it, P = product of the ranks' accuracies (heads treated as independent).
    """
    return sum(_path_prob(p, rank_accuracy, label_ranks) for p in paths)


def _path_prob(path: Path_, acc: Sequence[Sequence[float]], label_ranks: Tensor | None = None) -> float:
    if label_ranks is not None:
        want = torch.tensor(path, dtype=label_ranks.dtype)
        return float((label_ranks[:, : len(path)] == want).all(dim=1).double().mean())
    prob = 1.0
    for depth, rank in enumerate(path):
        prob *= acc[depth][rank] if rank < len(acc[depth]) else 0.0
    return prob


def grow_tree(
    rank_accuracy: Sequence[Sequence[float]], max_nodes: int, label_ranks: Tensor | None = None
) -> list[Path_]:
    """Best-first tree: repeatedly add the most probable node whose parent is already in."""
    depth_max = len(rank_accuracy)
    heap = [(-_path_prob((r,), rank_accuracy, label_ranks), (r,)) for r in range(len(rank_accuracy[0]))]
    heapq.heapify(heap)
    out: list[Path_] = []
    while heap and len(out) < max_nodes:
        neg, path = heapq.heappop(heap)
        if -neg <= 0:
            break
        out.append(path)
        if len(path) < depth_max:
            for r in range(len(rank_accuracy[len(path)])):
                child = path + (r,)
                heapq.heappush(heap, (-_path_prob(child, rank_accuracy, label_ranks), child))
    return out


def verify_cost(nodes: int, curve: Sequence[float]) -> float:
    """T_v(nodes) / T_v(0): the verify forward over [root] + `nodes` tree nodes relative to one
    position, read off the curve (curve[k] = k + 1 positions, `specdraft.costs.verify_curve`);
    beyond its end, linear at its last segment's slope."""
    if not curve:
        raise ValueError("the verify-cost curve is empty; pass T_v(k)/T_v(0) for k = 0..max nodes.")
    if nodes < len(curve):
        return float(curve[nodes])
    if len(curve) == 1:
        return float(curve[0])
    slope = curve[-1] - curve[-2]
    return float(curve[-1] + slope * (nodes - len(curve) + 1))


def choose_tree(
    rank_accuracy: Sequence[Sequence[float]],
    curve: Sequence[float],
    max_nodes: int = MAX_TREE_NODES,
    label_ranks: Tensor | None = None,
) -> list[Path_]:
    """The best-first tree whose size n maximises (1 + E[accepted]) / T_v(n) over the curve."""
    full = grow_tree(rank_accuracy, max_nodes, label_ranks)
    best, best_rate = 0, 1.0 / verify_cost(0, curve)
    for n in range(1, len(full) + 1):
        rate = (1.0 + expected_accepted(full[:n], rank_accuracy, label_ranks)) / verify_cost(n, curve)
        if rate > best_rate:
            best, best_rate = n, rate
    return full[:best]


# ------------------------------------------------------------------------------- the tree option
def check_tree_spec(spec: TreeSpec) -> None:
    """Raise a ValueError unless spec is None, "auto", a node count >= 1 or a list of rank paths."""
    if spec is None or spec == AUTO:
        return
    if isinstance(spec, int) and not isinstance(spec, bool) and spec >= 1:
        return
    if isinstance(spec, Sequence) and not isinstance(spec, str) and all(
            isinstance(p, Sequence) and not isinstance(p, str) for p in spec):
        validate_paths(spec)
        return
    raise ValueError(
        f"tree must be None (a chain), 'auto', a node count >= 1 or a list of rank paths such as "
        f"[[0], [1], [0, 0]], got {spec!r}."
    )


def require_accuracy(spec: TreeSpec, accuracy: HeadAccuracy | None) -> HeadAccuracy:
    """The heads' accuracies that a grown tree ("auto" or a node count) needs, or a ValueError."""
    if accuracy is None:
        raise ValueError(
            f"tree={spec!r} is grown from the heads' accuracy.json, and these heads have none "
            "(fresh or in-memory heads): pass explicit paths, or tree=None for a chain."
        )
    return accuracy


def resolve_tree(
    spec: TreeSpec,
    accuracy: HeadAccuracy | None,
    max_depth: int,
    curve: Sequence[float] | None = None,
) -> list[Path_] | None:
    """The drafter's tree option as paths of depth <= max_depth: None (a chain); "auto": grown from
    the heads' accuracies and sized for the verify-cost curve `curve` (T_v(k)/T_v(0), needed);
    an int N: the same best-first tree with exactly N nodes (no cost choice); or explicit paths."""
    check_tree_spec(spec)
    if spec is None:
        return None
    if isinstance(spec, (str, int)):
        accuracy = require_accuracy(spec, accuracy)
        if spec != AUTO:
            return grow_tree(accuracy.rank_accuracy, int(spec), accuracy.label_ranks)
        if curve is None:
            raise ValueError("tree='auto' is sized for the target's verify-cost curve; pass curve.")
        return choose_tree(accuracy.rank_accuracy, curve, label_ranks=accuracy.label_ranks)
    return [p for p in validate_paths(spec) if len(p) <= max_depth]
