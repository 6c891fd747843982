"""Fast forms of Medusa heads (`specdraft.formats.medusa_heads.MedusaHeads`) for drafting and training.

`CompiledHeads` reads the live modules of (PEFT-wrapped) heads and runs them as one shared-projection
matmul for all heads, optionally restricted to a pruned vocabulary; gradients flow, so training uses
it too. `PackedHeads` and `PackedRecurrentHeads` are frozen inference copies in the few-row layout
of `specdraft.linear_formats.PackedLinear` (the drafter's hot path). All three compute the same sums,
equal up to float rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdraft.formats.medusa_heads import base_heads, head_states, recurrent_state
from specdraft.vocab import PrunedVocab


def select_rows(weight: Tensor, vocab: PrunedVocab | None) -> Tensor:
    """The rows [M, ...] of a [V, ...] projection factor that a pruned vocabulary keeps (all if
    vocab is None); keeps autograd (unlike `PrunedVocab.head`, which copies a frozen weight)."""
    return weight if vocab is None else weight[vocab.ids.to(weight.device)]


class CompiledHeads:
    """Fast form of a (PEFT-wrapped) MedusaHeads: one shared-projection matmul for all heads,
    optionally restricted to a pruned vocabulary.

    Holds the live modules and parameters (no copies, gradients flow: training uses it too):
    blocks, per-head LoRA factors A [r, H], B [V, r] with their scaling, and the projection
    weight(s). logits_k = W[ids] h_k + s_k * B_k[ids] (A_k h_k).
    vocab: the pruned vocabulary to project onto (None = the whole vocabulary).
    """

    def __init__(self, model: nn.Module, vocab: PrunedVocab | None = None) -> None:
        base = base_heads(model)
        self.blocks = [self._active(b) for b in base.blocks]
        self.inputs = [self._active(b) for b in base.inputs]  # recurrent heads' TokenBlocks ([] if none)
        self.embed = base.embed_weight  # [V, H] the target's input embedding (recurrent heads)
        self.weights: list[Tensor] = []
        self.lora: list[tuple[Tensor, Tensor, float] | None] = []
        for proj in base.lm_heads:
            layer = self._active(proj)
            base_layer = getattr(layer, "base_layer", layer)  # a PEFT LoRA layer wraps the Linear
            self.weights.append(base_layer.weight)
            self.lora.append(lora_factors(layer))
        self.shared = all(w.data_ptr() == self.weights[0].data_ptr() for w in self.weights)
        self.vocab = vocab
        # the frozen shared projection restricted to the pruned vocabulary, gathered once
        self._shared_rows = vocab.head(self.weights[0]) if self.shared and vocab is not None else None

    @property
    def recurrent(self) -> bool:
        """Whether head k reads the token drafted before it (specdraft.formats.medusa_heads)."""
        return bool(self.inputs)

    def truncate(self, num_heads: int) -> None:
        """Use only the first num_heads heads."""
        self.blocks, self.weights, self.lora = (
            self.blocks[:num_heads], self.weights[:num_heads], self.lora[:num_heads])
        self.inputs = self.inputs[:num_heads]

    @staticmethod
    def _active(module: nn.Module) -> nn.Module:
        """The trained copy of a PEFT `modules_to_save` wrapper, or the module itself."""
        saved = getattr(module, "modules_to_save", None)  # PEFT's wrapper keeps its copies here
        if isinstance(saved, nn.ModuleDict) and len(saved) > 0:
            return saved[next(iter(saved.keys()))]
        return module

    def __call__(self, hidden: Tensor, tokens: Tensor | None = None) -> Tensor:
        """hidden [B, H] (tokens [B, K] for recurrent heads: y_0 = the newest token, y_k = the
        token before head k) -> logits [B, K, M] over the pruned vocabulary (or [B, K, V]);
        differentiable."""
        h = head_states(self.blocks, self.inputs, self.embed, hidden, tokens)  # [B, K, H]
        if self.shared:
            out = F.linear(h, self.projection(0))  # [B, K, M] one matmul for every head
        else:
            out = torch.stack([F.linear(h[:, k], self.projection(k)) for k in range(len(self.blocks))], dim=1)
        deltas = [self._delta(k, h[:, k]) for k in range(len(self.blocks))]  # K x [B, M] or None
        zero = torch.zeros_like(out[:, 0])
        return out + torch.stack([zero if d is None else d for d in deltas], dim=1)

    def projection(self, k: int) -> Tensor:
        """Head k's projection weight [M, H] (the shared one detached: it is the target's)."""
        if self.shared:
            return self._shared_rows if self._shared_rows is not None else self.weights[0].detach()
        return select_rows(self.weights[k], self.vocab)

    def _delta(self, k: int, h: Tensor) -> Tensor | None:
        """Head k's LoRA delta [B, M] on its state h [B, H] (None without LoRA)."""
        factors = self.lora[k]
        if factors is None:
            return None
        a, b, s = factors
        return s * F.linear(F.linear(h, a), select_rows(b, self.vocab))

    @torch.inference_mode()
    def step(self, k: int, state: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """One recurrent head: state [P, H] (the previous head's, or the target's hidden state for
        k = 0) and the token before head k [P] -> (head k's state [P, H], logits [P, M] float32)."""
        if not self.recurrent:
            raise ValueError("step() is for recurrent heads; call the heads on the hidden state instead.")
        new = recurrent_state(self.blocks[k], self.inputs[k], self.embed, state, tokens)  # [P, H]
        logits = F.linear(new, self.projection(k))  # [P, M]
        delta = self._delta(k, new)
        return new, (logits if delta is None else logits + delta).float()

    @torch.inference_mode()
    def logits(self, hidden: Tensor, tokens: Tensor | None = None) -> Tensor:
        """hidden [B, H] (tokens [B, K] for recurrent heads) -> logits [B, K, M] (float32), no autograd."""
        return self(hidden, tokens).float()


class PackedHeads:
    """Inference form of CompiledHeads with a shared projection: frozen copies in the few-row
    layout that is fastest on this device (`specdraft.linear_formats.PackedLinear`, oneDNN on CPU).

    The first ResBlock of every head reads the same hidden state, so their Linears run as one
    [K*H, H] product; the LoRA deltas are folded into the projection as extra input columns:
    logits_k = [W | s_1 B_1 | .. | s_K B_K] [h_k ; 0 .. A_k h_k .. 0], one product for all heads
    (rows restricted to the pruned vocabulary). Same sums as CompiledHeads, re-associated
    (equal up to float rounding). Frozen: re-attach after changing the heads.
    """

    def __init__(self, compiled: CompiledHeads) -> None:
        from specdraft.linear_formats import PackedLinear

        if not compiled.shared or compiled.recurrent:
            raise ValueError("PackedHeads needs independent heads that share the target's projection.")
        self.num_heads = len(compiled.blocks)
        depth = {len(list(b)) if isinstance(b, nn.Sequential) else -1 for b in compiled.blocks}
        if len(depth) != 1 or -1 in depth:
            raise ValueError("PackedHeads needs every head to be a Sequential of ResBlocks of one depth.")
        layers = [[blk.linear for blk in head] for head in compiled.blocks]  # [K][N] nn.Linear
        self.first = None
        if depth.pop() > 0:  # every head's first block reads the same hidden state: one product
            self.first = PackedLinear(torch.cat([ls[0].weight.detach() for ls in layers]),
                                      torch.cat([ls[0].bias.detach() for ls in layers]))
        self.rest = [[PackedLinear(lin.weight, lin.bias) for lin in ls[1:]] for ls in layers]
        w = select_rows(compiled.weights[0].detach(), compiled.vocab)  # [M, H]
        cols, self.lora_a, self.offsets = [w], [], []
        offset = w.shape[1]
        for factors in compiled.lora:
            if factors is None:
                self.lora_a.append(None)
                self.offsets.append(offset)
                continue
            a, b, scale = factors
            b = select_rows(b.detach(), compiled.vocab)  # [M, r]
            cols.append(scale * b)
            self.lora_a.append(a.detach())  # [r, H]
            self.offsets.append(offset)
            offset += a.shape[0]
        self.width = offset
        self.proj = PackedLinear(torch.cat(cols, dim=1), None)  # [M, H + sum r]

    @torch.inference_mode()
    def __call__(self, hidden: Tensor) -> Tensor:
        """hidden [B, H] -> logits [B, K, M] (float32)."""
        batch, size = hidden.shape
        k = self.num_heads
        h = hidden[:, None].expand(batch, k, size)  # [B, K, H]
        if self.first is not None:
            h = h + F.silu(self.first(hidden).view(batch, k, size))  # [B, K, H]
        if any(self.rest):  # blocks after the first: per head
            h = torch.stack([self._more(h[:, i], i) for i in range(k)], dim=1)
        x = h.new_zeros(batch, k, self.width)  # [B, K, H + sum r]
        x[..., :size] = h
        for i, a in enumerate(self.lora_a):
            if a is not None:
                x[:, i, self.offsets[i] : self.offsets[i] + a.shape[0]] = F.linear(h[:, i], a)  # [B, r]
        return self.proj(x).float()  # [B, K, M]

    def _more(self, h: Tensor, head: int) -> Tensor:
        for lin in self.rest[head]:
            h = h + F.silu(lin(h))
        return h


class PackedRecurrentHeads:
    """Inference form of recurrent CompiledHeads with a shared projection: frozen copies in the
    few-row layout (`specdraft.linear_formats.PackedLinear`), the projection restricted to the pruned
    vocabulary and packed once for all heads, each head's LoRA factors pre-gathered and pre-scaled.

    Recurrent heads run one head at a time (K sequential steps), so the shared projection is
    streamed once per step: packing it is most of the drafting cost (benchmarks/RESULTS.md).
    Same sums as CompiledHeads.step, up to float rounding. Frozen: re-attach after changing the heads.
    """

    def __init__(self, compiled: CompiledHeads) -> None:
        from specdraft.linear_formats import PackedLinear

        if not compiled.shared or not compiled.recurrent:
            raise ValueError("PackedRecurrentHeads needs recurrent heads that share the target's projection.")
        self.embed = compiled.embed  # [V, H]
        self.inputs = [PackedLinear(blk.linear.weight, blk.linear.bias) for blk in compiled.inputs]  # [H, 2H]
        self.rest = [[PackedLinear(res.linear.weight, res.linear.bias) for res in head] for head in compiled.blocks]
        self.proj = PackedLinear(compiled.projection(0), None)  # [M, H], shared by every head
        self.lora: list[tuple[Tensor, Tensor] | None] = []
        for factors in compiled.lora:
            if factors is None:
                self.lora.append(None)
                continue
            a, b, scale = factors
            b = select_rows(b.detach(), compiled.vocab)  # [M, r]
            self.lora.append((a.detach(), (scale * b).contiguous()))

    def step(self, k: int, state: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Same contract as CompiledHeads.step: (state [P, H], tokens [P]) -> (state, logits [P, M])."""
        embedded = F.embedding(tokens, self.embed)  # [P, H]
        x = state + F.silu(self.inputs[k](torch.cat([state, embedded], dim=-1)))  # [P, H]
        for lin in self.rest[k]:
            x = x + F.silu(lin(x))
        logits = self.proj(x)  # [P, M]
        factors = self.lora[k]
        if factors is not None:
            a, sb = factors
            logits = logits + F.linear(F.linear(x, a), sb)
        return x, logits.float()


def lora_factors(layer: nn.Module) -> tuple[Tensor, Tensor, float] | None:
    """(A [r, H], B [V, r], scaling) of a PEFT LoRA Linear's active adapter, or None."""
    lora_a = getattr(layer, "lora_A", None)  # PEFT's LoRA layer keeps its factors per adapter name
    if not isinstance(lora_a, nn.ModuleDict) or len(lora_a) == 0:
        return None
    name = next(iter(lora_a.keys()))
    return (
        lora_a[name].weight,
        layer.lora_B[name].weight,
        float(layer.scaling[name]),
    )
