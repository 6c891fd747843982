"""Candidate trees: many drafts verified in ONE target forward (Medusa / SpecInfer style).

A tree is plain data: a list of paths, each a tuple of top-k ranks, one per depth. (0, 1) is "head
1's best guess, then head 2's second guess". Nodes are numbered in list order and every path's
parent (the path minus its last rank) comes earlier, so the first n paths are always a valid tree
(that is how a node budget truncates it). A draft then carries

    token_ids [B, N]  the node tokens;  parents [B, N]  each node's parent node, -1 = the root
                                                        (the root is the newest committed token).

The target scores [root] + nodes in one forward: node i sees the committed prefix, the root and its
own ancestors only (tree attention mask) and sits at position past + depth(i). Greedy verification
keeps the longest root path whose every token equals the target's argmax after its parent; the KV
cache is then compacted to the committed prefix + that path (the accepted nodes' K/V copied into
place), which is exactly the cache a plain forward over the accepted tokens leaves behind. After
that the round is indistinguishable from a chain round that proposed the accepted path, so the
decoding loop continues on its chain code (`tree_score`, then `tree_accept`).

The tree is chosen from measured per-head top-k accuracies (`choose_tree`): a node's chance of
being accepted is the product of its ranks' accuracies along its path, best-first search adds the
most probable nodes, and the node budget maximises expected tokens per round over the verify cost
curve T(n) (DESIGN §8: verifying is not free on CPU).

Temperature > 0 (`sample_verify_tree`): the candidates are deterministic (top-k ranks), so each
sibling is a draft with a one-hot q. Starting at the root, the children of the current node are tried
in order: child x is accepted with probability r(x), where r is the target's warped p at the current
node with every already rejected sibling removed and renormalised (rejection sampling with one-hot
q, repeated on the residual); an accepted child becomes the current node, and when all children are
rejected (or a leaf is reached) the next token is drawn from r. Each emitted token is therefore
distributed exactly as p given the tokens before it: the tree is as lossless as the chain.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from specdraft.protocol import Draft
from specdraft.sampling import SamplingConfig, sample, warp
from specdraft.verify import VerifyResult

Path_ = tuple[int, ...]

# Verify cost of a forward over n positions (logits at all of them) relative to n = 1, measured here
# for SmolLM2-135M (1 thread, 300-token context, medians of 5, busy machine; DESIGN §8 has the same
# shape with 2 threads); linear beyond the last point at the last segment's slope. Only for trees
# chosen without a target at hand: a bound MedusaDrafter sizes "auto" trees with the target's own
# measured curve (specdraft.costs.cached_verify_curve).
DEFAULT_VERIFY_COST = {1: 1.0, 4: 1.42, 8: 1.6, 12: 1.86, 16: 2.09, 24: 2.53, 32: 2.98}
MAX_TREE_NODES = 32


@dataclass(frozen=True)
class TreeVerdict:
    """Outcome of tree verification for one sequence."""

    path: list[int]  # accepted node indices, root to leaf (may be empty)
    next_token: int  # after the last accepted node (or the root): argmax, or a draw at temperature > 0


# ------------------------------------------------------------------------------- tree shapes
def validate_paths(paths: Sequence[Sequence[int]]) -> list[Path_]:
    """Check a list of rank paths is a tree in parent-first order; returns it as tuples."""
    out: list[Path_] = []
    seen: set[Path_] = set()
    for p in paths:
        t = tuple(int(r) for r in p)
        if not t or min(t) < 0:
            raise ValueError(f"tree path {list(p)!r} must be a non-empty list of ranks >= 0.")
        if t in seen:
            raise ValueError(f"tree path {list(t)!r} appears twice; list each node once.")
        if len(t) > 1 and t[:-1] not in seen:
            raise ValueError(
                f"tree path {list(t)!r} comes before its parent {list(t[:-1])!r}; list parents first."
            )
        seen.add(t)
        out.append(t)
    return out


def tree_parents(paths: Sequence[Path_]) -> list[int]:
    """Parent node index of every path (-1 = root)."""
    index = {p: i for i, p in enumerate(paths)}
    return [index[p[:-1]] if len(p) > 1 else -1 for p in paths]


def tree_depths(parents: Sequence[int]) -> list[int]:
    """Depth (1 = child of the root) of every node, from the parent list."""
    depth: list[int] = []
    for par in parents:
        depth.append(1 if par < 0 else depth[par] + 1)
    return depth


def tree_draft(
    paths: Sequence[Path_], head_logits: Tensor, num_tokens: int, rows: Tensor | None = None
) -> Draft:
    """A tree Draft from Medusa head logits [K, M]: node (r_1..r_d) is head d's rank-r_d token.

    The first `num_tokens` paths (of depth <= K) form the tree. rows: [M] target ids of the
    logits' columns (a pruned vocabulary; None = the columns are the target's ids).
    """
    k = head_logits.shape[0]
    use = [p for p in paths if len(p) <= k][: max(num_tokens, 0)]
    if not use:
        empty = torch.empty((1, 0), dtype=torch.long, device=head_logits.device)
        return Draft(token_ids=empty)
    width = max(max(p) for p in use) + 1
    top = head_logits.topk(width, dim=-1).indices  # [K, width]
    if rows is not None:
        top = rows[top]
    tokens = torch.stack([top[len(p) - 1, p[-1]] for p in use])[None]  # [1, N]
    parents = torch.tensor([tree_parents(use)], dtype=torch.long, device=head_logits.device)
    return Draft(token_ids=tokens, parents=parents)


def path_tree_draft(
    paths: Sequence[Path_],
    step: Callable[[int, Tensor, Tensor], tuple[Tensor, Tensor]],
    hidden: Tensor,
    newest: Tensor,
    num_tokens: int,
    rows: Tensor | None = None,
) -> Draft:
    """A tree Draft from heads whose guesses depend on the path (recurrent Medusa heads).

    step(k, states [P, H], tokens [P]) -> (states [P, H], logits [P, M]) runs head k on the
    previous head's states and the tokens before it. The root is expanded from hidden [1, H] and
    the newest token [1]; node (r_1..r_d) is the rank-r_d token of its parent's logits, and every
    node with children is expanded with head d (all nodes of one depth in one batched step). The
    first `num_tokens` paths whose depth the heads reach form the tree. rows: [M] target ids of the
    logits' columns (None = the columns are the target's ids).
    """
    use = list(paths)[: max(num_tokens, 0)]  # depth <= the number of heads (load_tree checks)
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
        top = logits.topk(min(width, logits.shape[-1]), dim=-1).indices  # [P, width]
        if rows is not None:
            top = rows[top]
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


def verify_cost(n: int, cost: dict[int, float] | None = None) -> float:
    """Relative cost of a target forward over n positions, interpolated from a measured curve."""
    pts = sorted((cost or DEFAULT_VERIFY_COST).items())
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if n <= x1:
            return y0 + (y1 - y0) * (max(n, x0) - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    return y1 + (y1 - y0) / (x1 - x0) * (n - x1)


def choose_tree(
    rank_accuracy: Sequence[Sequence[float]],
    max_nodes: int = MAX_TREE_NODES,
    cost: dict[int, float] | None = None,
    label_ranks: Tensor | None = None,
) -> list[Path_]:
    """The best-first tree whose size maximises (1 + E[accepted]) / T(1 + nodes)."""
    full = grow_tree(rank_accuracy, max_nodes, label_ranks)
    best, best_rate = 0, 1.0 / verify_cost(1, cost)
    for n in range(1, len(full) + 1):
        rate = (1.0 + expected_accepted(full[:n], rank_accuracy, label_ranks)) / verify_cost(n + 1, cost)
        if rate > best_rate:
            best, best_rate = n, rate
    return full[:best]


def load_tree(
    spec: str | int | Sequence[Sequence[int]] | None,
    heads_dir: Path | None,
    max_depth: int,
    cost: dict[int, float] | None = None,
) -> list[Path_] | None:
    """None (chain); "auto": grown from <heads_dir>/accuracy.json and sized for the verify cost
    curve `cost` ({positions: T(n) / T(1)}, default DEFAULT_VERIFY_COST); an int N: the same
    best-first tree with exactly N nodes (no cost choice); or explicit paths."""
    if spec is None:
        return None
    if isinstance(spec, (str, int)) and not isinstance(spec, bool):
        if spec != "auto" and not (isinstance(spec, int) and spec >= 1):
            raise ValueError(
                f"tree must be None, 'auto', a node count >= 1 or a list of rank paths, got {spec!r}."
            )
        if heads_dir is None or not (heads_dir / "accuracy.json").is_file():
            raise ValueError(f"tree={spec!r} needs trained heads with an accuracy.json; pass explicit paths.")
        acc = json.loads((heads_dir / "accuracy.json").read_text())
        name = "selfgen" if "selfgen" in acc["rank_accuracy"] else next(iter(acc["rank_accuracy"]))
        ranks = acc.get("label_ranks", {}).get(name)
        label_ranks = torch.tensor(ranks)[:, :max_depth] if ranks else None
        accuracy = acc["rank_accuracy"][name][:max_depth]
        if spec == "auto":
            return choose_tree(accuracy, label_ranks=label_ranks, cost=cost)
        return grow_tree(accuracy, int(spec), label_ranks)
    if not isinstance(spec, Sequence) or not all(isinstance(p, Sequence) for p in spec):
        raise ValueError(
            f"tree must be None, 'auto', a node count >= 1 or a list of rank paths such as "
            f"[[0], [1], [0, 0]], got {spec!r}."
        )
    return [p for p in validate_paths(spec) if len(p) <= max_depth]


# ------------------------------------------------------------------------------- verification
def tree_attention(
    parents: Sequence[int], past_len: int, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> tuple[Tensor, Tensor]:
    """Additive mask [1, 1, N+1, past+N+1] and position ids [1, N+1] for [root] + N nodes."""
    n = len(parents)
    allowed = torch.zeros((n + 1, n + 1), dtype=torch.bool)
    allowed[:, 0] = True  # everyone sees the root
    for i, par in enumerate(parents):
        allowed[i + 1, i + 1] = True
        if par >= 0:
            allowed[i + 1] |= allowed[par + 1]
    full = torch.cat([torch.ones((n + 1, past_len), dtype=torch.bool), allowed], dim=1)
    mask = torch.zeros(full.shape, dtype=dtype).masked_fill(~full, torch.finfo(dtype).min)
    depth = torch.tensor([0] + tree_depths(parents))
    return mask[None, None].to(device), (past_len + depth)[None].to(device)


def greedy_verify_tree(token_ids: Tensor, parents: Tensor, logits: Tensor) -> TreeVerdict:
    """Longest root path of nodes equal to the target's argmax after their parent.

    token_ids, parents: [1, N]; logits: [1, N+1, V] for [root] + nodes.
    """
    argmax = logits[0].argmax(dim=-1).tolist()  # [N+1]
    toks, pars = token_ids[0].tolist(), parents[0].tolist()
    ok = [False] * len(toks)
    depth = [0] * len(toks)
    best = -1
    for i, (tok, par) in enumerate(zip(toks, pars)):
        parent_ok = par < 0 or ok[par]
        ok[i] = parent_ok and tok == argmax[par + 1]
        if ok[i]:
            depth[i] = 1 if par < 0 else depth[par] + 1
            if best < 0 or depth[i] > depth[best]:
                best = i
    path: list[int] = []
    node = best
    while node >= 0:
        path.append(node)
        node = pars[node]
    path.reverse()
    return TreeVerdict(path=path, next_token=argmax[path[-1] + 1 if path else 0])


def _without(dist: Tensor, token: int) -> Tensor:
    """dist [V] with `token` removed (not renormalised): what rejecting a one-hot draft leaves."""
    out = dist.clone()
    out[token] = 0.0
    return out


def sample_verify_tree(token_ids: Tensor, parents: Tensor, probs: Tensor, generator: torch.Generator) -> TreeVerdict:
    """Lossless verification of a tree of deterministic candidates at temperature > 0.

    token_ids, parents: [1, N]; probs: [N+1, V] the target's warped p for [root] + nodes (p after
    each node's path). Siblings are tried in list order (best rank first), each accepted with
    probability r(x) / sum(r), r = p at the current node minus the siblings already rejected; the
    next token is drawn from the final r (module docstring).
    """
    toks, pars = token_ids[0].tolist(), parents[0].tolist()
    children: dict[int, list[int]] = {}
    for i, par in enumerate(pars):
        children.setdefault(par, []).append(i)
    p = probs.double()  # [N+1, V]
    path: list[int] = []
    node = -1  # the root
    while True:
        residual = p[node + 1]  # [V]
        accepted = None
        for child in children.get(node, []):
            total = float(residual.sum())
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            if total > 0 and u * total < float(residual[toks[child]]):  # u < r(x) / sum(r)
                accepted = child
                break
            residual = _without(residual, toks[child])
        if accepted is None:
            if float(residual.sum()) <= 0:  # only reachable when rejection had probability 0
                residual = p[node + 1]
            next_token = int(sample((residual / residual.sum())[None], generator)[0])
            return TreeVerdict(path=path, next_token=next_token)
        path.append(accepted)
        node = accepted


def accepted_positions(past_len: int, path: Sequence[int]) -> list[int]:
    """Cache positions to keep: the committed prefix, the root and the accepted nodes, in order."""
    return list(range(past_len + 1)) + [past_len + 1 + i for i in path]


def tree_score(target, inputs: Tensor, draft: Draft):  # noqa: ANN001, ANN201
    """The target forward over [root] + tree nodes (inputs [1, N+1]) with the tree mask and
    positions; returns its TargetOutput (logits [1, N+1, V]). The cache then holds all N+1."""
    if draft.parents is None or inputs.shape[0] != 1:
        raise ValueError("a tree forward needs a tree draft (parents set) and batch size 1.")
    past = target.cache_length
    mask, pos = tree_attention(draft.parents[0].tolist(), past, target.lm_head.weight.dtype, target.device)
    return target.forward(inputs, attention_mask=mask, position_ids=pos)


def tree_accept(target, draft: Draft, out, sampling: SamplingConfig,  # noqa: ANN001, ANN201
                generator: torch.Generator):
    """After `tree_score`: verify the tree (greedy, or `sample_verify_tree` at temperature > 0),
    keep only the accepted path in the KV cache and return (chain draft of the accepted path
    [1, A], TargetOutput with the rows [root] + path, VerifyResult of the round).

    The decoding loop then treats the round as a chain round that kept all A tokens and emits
    `next_token`; it crops nothing more and reads the hidden state of the last accepted node.
    """
    from specdraft.target import TargetOutput

    past = target.cache_length - out.logits.shape[1]  # committed positions before the root
    if sampling.greedy:
        verdict = greedy_verify_tree(draft.token_ids, draft.parents, out.logits)
    else:
        probs = warp(out.logits[0], sampling)  # [N+1, V]
        verdict = sample_verify_tree(draft.token_ids, draft.parents, probs, generator)
    target.keep_positions(accepted_positions(past, verdict.path))
    rows = torch.tensor([0] + [i + 1 for i in verdict.path], device=out.logits.device)
    chain = Draft(token_ids=draft.token_ids[:, rows[1:] - 1])
    result = VerifyResult(num_accepted=torch.tensor([len(verdict.path)], device=out.logits.device),
                          next_token=torch.tensor([verdict.next_token], device=out.logits.device))
    return chain, TargetOutput(logits=out.logits[:, rows], hidden=out.hidden[:, rows]), result


def tree_forward(target, inputs: Tensor, draft: Draft, sampling: SamplingConfig,  # noqa: ANN001, ANN201
                 generator: torch.Generator):
    """`tree_score` then `tree_accept`: one tree round's target work in one call."""
    return tree_accept(target, draft, tree_score(target, inputs, draft), sampling, generator)
