"""The Medusa-heads artifact: K small heads on the target's last hidden state, stored as a PEFT adapter.

Head k (0-based) reads the target's post-norm hidden state h at the position that produced the
newest token x_n and guesses x_{n+k+1}. A head is

    h_k = ResBlock^N(h),  ResBlock(x) = x + SiLU(W x + b)   (W, b zero-initialised)
    logits_k = lm_head(h_k) + (alpha / r) * B_k A_k h_k      (target's tied lm_head, frozen; LoRA delta)

so a fresh head (zero blocks, B_k = 0) reproduces the target's own logits exactly.

Recurrent heads (`recurrent=True`, Hydra / ReDrafter style): head k also reads the token drafted
before it. With s_{-1} = h and y_0 = x_n (the newest token), y_k = the draft token at depth k,

    s_k = ResBlock^N(TokenBlock_k(s_{k-1}, y_k)),  TokenBlock(s, y) = s + SiLU(W [s ; E y] + b)
    logits_k = lm_head(s_k) + (alpha / r) * B_k A_k s_k

(E = the target's input embedding, frozen; W, b zero-initialised, so a fresh recurrent head also
reproduces the lm_head). The option `full_projection` gives each head its own trainable copy of the
projection instead of the shared lm_head plus LoRA (the original Medusa-2 layout).

On disk (written by `specdraft-train-medusa`, `save_heads`), a directory with

    adapter_config.json, adapter_model.safetensors   the PEFT adapter (blocks + LoRA factors)
    medusa_config.json                              the heads' architecture (`MedusaHeads.architecture`)
                                                    and the target they were trained for ("target_model",
                                                    `specdraft.formats.target_info`)
    accuracy.json                                   held-out per-head rank accuracies (choose the tree)
    pruned_vocab.json                               optional pruned vocabulary (`specdraft.vocab.VOCAB_FILE`)
    provenance.json, README.md                      how the heads were made

`load_heads` rebuilds `MedusaHeads` on the target's own lm_head (and input embedding), so no weight
of the target is stored twice; `check_heads_target` first checks that the target is one the heads
were trained for. Used by `drafters.medusa` (loading) and `specdraft.train.medusa` (saving).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdraft.formats.target_info import (
    HEADS_KEYS,
    RECORD_KEY,
    check_target,
    from_shapes,
    read_record,
)
from specdraft.shipped import artifact_label, require_artifact
from specdraft.vocab import VOCAB_FILE

if TYPE_CHECKING:
    from specdraft.target import TargetModel

HEADS_CONFIG = "medusa_config.json"  # the heads' architecture, next to the PEFT adapter
ADAPTER_CONFIG = "adapter_config.json"  # written by PEFT's save_pretrained
WEIGHTS_FILE = "adapter_model.safetensors"  # written by PEFT's save_pretrained
ACCURACY_FILE = "accuracy.json"  # per-head rank accuracies on held-out data (the tree is grown from them)
DEFAULT_ARTIFACT = "medusa"  # a bare target alias names <alias>/medusa (specdraft.shipped)


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
        return head_states(self.blocks, list(self.inputs), self.embed_weight, hidden, tokens)

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


def base_heads(model: nn.Module) -> MedusaHeads:
    """The MedusaHeads of a plain or PEFT-wrapped heads module."""
    return model if isinstance(model, MedusaHeads) else model.get_base_model()


def head_states(blocks: Sequence[nn.Module], inputs: Sequence[nn.Module], embed: Tensor | None,
                hidden: Tensor, tokens: Tensor | None) -> Tensor:
    """Every head's state [..., K, H] from hidden [..., H]: independent heads, or the recurrence
    s_k = blocks_k(inputs_k(s_{k-1}, E y_k)) when `inputs` is non-empty (tokens [..., K])."""
    if not inputs:
        return torch.stack([blk(hidden) for blk in blocks], dim=-2)
    if tokens is None or embed is None:
        raise ValueError("recurrent heads need the tokens before each head (tokens [..., K]).")
    states, state = [], hidden
    for k, blk in enumerate(blocks):
        state = recurrent_state(blk, inputs[k], embed, state, tokens[..., k])
        states.append(state)
    return torch.stack(states, dim=-2)


def recurrent_state(block: nn.Module, token_block: nn.Module, embed: Tensor, state: Tensor,
                    tokens: Tensor) -> Tensor:
    """One recurrent head's state [..., H] from the previous state and the tokens before it [...]."""
    return block(token_block(state, F.embedding(tokens, embed)))


# ------------------------------------------------------------------------------- files
def save_heads(peft_model: nn.Module, out_dir: str | Path, provenance: Mapping[str, Any],
               dtype: torch.dtype = torch.float32, target: Mapping[str, Any] | None = None) -> None:
    """Save the PEFT adapter (adapter_config.json + adapter_model.safetensors), the heads'
    architecture (with `target`, the record of the target they were trained for:
    `specdraft.formats.target_info.target_info`) and a JSON of how they were made. dtype: the stored
    weights' (float16 halves the file; loading casts back to the heads' float32)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out))
    if dtype != torch.float32:
        from safetensors.torch import load_file, save_file

        weights = out / WEIGHTS_FILE
        stored = {k: v.to(dtype) if v.is_floating_point() else v for k, v in load_file(weights).items()}
        save_file(stored, weights, metadata={"format": "pt"})
        weights.chmod(0o644)
    config: dict[str, Any] = dict(base_heads(peft_model).architecture())
    if target is not None:
        config[RECORD_KEY] = dict(target)
    (out / HEADS_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    (out / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
    kind = "recurrent Medusa heads (head k also reads the token before it)" if config.get("recurrent") else "Medusa heads"
    (out / "README.md").write_text(  # replaces PEFT's generic model card
        f"# {config['num_heads']} {kind}, PEFT adapter\n\n"
        "Load with `drafters.medusa.MedusaDrafter(heads=<this dir>)` "
        "or `specdraft.formats.medusa_heads.load_heads(<this dir>, target.lm_head.weight, "
        "target.model.get_input_embeddings().weight)`; made by "
        f"`{provenance.get('command', 'specdraft-train-medusa')}` (details in provenance.json).\n"
    )


def resolve_heads_dir(heads: str | Path) -> Path:
    """An adapter directory, or shipped heads: a target alias ("smollm2-135m": its Medusa heads)
    or `<alias>/<name>` ("smollm2-135m/medusa_recurrent"); see `specdraft.shipped`."""
    path = require_artifact(heads, "Medusa heads", default=DEFAULT_ARTIFACT)
    if not (path / HEADS_CONFIG).is_file() or not (path / ADAPTER_CONFIG).is_file():
        raise ValueError(
            f"no Medusa heads at {str(heads)!r} ({path}): pass a directory written by "
            "specdraft-train-medusa (adapter_config.json + medusa_config.json) or a target alias with "
            "shipped heads (e.g. 'smollm2-135m' or 'smollm2-135m/medusa_recurrent')."
        )
    return path


def load_heads(heads: str | Path, lm_head_weight: Tensor, embed_weight: Tensor | None = None) -> nn.Module:
    """Rebuild MedusaHeads on the target's lm_head (and input embedding, for recurrent heads) and
    load a saved PEFT adapter into them (the shared projection's LoRA delta stays a separate
    low-rank term). Returns the PEFT-wrapped heads, in eval mode."""
    from peft import PeftModel

    path = resolve_heads_dir(heads)
    arch = {k: v for k, v in json.loads((path / HEADS_CONFIG).read_text()).items() if k != RECORD_KEY}
    base = MedusaHeads(lm_head_weight, embed_weight=embed_weight, **arch)
    peft_model = PeftModel.from_pretrained(base, str(path))
    peft_model.eval()
    return peft_model


def heads_record(heads_dir: str | Path) -> dict[str, Any]:
    """The target saved heads were trained for: their medusa_config.json record, or (heads saved
    before records existed) the hidden and vocabulary sizes of their projection weights."""
    d = Path(heads_dir)
    return read_record(d / HEADS_CONFIG) or from_shapes(
        d / WEIGHTS_FILE, hidden=lambda name: "lm_heads." in name and "lora_B" not in name,
        vocab=lambda name: "lm_heads." in name and "lora_A" not in name, vocab_file=d / VOCAB_FILE)


def check_heads_target(heads: str | Path, target: TargetModel) -> None:
    """A ValueError naming both targets when `target` is not one the heads were trained for
    (hidden size, vocabulary), before any weight is loaded."""
    path = resolve_heads_dir(heads)
    check_target(heads_record(path), target, artifact_label(path), HEADS_KEYS,
                 fix="Use heads trained for this target (specdraft-train-medusa target=...).")


@dataclass(frozen=True)
class HeadAccuracy:
    """Held-out accuracies of the heads, what a candidate tree is grown from.

    rank_accuracy: [K][R] P(the target's token is head k's rank-r candidate).
    label_ranks: [P, K] per held-out position, the rank of the target's token in each head's list
        (R = not in the top R), or None; their joint distribution captures correlated heads.
    """

    rank_accuracy: list[list[float]]
    label_ranks: Tensor | None


def accuracy_record(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """accuracy.json's content from per-held-out-set evaluations (each with "rank_accuracy" and
    "label_ranks", as `specdraft.train.medusa.evaluate` returns them)."""
    return {"rank_accuracy": {n: r["rank_accuracy"] for n, r in results.items()},
            "label_ranks": {n: r["label_ranks"] for n, r in results.items()}}


def save_accuracy(out_dir: str | Path, results: Mapping[str, Mapping[str, Any]]) -> None:
    """Write accuracy.json (`accuracy_record`) next to the heads."""
    (Path(out_dir) / ACCURACY_FILE).write_text(json.dumps(accuracy_record(results)) + "\n")


def load_accuracy(heads_dir: Path | None, max_depth: int) -> HeadAccuracy | None:
    """The first `max_depth` heads' accuracies saved with the heads (the "selfgen" held-out set if
    there is one, else the first), or None when the directory has no accuracy.json."""
    if heads_dir is None or not (Path(heads_dir) / ACCURACY_FILE).is_file():
        return None
    acc = json.loads((Path(heads_dir) / ACCURACY_FILE).read_text())
    name = "selfgen" if "selfgen" in acc["rank_accuracy"] else next(iter(acc["rank_accuracy"]))
    ranks = acc.get("label_ranks", {}).get(name)
    label_ranks = torch.tensor(ranks)[:, :max_depth] if ranks else None
    return HeadAccuracy(rank_accuracy=acc["rank_accuracy"][name][:max_depth], label_ranks=label_ranks)
