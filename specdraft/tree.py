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

Which tree to draft and its node tokens are the drafter's business (Medusa: `drafters/medusa_tree.py`
grows it from the heads' measured accuracies and sizes it for the target's verify-cost curve).

Temperature > 0 (`sample_verify_tree`): the candidates are deterministic (top-k ranks), so each
sibling is a draft with a one-hot q. Starting at the root, the children of the current node are tried
in order: child x is accepted with probability r(x), where r is the target's warped p at the current
node with every already rejected sibling removed and renormalised (rejection sampling with one-hot
q, repeated on the residual); an accepted child becomes the current node, and when all children are
rejected (or a leaf is reached) the next token is drawn from r. Each emitted token is therefore
distributed exactly as p given the tokens before it: the tree is as lossless as the chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from specdraft.protocol import Draft
from specdraft.sampling import SamplingConfig, sample, warp
from specdraft.verify import VerifyResult

Path_ = tuple[int, ...]  # one node: its top-k rank at every depth


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


def tree_depth(parents: Sequence[int]) -> int:
    """The deepest node's depth (0 for no nodes): how many tokens the longest path can keep, the
    tree's counterpart of a chain's K."""
    return max(tree_depths(parents), default=0)


def chain_with_siblings(chain: Sequence[int], alternatives: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """A candidate tree from a drafted chain and other candidates for its positions: (node tokens,
    parents), parent-first.

    chain: the K drafted tokens; alternatives[d]: other tokens for the chain's position d (best
    first, none equal to chain[d]; empty where there are none). The chain's token at depth d is
    the child of its token at depth d - 1 (-1 = the root) and comes first among its siblings (tried
    first at temperature > 0); the alternatives are leaves beside it. A draft model runs once per
    chain position, and its next-best guesses there cost nothing more: a round whose chain misses
    at depth d still keeps a token at d when the target's choice is one of them.
    """
    if len(chain) != len(alternatives):
        raise ValueError(f"need one list of alternatives per chain token, got {len(alternatives)} for {len(chain)}.")
    tokens: list[int] = []
    parents: list[int] = []
    parent = -1  # the chain node the next depth hangs from
    for depth, (tok, alts) in enumerate(zip(chain, alternatives), start=1):
        if tok in alts:
            raise ValueError(f"alternative {tok} repeats the chain's own token at depth {depth}.")
        node = len(tokens)
        tokens += [int(tok), *map(int, alts)]
        parents += [parent] * (1 + len(alts))
        parent = node
    return tokens, parents


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


def tree_score(target, inputs: Tensor, draft: Draft, features: Sequence[int] = ()):  # noqa: ANN001, ANN201
    """The target forward over [root] + tree nodes (inputs [1, N+1]) with the tree mask and
    positions; returns its TargetOutput (logits [1, N+1, V]; the inputs of layers `features`
    too). The cache then holds all N+1."""
    if draft.parents is None or inputs.shape[0] != 1:
        raise ValueError("a tree forward needs a tree draft (parents set) and batch size 1.")
    past = target.cache_length
    mask, pos = tree_attention(draft.parents[0].tolist(), past, target.lm_head.weight.dtype, target.device)
    return target.forward(inputs, attention_mask=mask, position_ids=pos, features=features)


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
    kept = None if out.features is None else out.features[:, rows]
    return chain, TargetOutput(logits=out.logits[:, rows], hidden=out.hidden[:, rows], features=kept), result


def tree_forward(target, inputs: Tensor, draft: Draft, sampling: SamplingConfig,  # noqa: ANN001, ANN201
                 generator: torch.Generator):
    """`tree_score` then `tree_accept`: one tree round's target work in one call."""
    return tree_accept(target, draft, tree_score(target, inputs, draft), sampling, generator)
