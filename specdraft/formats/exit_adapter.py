"""The exit-adapter artifact format of early-exit drafting: the adapter module (a small residual MLP
on layer E's hidden state), its files, and the exit's hidden states and logits. Used by
`drafters.early_exit` (drafting) and `specdraft.train.early_exit` (training and saving).

An adapter directory holds `adapter.safetensors` (weights), `adapter_config.json` (constructor
arguments, the exit layer, the target it was trained for under "target_model"
(`specdraft.formats.target_info`) and how it was trained) and, when it was trained on a pruned
vocabulary, `specdraft.vocab.VOCAB_FILE` (pruned_vocab.json).

A context adapter (`context=True`) also reads the final-layer (post-norm) hidden state of the
position before: for the first draft token of a round that is the target's own, free from the
verify forward that produced the newest token (`DraftContext.target_hidden`, EAGLE's feature); for
the next draft tokens it is the exit's own post-norm output at the previous draft position.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from specdraft.formats.target_info import EXIT_KEYS, RECORD_KEY, check_target, pruned_vocab_record
from specdraft.shipped import artifact_label
from specdraft.vocab import VOCAB_FILE

if TYPE_CHECKING:
    from specdraft.target import TargetModel

ADAPTER_FILE = "adapter.safetensors"
CONFIG_FILE = "adapter_config.json"


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMS norm of x [..., H] in float32 with gain weight [H], back in x's dtype."""
    y = x.float()
    return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps) * weight).to(x.dtype)


class ExitAdapter(nn.Module):
    """Residual MLP blocks on the exit layer's hidden state: h + W2 silu(W1 rmsnorm(h)), repeated.
    With context=True every block reads [rmsnorm(h); rmsnorm(prev)] (prev: the final-layer
    post-norm hidden state of the position before).

    W2 starts at zero, so an untrained adapter is exactly the identity (the plain early exit).
    """

    def __init__(
        self, hidden_size: int, width: int, num_blocks: int = 1, eps: float = 1e-5, context: bool = False,
    ) -> None:
        super().__init__()
        if hidden_size <= 0 or width <= 0 or num_blocks <= 0:
            raise ValueError(
                f"ExitAdapter needs positive hidden_size, width and num_blocks, got "
                f"{hidden_size}, {width}, {num_blocks}."
            )
        self.hidden_size, self.width, self.num_blocks, self.eps = hidden_size, width, num_blocks, eps
        self.context = bool(context)
        inputs = 2 * hidden_size if context else hidden_size
        self.norms = nn.ParameterList([nn.Parameter(torch.ones(hidden_size)) for _ in range(num_blocks)])
        self.context_norms = nn.ParameterList(
            [nn.Parameter(torch.ones(hidden_size)) for _ in range(num_blocks if context else 0)]
        )
        self.up = nn.ModuleList([nn.Linear(inputs, width, bias=False) for _ in range(num_blocks)])
        self.down = nn.ModuleList([nn.Linear(width, hidden_size, bias=False) for _ in range(num_blocks)])
        for down in self.down:
            nn.init.zeros_(down.weight)

    def forward(self, hidden: Tensor, prev: Tensor | None = None) -> Tensor:
        """hidden [..., H] (+ prev [..., H] for a context adapter; zeros = unknown) -> [..., H]."""
        if self.context and prev is None:
            raise ValueError(
                "this exit adapter was trained with context=True and needs `prev`, the final-layer "
                "hidden state of the position before (zeros when unknown)."
            )
        for i, (norm, up, down) in enumerate(zip(self.norms, self.up, self.down)):
            x = _rms(hidden, norm, self.eps)
            if self.context:
                x = torch.cat([x, _rms(prev.to(hidden.dtype), self.context_norms[i], self.eps)], dim=-1)
            hidden = hidden + down(nn.functional.silu(up(x)))
        return hidden

    def spec(self) -> dict:
        """Constructor arguments (saved next to the weights)."""
        return {"hidden_size": self.hidden_size, "width": self.width,
                "num_blocks": self.num_blocks, "eps": self.eps, "context": self.context}


def save_adapter(adapter: ExitAdapter, directory: str | Path, metadata: dict) -> Path:
    """Write adapter.safetensors + adapter_config.json (spec + how it was made) into directory."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in adapter.state_dict().items()}
    save_file(state, str(out / ADAPTER_FILE))
    (out / CONFIG_FILE).write_text(json.dumps({"adapter": adapter.spec(), **metadata}, indent=2) + "\n")
    return out


def load_adapter(directory: str | Path) -> tuple[ExitAdapter, dict]:
    """Load an adapter directory written by `save_adapter`; returns (adapter, its JSON metadata)."""
    path = Path(directory)
    if not (path / ADAPTER_FILE).is_file() or not (path / CONFIG_FILE).is_file():
        raise ValueError(
            f"{str(path)!r} is not an exit-adapter directory (needs {ADAPTER_FILE} and "
            f"{CONFIG_FILE}); train one with `specdraft-train-early-exit`."
        )
    meta = json.loads((path / CONFIG_FILE).read_text())
    adapter = ExitAdapter(**meta["adapter"])
    adapter.load_state_dict(load_file(str(path / ADAPTER_FILE)))
    return adapter.eval(), meta


def adapter_record(directory: str | Path, meta: dict) -> dict:
    """The target an adapter was trained for: its adapter_config.json record, or (an adapter saved
    before records existed) its hidden size and its pruned vocabulary's size."""
    if isinstance(meta.get(RECORD_KEY), dict):
        return dict(meta[RECORD_KEY])
    return {"hidden_size": int(meta["adapter"]["hidden_size"]), **pruned_vocab_record(Path(directory) / VOCAB_FILE)}


def check_adapter_target(directory: str | Path, meta: dict, target: TargetModel) -> None:
    """A ValueError naming both targets when `target` is not one the adapter was trained for
    (hidden size, vocabulary, number of layers)."""
    check_target(adapter_record(directory, meta), target, artifact_label(directory),
                 EXIT_KEYS, fix="Use an adapter trained for this target (specdraft-train-early-exit target=...).")


def exit_hidden(target: TargetModel, hidden: Tensor, adapter: ExitAdapter | None = None,
                prev: Tensor | None = None) -> Tensor:
    """Post-norm hidden [..., H] of the early exit: (adapter, reading prev if it is a context
    adapter) -> target's final norm. This is also the next draft position's `prev`."""
    if adapter is not None:
        hidden = adapter(hidden, prev) if adapter.context else adapter(hidden)
    return target.decoder.norm(hidden)


def exit_logits(
    target: TargetModel, hidden: Tensor, adapter: ExitAdapter | None = None, head: Tensor | None = None,
    inference: bool = False, prev: Tensor | None = None,
) -> Tensor:
    """Logits [..., V] of the early exit: (adapter) -> target's final norm -> target's lm_head, or
    [..., M] onto the rows `head` [M, H] of a pruned vocabulary. inference=True computes the
    full-vocabulary head on the target's fast path (`TargetModel.logits`, no autograd). prev: the
    context adapter's second input (see `exit_hidden`)."""
    return exit_head(target, exit_hidden(target, hidden, adapter, prev), head, inference)


def exit_head(target: TargetModel, hidden: Tensor, head: Tensor | None = None, inference: bool = False) -> Tensor:
    """Logits of post-norm exit hidden states [..., H]: onto `head` [M, H] or the full lm_head."""
    if head is not None:
        return (hidden @ head.T).float()
    return target.logits(hidden) if inference else target.lm_head(hidden).float()


