"""The target's exact law of the first `depth` generated tokens, on a finite set of cells.

The cells are a prefix tree over the target's own probabilities: at every expanded node (a prefix
of generated tokens) the children whose expected count reaches `min_cell_expected` at the audit's
N are kept (most likely first, at most `max_children`), and one exact "everything else" cell
holds the node's remaining mass. A kept child is a node again (expanded one level deeper, if its
expected count could fill two cells and the node budget allows) or a cell of its own. Every
token sequence of length `depth` falls in exactly one cell, so the test stays exact for a 50k
vocabulary, and the cells adapt to N: a larger audit gets finer cells. All prefixes of one level
have the same length, so each level is a few batched target forwards without padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from specdraft.sampling import SamplingConfig, warp
from specdraft.target import TargetModel

Prefix = tuple[int, ...]


@dataclass(frozen=True)
class CellSettings:
    """How finely the audit's cells split the law of the first `depth` tokens."""

    min_cell_expected: float = 20.0  # a child is its own cell / node only with this expected count
    max_children: int = 48  # children kept per node, most likely first
    max_nodes: int = 2048  # expanded nodes (one target forward row each), most likely first
    batch: int = 32  # prefixes per target forward

    def __post_init__(self) -> None:
        if not self.min_cell_expected > 0:
            raise ValueError(f"min_cell_expected must be > 0, got {self.min_cell_expected!r}.")
        for name in ("max_children", "max_nodes", "batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")


@dataclass(frozen=True)
class CellTable:
    """Exact probabilities of the audit's cells and the map from token sequences to cells."""

    depth: int  # tokens per sequence
    probs: np.ndarray  # [C] float64, sums to 1
    leaf: dict[Prefix, int]  # a kept, unexpanded prefix -> its cell
    other: dict[Prefix, int]  # an expanded prefix -> the cell of its remaining children

    def cell(self, tokens: Sequence[int]) -> int:
        """The cell of a generated sequence (its first `depth` tokens)."""
        if len(tokens) < self.depth:
            raise ValueError(f"a sequence of {len(tokens)} tokens has no cell; the audit needs {self.depth}.")
        prefix: Prefix = ()
        for tok in tokens[: self.depth]:
            child = (*prefix, int(tok))
            if child in self.leaf:
                return self.leaf[child]
            if child not in self.other:
                return self.other[prefix]
            prefix = child
        raise AssertionError("a full-depth prefix is always a leaf")  # pragma: no cover

    @property
    def num_cells(self) -> int:
        return len(self.probs)


@torch.inference_mode()
def next_token_probs(
    target: TargetModel, context: Sequence[int], prefixes: Sequence[Prefix], sampling: SamplingConfig,
    batch: int = 32,
) -> np.ndarray:
    """Warped p(. | context + prefix) [P, V] float64 for prefixes of one length, from plain full
    forwards of the Hugging Face model (no cache, no specdraft stack)."""
    rows = []
    for start in range(0, len(prefixes), batch):
        chunk = [list(context) + list(p) for p in prefixes[start : start + batch]]
        ids = torch.tensor(chunk, device=target.device)  # [B, T + l]
        hidden = target.decoder(input_ids=ids).last_hidden_state[:, -1]  # [B, H]
        rows.append(warp(target.lm_head(hidden), sampling).double().cpu().numpy())  # [B, V]
    return np.concatenate(rows)


def exact_cells(
    target: TargetModel, context: Sequence[int], sampling: SamplingConfig, depth: int, num_samples: int,
    settings: CellSettings = CellSettings(),
) -> CellTable:
    """The target's exact law of the first `depth` tokens after `context`, on cells sized for an
    audit of `num_samples` generations."""
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}.")
    threshold = settings.min_cell_expected / max(num_samples, 1)  # a cell's smallest probability
    probs: list[float] = []
    leaf: dict[Prefix, int] = {}
    other: dict[Prefix, int] = {}
    level: list[tuple[Prefix, float]] = [((), 1.0)]  # expanded nodes of this level and their mass
    expanded = 1
    for length in range(depth):
        p = next_token_probs(target, context, [prefix for prefix, _ in level], sampling, settings.batch)
        grow: list[tuple[Prefix, float]] = []
        for row, (prefix, mass) in enumerate(level):
            order = np.argsort(-p[row], kind="stable")[: settings.max_children]
            kept = [int(t) for t in order if mass * p[row, t] >= threshold and p[row, t] > 0]
            other[prefix] = len(probs)
            probs.append(mass * max(0.0, 1.0 - float(p[row, kept].sum())))
            for tok in kept:
                grow.append(((*prefix, tok), mass * float(p[row, tok])))
        grow.sort(key=lambda node: -node[1])
        level = []
        for child, mass in grow:
            deeper = length + 1 < depth and mass >= 2 * threshold and expanded < settings.max_nodes
            if deeper:
                level.append((child, mass))
                expanded += 1
            else:
                leaf[child] = len(probs)
                probs.append(mass)
        if not level:
            break
    arr = np.array(probs)
    return CellTable(depth, arr / arr.sum(), leaf, other)
