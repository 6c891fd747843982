"""Medusa drafting: K small heads on the target's last hidden state guess the next K tokens.

Head k (0-based) reads the target's post-norm hidden state h at the position that produced the
newest token x_n and guesses x_{n+k+1}; one target forward therefore yields the next draft for free
(no second model, no sequential drafting passes). A head is

    h_k = ResBlock^N(h),  ResBlock(x) = x + SiLU(W x + b)   (W, b zero-initialised)
    logits_k = lm_head(h_k) + (alpha / r) * B_k A_k h_k      (target's tied lm_head, frozen; LoRA delta)

so a fresh head (zero blocks, B_k = 0) reproduces the target's own logits exactly.

Recurrent heads (`recurrent=True`, Hydra / ReDrafter style): head k also reads the token drafted
before it. With s_{-1} = h and y_0 = x_n (the newest token), y_k = the draft token at depth k,

    s_k = ResBlock^N(TokenBlock_k(s_{k-1}, y_k)),  TokenBlock(s, y) = s + SiLU(W [s ; E y] + b)
    logits_k = lm_head(s_k) + (alpha / r) * B_k A_k s_k

(E = the target's input embedding, frozen; W, b zero-initialised, so a fresh recurrent head also
reproduces the lm_head). Plain Medusa heads must guess x_{n+k+1} without knowing the tokens
guessed before it; a recurrent head is told them, at the price of K small sequential steps, and a
tree node's children then depend on its path (`specdraft.tree.path_tree_draft`). Training uses PEFT
(`modules_to_save` for the blocks, LoRA on the per-head projections; specdraft/train/medusa.py) and
saves a PEFT adapter directory; `MedusaDrafter` loads it onto a `MedusaHeads` built from the bound
target, so no weight of the target is stored twice. The option `full_projection` gives each head its
own trainable copy of the projection instead (the original Medusa-2 layout; ~28M parameters/head).

Proposals: a chain (top-1 of every head at temperature 0; at temperature > 0 a sample from each
head's warped distribution, returned as q: the heads do not condition on the earlier draft tokens,
which is still a valid q for the lossless verifier), or a candidate tree (`specdraft.tree`,
plain lists of top-k rank paths) verified in one forward with a tree mask: greedily at temperature
0, by rejection sampling over the siblings (one-hot q, residual renormalised) at temperature > 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdraft.costs import cached_verify_curve
from specdraft.protocol import Draft, DraftContext
from specdraft.sampling import sample, warp
from specdraft.tree import MAX_TREE_NODES, load_tree, path_tree_draft, tree_draft

if TYPE_CHECKING:
    from specdraft.target import TargetModel

ARTIFACTS = Path(__file__).resolve().parent.parent / "specdraft" / "artifacts"
HEADS_CONFIG = "medusa_config.json"  # written next to the PEFT adapter: the heads' architecture
VOCAB_FILE = "vocab.json"  # optional pruned vocabulary the heads were trained to project onto


class ResBlock(nn.Module):
    """x + SiLU(Linear(x)), the Linear zero-initialised so a fresh block is the identity."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        return x + F.silu(self.linear(x))


class TokenBlock(nn.Module):
    """s + SiLU(Linear([s ; e])): a recurrent head's input from the previous state s [.., H] and
    the embedding e [.., H] of the token drafted before it; zero-initialised (a fresh block is s)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(2 * hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, state: Tensor, embedded: Tensor) -> Tensor:
        return state + F.silu(self.linear(torch.cat([state, embedded], dim=-1)))


class MedusaHeads(nn.Module):
    """K Medusa heads: `blocks[k]` (N distinct ResBlocks) then the projection `lm_heads[k]`.

    lm_head_weight: [V, H] the target's output embedding. Shared (frozen, not copied) by every
        head unless full_projection, which gives each head its own trainable clone.
    recurrent: head k starts with `inputs[k]`, a TokenBlock on the previous head's state and the
        token drafted before it (module docstring); needs embed_weight [V, H], the target's input
        embedding (frozen, not copied, not saved).
    """

    def __init__(
        self,
        lm_head_weight: Tensor,
        num_heads: int = 3,
        num_layers: int = 1,
        full_projection: bool = False,
        recurrent: bool = False,
        embed_weight: Tensor | None = None,
    ) -> None:
        super().__init__()
        if num_heads < 1 or num_layers < 0:
            raise ValueError(
                f"need num_heads >= 1 and num_layers >= 0, got num_heads={num_heads}, "
                f"num_layers={num_layers}."
            )
        if recurrent and embed_weight is None:
            raise ValueError(
                "recurrent heads read the drafted tokens: pass embed_weight, the target's input "
                "embedding (target.model.get_input_embeddings().weight)."
            )
        vocab, hidden = lm_head_weight.shape
        self.num_heads, self.num_layers, self.full_projection = num_heads, num_layers, full_projection
        self.recurrent = recurrent
        self.embed_weight = embed_weight.detach() if recurrent else None  # [V, H], not a parameter
        self.inputs = nn.ModuleList(TokenBlock(hidden) for _ in range(num_heads if recurrent else 0))
        self.blocks = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden) for _ in range(num_layers)]) for _ in range(num_heads)
        )
        self.lm_heads = nn.ModuleList()
        for _ in range(num_heads):
            proj = nn.Linear(hidden, vocab, bias=False, device=lm_head_weight.device)
            if full_projection:
                proj.weight = nn.Parameter(lm_head_weight.detach().clone())
            else:
                proj.weight = lm_head_weight  # the target's Parameter itself: shared, never copied
            self.lm_heads.append(proj)
        self.to(lm_head_weight.device)

    def head_hidden(self, hidden: Tensor, tokens: Tensor | None = None) -> Tensor:
        """hidden [..., H] (and, for recurrent heads, tokens [..., K]: y_0 = the newest token,
        y_k = the draft token before head k) -> every head's block output [..., K, H]."""
        return _head_states(self.blocks, list(self.inputs), self.embed_weight, hidden, tokens)

    def forward(self, hidden: Tensor, tokens: Tensor | None = None) -> Tensor:
        """hidden [..., H] (tokens [..., K] for recurrent heads) -> logits [..., K, V] of every head."""
        h = self.head_hidden(hidden, tokens)  # [..., K, H]
        return torch.stack([proj(h[..., k, :]) for k, proj in enumerate(self.lm_heads)], dim=-2)

    def architecture(self) -> dict[str, int | bool]:
        """What is needed to rebuild the module before loading an adapter into it."""
        arch: dict[str, int | bool] = {
            "num_heads": self.num_heads,
            "num_layers": self.num_layers,
            "full_projection": self.full_projection,
        }
        if self.recurrent:
            arch["recurrent"] = True
        return arch


def _head_states(blocks: Sequence[nn.Module], inputs: Sequence[nn.Module], embed: Tensor | None,
                 hidden: Tensor, tokens: Tensor | None) -> Tensor:
    """Every head's state [..., K, H] from hidden [..., H]: independent heads, or the recurrence
    s_k = blocks_k(inputs_k(s_{k-1}, E y_k)) when `inputs` is non-empty (tokens [..., K])."""
    if not inputs:
        return torch.stack([blk(hidden) for blk in blocks], dim=-2)
    if tokens is None or embed is None:
        raise ValueError("recurrent heads need the tokens before each head (tokens [..., K]).")
    states, state = [], hidden
    for k, blk in enumerate(blocks):
        state = _recurrent_state(blk, inputs[k], embed, state, tokens[..., k])
        states.append(state)
    return torch.stack(states, dim=-2)


def _recurrent_state(block: nn.Module, token_block: nn.Module, embed: Tensor, state: Tensor,
                     tokens: Tensor) -> Tensor:
    """One recurrent head's state [..., H] from the previous state and the tokens before it [...]."""
    return block(token_block(state, F.embedding(tokens, embed)))


def _on_rows(weight: Tensor, rows: Tensor | None) -> Tensor:
    """The rows of a [V, ...] projection factor that a pruned vocabulary keeps (all if rows is None)."""
    return weight if rows is None else weight[rows]


def lora_config(
    num_heads: int, num_layers: int, rank: int, alpha: float, full_projection: bool,
    recurrent: bool = False,
):  # noqa: ANN201
    """The PEFT LoraConfig for Medusa heads: every head's blocks (and recurrent input blocks) fully
    trained (`modules_to_save`), LoRA (rank `rank`) on the shared projections; with full_projection
    the projections are trained whole (`modules_to_save`) and the LoRA sits on the blocks instead."""
    from peft import LoraConfig

    if rank < 1:
        raise ValueError(f"lora_rank must be >= 1, got {rank}.")
    heads = range(num_heads)
    if recurrent:
        if full_projection:
            raise ValueError("recurrent heads share the target's projection: set full_projection=false.")
        names = [f"lm_heads.{k}" for k in heads]
        saved = [f"blocks.{k}" for k in heads if num_layers > 0] + [f"inputs.{k}" for k in heads]
        return LoraConfig(r=rank, lora_alpha=alpha, target_modules=names, modules_to_save=saved)
    if full_projection:
        # PEFT needs a LoRA target: the blocks get LoRA, the whole projections are trained.
        blocks = [f"blocks.{k}.{j}.linear" for k in heads for j in range(num_layers)]
        if not blocks:
            raise ValueError("full_projection needs num_layers >= 1 (the blocks carry the LoRA).")
        saved = [f"lm_heads.{k}" for k in heads]
        return LoraConfig(r=rank, lora_alpha=alpha, target_modules=blocks, modules_to_save=saved)
    names = [f"lm_heads.{k}" for k in heads]
    saved = [f"blocks.{k}" for k in heads]
    return LoraConfig(r=rank, lora_alpha=alpha, target_modules=names, modules_to_save=saved)


def build_peft_heads(heads: MedusaHeads, rank: int = 8, alpha: float = 16.0):  # noqa: ANN201
    """Wrap heads in a PEFT model ready to train (target weights frozen)."""
    from peft import get_peft_model

    for p in heads.parameters():
        p.requires_grad_(False)
    cfg = lora_config(heads.num_heads, heads.num_layers, rank, alpha, heads.full_projection,
                      heads.recurrent)
    return get_peft_model(heads, cfg)


def save_heads(peft_model, out_dir: str | Path, provenance: dict,  # noqa: ANN001
               dtype: torch.dtype = torch.float32) -> None:
    """Save the PEFT adapter (adapter_config.json + adapter_model.safetensors), the heads'
    architecture and a JSON of how they were made. dtype: the stored weights' (float16 halves the
    file; loading casts back to the heads' float32)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out))
    if dtype != torch.float32:
        from safetensors.torch import load_file, save_file

        weights = out / "adapter_model.safetensors"
        stored = {k: v.to(dtype) if v.is_floating_point() else v for k, v in load_file(weights).items()}
        save_file(stored, weights, metadata={"format": "pt"})
        weights.chmod(0o644)
    base: MedusaHeads = peft_model.get_base_model()
    (out / HEADS_CONFIG).write_text(json.dumps(base.architecture(), indent=2) + "\n")
    (out / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
    (out / "README.md").write_text(  # replaces PEFT's generic model card
        "# Medusa heads (PEFT adapter)\n\nLoad with `drafters.medusa.MedusaDrafter(heads=<this dir>)` "
        "or `load_heads(<this dir>, target.lm_head.weight, target.model.get_input_embeddings().weight)`; "
        "made by "
        f"`{provenance.get('command', 'specdraft-train-medusa')}` (details in provenance.json).\n"
    )


def resolve_heads_dir(heads: str | Path) -> Path:
    """An adapter directory, or a shipped set in specdraft/artifacts: a target alias (its Medusa
    heads, "smollm2-135m") or alias/name ("smollm2-135m/medusa_recurrent")."""
    path = Path(heads).expanduser()
    if not path.is_dir():
        path = ARTIFACTS / str(heads)
        path = path if (path / HEADS_CONFIG).is_file() else path / "medusa"
    if not (path / HEADS_CONFIG).is_file() or not (path / "adapter_config.json").is_file():
        raise ValueError(
            f"no Medusa heads at {str(heads)!r}: pass a directory written by specdraft-train-medusa "
            "(adapter_config.json + medusa_config.json) or a target alias with shipped heads "
            "(e.g. 'smollm2-135m' or 'smollm2-135m/medusa_recurrent')."
        )
    return path


def load_heads(heads: str | Path, lm_head_weight: Tensor, embed_weight: Tensor | None = None) -> MedusaHeads:
    """Rebuild MedusaHeads on the target's lm_head (and input embedding, for recurrent heads) and
    load a saved PEFT adapter into them (the shared projection's LoRA delta stays a separate
    low-rank term)."""
    from peft import PeftModel

    path = resolve_heads_dir(heads)
    arch = json.loads((path / HEADS_CONFIG).read_text())
    base = MedusaHeads(lm_head_weight, embed_weight=embed_weight, **arch)
    peft_model = PeftModel.from_pretrained(base, str(path))
    peft_model.eval()
    return peft_model


class CompiledHeads:
    """Fast form of a (PEFT-wrapped) MedusaHeads: one shared-projection matmul for all heads,
    optionally restricted to a pruned vocabulary (rows of the projection).

    Holds the live modules and parameters (no copies, gradients flow: training uses it too):
    blocks, per-head LoRA factors A [r, H], B [V, r] with their scaling, and the projection
    weight(s). logits_k = W[rows] h_k + s_k * B_k[rows] (A_k h_k).
    rows: [M] target token ids to project onto (None = the whole vocabulary).
    """

    def __init__(self, model: nn.Module, rows: Tensor | None = None) -> None:
        base: MedusaHeads = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.blocks = [self._active(b) for b in base.blocks]
        self.inputs = [self._active(b) for b in base.inputs]  # recurrent heads' TokenBlocks ([] if none)
        self.embed = base.embed_weight  # [V, H] the target's input embedding (recurrent heads)
        self.weights: list[Tensor] = []
        self.lora: list[tuple[Tensor, Tensor, float] | None] = []
        for proj in base.lm_heads:
            layer = self._active(proj)
            base_layer = getattr(layer, "base_layer", layer)
            self.weights.append(base_layer.weight)
            self.lora.append(_lora_factors(layer))
        self.shared = all(w.data_ptr() == self.weights[0].data_ptr() for w in self.weights)
        self.rows = rows
        # the frozen shared projection restricted to the pruned rows, gathered once
        self._shared_rows = (
            self.weights[0].detach()[rows].contiguous() if self.shared and rows is not None else None
        )

    @property
    def recurrent(self) -> bool:
        """Whether head k reads the token drafted before it (module docstring)."""
        return bool(self.inputs)

    def truncate(self, num_heads: int) -> None:
        """Use only the first num_heads heads."""
        self.blocks, self.weights, self.lora = (
            self.blocks[:num_heads], self.weights[:num_heads], self.lora[:num_heads])
        self.inputs = self.inputs[:num_heads]

    @staticmethod
    def _active(module: nn.Module) -> nn.Module:
        """The trained copy of a PEFT `modules_to_save` wrapper, or the module itself."""
        saved = getattr(module, "modules_to_save", None)
        if isinstance(saved, nn.ModuleDict) and len(saved) > 0:
            return saved[next(iter(saved.keys()))]
        return module

    def __call__(self, hidden: Tensor, tokens: Tensor | None = None) -> Tensor:
        """hidden [B, H] (tokens [B, K] for recurrent heads: y_0 = the newest token, y_k = the
        token before head k) -> logits [B, K, M] over `rows` (or [B, K, V]); differentiable."""
        h = _head_states(self.blocks, self.inputs, self.embed, hidden, tokens)  # [B, K, H]
        if self.shared:
            out = F.linear(h, self._projection(0))  # [B, K, M] one matmul for every head
        else:
            out = torch.stack([F.linear(h[:, k], self._projection(k)) for k in range(len(self.blocks))], dim=1)
        deltas = [self._delta(k, h[:, k]) for k in range(len(self.blocks))]  # K x [B, M] or None
        zero = torch.zeros_like(out[:, 0])
        return out + torch.stack([zero if d is None else d for d in deltas], dim=1)

    def _projection(self, k: int) -> Tensor:
        """Head k's projection weight [M, H] (the shared one detached: it is the target's)."""
        if self.shared:
            return self._shared_rows if self._shared_rows is not None else self.weights[0].detach()
        w = self.weights[k]
        return _on_rows(w, self.rows)

    def _delta(self, k: int, h: Tensor) -> Tensor | None:
        """Head k's LoRA delta [B, M] on its state h [B, H] (None without LoRA)."""
        factors = self.lora[k]
        if factors is None:
            return None
        a, b, s = factors
        return s * F.linear(F.linear(h, a), _on_rows(b, self.rows))

    @torch.inference_mode()
    def step(self, k: int, state: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """One recurrent head: state [P, H] (the previous head's, or the target's hidden state for
        k = 0) and the token before head k [P] -> (head k's state [P, H], logits [P, M] float32)."""
        if not self.recurrent:
            raise ValueError("step() is for recurrent heads; call the heads on the hidden state instead.")
        new = _recurrent_state(self.blocks[k], self.inputs[k], self.embed, state, tokens)  # [P, H]
        logits = F.linear(new, self._projection(k))  # [P, M]
        delta = self._delta(k, new)
        return new, (logits if delta is None else logits + delta).float()

    @torch.inference_mode()
    def logits(self, hidden: Tensor, tokens: Tensor | None = None) -> Tensor:
        """hidden [B, H] (tokens [B, K] for recurrent heads) -> logits [B, K, M] (float32), no autograd."""
        return self(hidden, tokens).float()


class PackedHeads:
    """Inference form of CompiledHeads with a shared projection: frozen copies in the few-row
    layout that is fastest on this device (`specdraft.fast_stack.PackedLinear`, oneDNN on CPU).

    The first ResBlock of every head reads the same hidden state, so their Linears run as one
    [K*H, H] product; the LoRA deltas are folded into the projection as extra input columns:
    logits_k = [W | s_1 B_1 | .. | s_K B_K] [h_k ; 0 .. A_k h_k .. 0], one product for all heads
    (rows restricted to the pruned vocabulary). Same sums as CompiledHeads, re-associated
    (equal up to float rounding). Frozen: re-attach after changing the heads.
    """

    def __init__(self, compiled: CompiledHeads) -> None:
        from specdraft.fast_stack import PackedLinear

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
        w = compiled.weights[0].detach()
        rows = compiled.rows
        w = _on_rows(w, rows)  # [M, H]
        cols, self.lora_a, self.offsets = [w], [], []
        offset = w.shape[1]
        for factors in compiled.lora:
            if factors is None:
                self.lora_a.append(None)
                self.offsets.append(offset)
                continue
            a, b, scale = factors
            b = _on_rows(b.detach(), rows)  # [M, r]
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
    few-row layout (`specdraft.fast_stack.PackedLinear`), the projection restricted to the pruned
    rows and packed once for all heads, each head's LoRA factors pre-gathered and pre-scaled.

    Recurrent heads run one head at a time (K sequential steps), so the shared projection is
    streamed once per step: packing it is most of the drafting cost (measured here, one 8192-row
    step: 1.8 ms unpacked, see benchmarks/RESULTS.md §3h). Same sums as CompiledHeads.step, up to
    float rounding. Frozen: re-attach after changing the heads.
    """

    def __init__(self, compiled: CompiledHeads) -> None:
        from specdraft.fast_stack import PackedLinear

        if not compiled.shared or not compiled.recurrent:
            raise ValueError("PackedRecurrentHeads needs recurrent heads that share the target's projection.")
        self.embed = compiled.embed  # [V, H]
        self.inputs = [PackedLinear(blk.linear.weight, blk.linear.bias) for blk in compiled.inputs]  # [H, 2H]
        self.rest = [[PackedLinear(res.linear.weight, res.linear.bias) for res in head] for head in compiled.blocks]
        self.proj = PackedLinear(compiled._projection(0), None)  # [M, H], shared by every head
        rows = compiled.rows
        self.lora: list[tuple[Tensor, Tensor] | None] = []
        for factors in compiled.lora:
            if factors is None:
                self.lora.append(None)
                continue
            a, b, scale = factors
            b = _on_rows(b.detach(), rows)  # [M, r]
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


def _lora_factors(layer: nn.Module) -> tuple[Tensor, Tensor, float] | None:
    """(A [r, H], B [V, r], scaling) of a PEFT LoRA Linear's active adapter, or None."""
    lora_a = getattr(layer, "lora_A", None)
    if not isinstance(lora_a, nn.ModuleDict) or len(lora_a) == 0:
        return None
    name = next(iter(lora_a.keys()))
    return (
        lora_a[name].weight,
        layer.lora_B[name].weight,
        float(layer.scaling[name]),
    )


class MedusaDrafter:
    """Medusa drafter. `specdraft-generate drafter=medusa` (shipped heads for smollm2-135m).

    heads: adapter directory written by specdraft-train-medusa, or shipped heads: a target alias
        ("smollm2-135m": its Medusa heads) or alias/name ("smollm2-135m/medusa_recurrent": the
        recurrent heads, each told the token drafted before it); None builds fresh heads (zero
        blocks, no LoRA: every head then proposes the target's own next-token guess, for tests).
    num_heads: use the first K heads (None = all that were trained; a fresh set has 3).
    tree: None for a chain, "auto" for the tree grown from the accuracies saved with the heads and
        sized for the target's measured verify-cost curve, an int N for that tree with exactly N
        nodes, or an explicit list of paths (lists of top-k ranks, e.g. [[0], [1], [0, 0]]), at any
        temperature (see the module docstring).
    pruned_vocab: project onto the pruned vocabulary saved with the heads (vocab.json, the one
        they were trained on; `specdraft.vocab`), ~6x cheaper than the full lm_head. Tokens
        outside it are never proposed; verification stays exact either way.
    """

    needs_target_hidden: ClassVar[bool] = True

    def __init__(
        self,
        heads: str | None = "smollm2-135m",
        num_heads: int | None = None,
        tree: str | int | Sequence[Sequence[int]] | None = None,
        pruned_vocab: bool = True,
    ) -> None:
        self.heads_source = heads
        self.pruned_vocab = pruned_vocab
        self.rows: Tensor | None = None  # [M] target ids the heads project onto (None = all)
        self.num_heads = num_heads
        self.tree_spec = tree
        self.model: nn.Module | None = None
        self._compiled: CompiledHeads | None = None
        self._packed: PackedHeads | None = None  # the fast inference form (shared projection)
        self._step: Callable[[int, Tensor, Tensor], tuple[Tensor, Tensor]] | None = None  # recurrent
        self.paths: list[tuple[int, ...]] | None = None
        self._heads_dir: Path | None = None
        self._tree_cost: dict[int, float] | None = None  # {positions: T(n)/T(1)} of the bound target

    # ------------------------------------------------------------------ protocol
    def bind(self, target: TargetModel) -> None:
        """Load the heads onto the target's lm_head (heads attached in memory are kept); a tree
        "auto" is sized for this target's measured verify-cost curve."""
        if self.tree_spec == "auto":
            curve = cached_verify_curve(target, MAX_TREE_NODES)  # T_v(k)/T_v(0), k + 1 positions
            self._tree_cost = {k + 1: c for k, c in enumerate(curve)}
        weight = target.lm_head.weight
        if self._compiled is not None and self._compiled.weights[0] is weight:
            self.paths = load_tree(self.tree_spec, self._heads_dir, len(self._compiled.blocks), self._tree_cost)
            return  # already on this target's lm_head (loaded before, or attached in memory)
        if self.heads_source is None:
            model: nn.Module = MedusaHeads(weight, num_heads=self.num_heads or 3)
        else:
            model = load_heads(self.heads_source, weight, target.model.get_input_embeddings().weight)
        self.attach(model)

    def attach(self, model: nn.Module, rows: Tensor | None = None) -> None:
        """Use an in-memory (optionally PEFT-wrapped) MedusaHeads, e.g. fresh from training.

        rows: [M] pruned vocabulary (target ids) to project onto; by default the heads
        directory's vocab.json when pruned_vocab is on.
        """
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        available = base.num_heads
        k = self.num_heads or available
        if not 1 <= k <= available:
            raise ValueError(f"num_heads must be in [1, {available}] for these heads, got {k}.")
        self.model = model.eval()
        heads_dir = None
        if self.heads_source is not None:
            heads_dir = resolve_heads_dir(self.heads_source)
        self.rows = rows
        if rows is None and self.pruned_vocab and heads_dir is not None and (heads_dir / VOCAB_FILE).is_file():
            from specdraft.vocab import PrunedVocab

            self.rows = PrunedVocab.load(heads_dir / VOCAB_FILE).ids.to(base.lm_heads[0].weight.device)
        self._compiled = CompiledHeads(model, self.rows)
        self._compiled.truncate(k)
        use_packed = self._compiled.shared and not self._compiled.recurrent
        self._packed = PackedHeads(self._compiled) if use_packed else None
        packed_recurrent = self._compiled.shared and self._compiled.recurrent
        # recurrent heads draft one head at a time: the packed step where it applies
        self._step = PackedRecurrentHeads(self._compiled).step if packed_recurrent else self._compiled.step
        self._heads_dir = heads_dir
        self.paths = load_tree(self.tree_spec, heads_dir, max_depth=k, cost=self._tree_cost)

    def reset(self) -> None:
        """No per-prompt state: the heads only read the target's hidden state."""

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        """Nothing to roll back."""

    def head_logits(self, hidden: Tensor) -> Tensor:
        """hidden [B, H] -> logits [B, K, M] of the heads in use (M = len(rows) or V)."""
        if self._compiled is None:
            raise ValueError("MedusaDrafter is not bound to a target; call bind(target) first.")
        if self._compiled.recurrent:
            raise ValueError("recurrent heads depend on the drafted tokens: use propose().")
        if self._packed is not None:
            return self._packed(hidden)
        return self._compiled.logits(hidden)

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, num_tokens: int) -> Draft:
        hidden = ctx.target_hidden  # [B, H] or None
        empty = torch.empty((ctx.token_ids.shape[0], 0), dtype=torch.long, device=ctx.token_ids.device)
        if hidden is None or num_tokens <= 0:
            return Draft(token_ids=empty)
        if hidden.shape[0] != 1:
            raise NotImplementedError("MedusaDrafter supports batch size 1.")
        if self._compiled is not None and self._compiled.recurrent:
            return self._propose_recurrent(ctx, hidden, num_tokens)
        logits = self.head_logits(hidden)  # [1, K, M]
        if self.paths:  # candidates = top-k ranks; verified losslessly at any temperature (specdraft.tree)
            return tree_draft(self.paths, logits[0], num_tokens, self.rows)
        logits = logits[:, :num_tokens]  # [1, K', M]
        if ctx.sampling.greedy:
            return Draft(token_ids=self._to_target(logits.argmax(dim=-1)))
        q = warp(logits, ctx.sampling)  # [1, K', M]
        tokens = self._to_target(sample(q, ctx.generator).to(logits.device))  # [1, K']
        if self.rows is not None:  # q over the target's ids: zero outside the pruned vocabulary
            q = q.new_zeros(q.shape[:-1] + (self.model_vocab,)).index_copy_(-1, self.rows, q)
        return Draft(token_ids=tokens, probs=q)

    def _propose_recurrent(self, ctx: DraftContext, hidden: Tensor, num_tokens: int) -> Draft:
        """Recurrent heads: each head is told the token drafted before it (K sequential steps)."""
        compiled = self._compiled
        assert compiled is not None and self._step is not None
        newest = ctx.token_ids[:, -1]  # [1] y_0
        if self.paths:  # a node's children come from its own path's head state
            return path_tree_draft(self.paths, self._step, hidden, newest, num_tokens, self.rows)
        state, token = hidden, newest
        tokens, qs = [], []
        for k in range(min(num_tokens, len(compiled.blocks))):
            state, logits = self._step(k, state, token)  # [1, H], [1, M]
            if ctx.sampling.greedy:
                index = logits.argmax(dim=-1)  # [1]
            else:
                q = warp(logits, ctx.sampling)  # [1, M] q of this head given the draft before it
                index = sample(q, ctx.generator).to(logits.device)
                qs.append(q)
            token = self._to_target(index)
            tokens.append(token)
        if not tokens:
            return Draft(token_ids=ctx.token_ids.new_empty((1, 0)))
        ids = torch.stack(tokens, dim=1)  # [1, K']
        if ctx.sampling.greedy:
            return Draft(token_ids=ids)
        q = torch.stack(qs, dim=1)  # [1, K', M]
        if self.rows is not None:  # q over the target's ids: zero outside the pruned vocabulary
            q = q.new_zeros(q.shape[:-1] + (self.model_vocab,)).index_copy_(-1, self.rows, q)
        return Draft(token_ids=ids, probs=q)

    @property
    def model_vocab(self) -> int:
        """V, the target's vocabulary size."""
        assert self._compiled is not None
        return int(self._compiled.weights[0].shape[0])

    def _to_target(self, index: Tensor) -> Tensor:
        """Indices into the projected rows -> target token ids."""
        return index if self.rows is None else self.rows[index]
