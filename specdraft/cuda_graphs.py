"""CUDA graphs of the target's verify forward (the GPU path of the fast stack).

On a GPU a 135M-parameter forward is dominated by launching ~300 small kernels, not by arithmetic,
so scoring k positions costs about as much as scoring one and the whole forward is worth replaying
as one graph. `VerifyGraphs` captures `FastStack.run_static` once per k in 1..max_positions (lazily,
on first use) against static input buffers and a KV buffer that never moves, then each verify is:
copy the k token ids and the base position in (device copies, no host sync), replay, advance the
lengths in Python. Prefill, trees, early exit and k > max_positions use the eager fast path.

Captured graphs hold pointers into the KV buffer: when the buffer moves (it grew), they are dropped
and recaptured. The last `max_positions` slots of the buffer are scratch for warm-up and capture,
so capturing never overwrites cached positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdraft.fast_stack import FastStack


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    token_ids: Tensor  # [1, k] static input
    base: Tensor  # [1] static input: position of the first new token
    hidden: Tensor  # [1, k, H] static output


class VerifyGraphs:
    """Per-k CUDA graphs of `stack.run_static` (batch 1)."""

    def __init__(self, stack: FastStack, max_positions: int, capacity: int) -> None:
        self.stack = stack
        self.max_positions = max_positions
        self.capacity = capacity  # KV positions reserved up front (+ scratch), so the buffer never moves
        self._graphs: dict[int, _Graph] = {}
        self._captured_for: tuple[object, int] | None = None  # (KV buffer, its version) the graphs point into

    def usable(self, token_ids: Tensor) -> bool:
        kv = self.stack.kv
        k = token_ids.shape[1]
        return (
            token_ids.shape[0] == 1 and 1 <= k <= self.max_positions and kv is not None
            and kv.lengths[0] == kv.lengths[-1]  # no pending early-exit positions
            and kv.lengths[0] + k <= kv.capacity - self.max_positions  # stays out of the scratch slots
        )

    def run(self, token_ids: Tensor) -> Tensor:
        """Replay the graph for k = token_ids.shape[1]; post-norm hidden [1, k, H] (a copy)."""
        kv = self.stack.kv
        assert kv is not None
        if self._captured_for is None or self._captured_for[0] is not kv or self._captured_for[1] != kv.version:
            self._graphs.clear()  # a new or moved buffer: every captured pointer is stale
            self._captured_for = (kv, kv.version)
        k = token_ids.shape[1]
        g = self._graphs.get(k)
        if g is None:
            g = self._graphs[k] = self._capture(k)
        past = kv.lengths[0]
        g.token_ids.copy_(token_ids, non_blocking=True)
        g.base.fill_(past)
        g.graph.replay()
        kv.lengths = [past + k] * len(kv.lengths)
        return g.hidden.clone()

    def _capture(self, k: int) -> _Graph:
        kv = self.stack.kv
        assert kv is not None
        device = kv.device
        token_ids = torch.zeros((1, k), dtype=torch.long, device=device)
        base = torch.full((1,), kv.capacity - self.max_positions, dtype=torch.long, device=device)  # scratch
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm up kernels and the allocator outside the capture
                self.stack.run_static(token_ids, base)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            hidden = self.stack.run_static(token_ids, base)
        return _Graph(graph, token_ids, base, hidden)
