"""Early-exit self-drafting (LayerSkip style): the draft is the target's own first E layers.

Each draft token runs through the target's first `exit_layer` decoder layers, then an optional
trained exit adapter (`specdraft.train.early_exit.ExitAdapter`), then the target's final norm and
lm_head. No second model: the weights are the target's.

Shared KV cache: the draft's K/V for layers < E are the target's own cache entries
(`TargetModel.forward_prefix`), and when the target verifies [newest] + draft it reuses them and the
layer-E hidden states, running only layers >= E for the drafted positions. On rejection the
target's `crop` rolls back both parts. `share_kv=False` discards the draft's entries before the
verify forward instead (the recompute baseline the benchmark compares against).

A context adapter (`ExitAdapter(context=True)`) also reads the final-layer hidden state of the
position before each draft position: the target's own (`DraftContext.target_hidden`) for the first
draft token, the exit's own output for the next ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch

from specdraft.protocol import Draft, DraftContext
from specdraft.sampling import draw, warp
from specdraft.exit_adapter import VOCAB_FILE, ExitAdapter, exit_head, exit_hidden, load_adapter
from specdraft.vocab import PrunedVocab

if TYPE_CHECKING:
    from specdraft.target import TargetModel

ARTIFACTS = Path(__file__).resolve().parent.parent / "specdraft" / "artifacts"


def resolve_adapter(adapter: str | Path | None) -> Path | None:
    """None, an adapter directory, or a target alias whose shipped adapter to use
    (specdraft/artifacts/<alias>/early_exit)."""
    if adapter is None:
        return None
    path = Path(adapter).expanduser()
    if path.is_dir():
        return path
    shipped = ARTIFACTS / str(adapter) / "early_exit"
    if shipped.is_dir():
        return shipped
    raise ValueError(
        f"exit adapter {str(adapter)!r} is neither a directory nor a target alias with a shipped "
        f"adapter under {ARTIFACTS}; pass adapter=null or train one with specdraft-train-early-exit."
    )


class EarlyExitDrafter:
    """Draft with the target's first `exit_layer` layers (+ adapter) -> final norm -> lm_head.

    `specdraft-generate drafter=early_exit drafter.exit_layer=6 drafter.adapter=smollm2-135m`

    exit_layer: E, 1 <= E <= number of layers (E = all layers, no adapter: q == p, every draft
        token is accepted). None with an adapter: the adapter's own exit layer.
    adapter: None, an adapter directory, or a target alias with a shipped adapter.
    share_kv: reuse the draft's layers < E when the target verifies (False: recompute them).
    draft_vocab: optional PrunedVocab JSON: the exit projects onto that subset of ids only (q is
        zero elsewhere, so verification stays exact) - the full lm_head is most of a shallow
        exit's cost. Default: the vocabulary the adapter was trained on, if any.
    """

    needs_target_hidden: ClassVar[bool] = True  # read by context adapters (a slice of the verify output)

    def __init__(
        self,
        exit_layer: int | None = None,
        adapter: str | Path | None = None,
        share_kv: bool = True,
        draft_vocab: str | Path | None = None,
    ) -> None:
        self.adapter: ExitAdapter | None = None
        adapter_dir = resolve_adapter(adapter)
        if adapter_dir is not None:
            self.adapter, meta = load_adapter(adapter_dir)
            trained_at = int(meta["exit_layer"])
            if exit_layer is not None and exit_layer != trained_at:
                raise ValueError(
                    f"the adapter in {str(adapter_dir)!r} was trained at exit_layer={trained_at}, not "
                    f"{exit_layer}; set drafter.exit_layer={trained_at} or drafter.adapter=null."
                )
            exit_layer = trained_at
        if exit_layer is None or exit_layer < 1:
            raise ValueError(f"exit_layer must be an integer >= 1, got {exit_layer!r}.")
        self.exit_layer = int(exit_layer)
        self.share_kv = share_kv
        if draft_vocab is None and adapter_dir is not None and (adapter_dir / VOCAB_FILE).is_file():
            draft_vocab = adapter_dir / VOCAB_FILE  # the vocabulary the adapter was trained on
        self.vocab = PrunedVocab.load(draft_vocab) if draft_vocab is not None else None
        self._head: torch.Tensor | None = None  # [M, H] pruned lm_head rows
        self._target: TargetModel | None = None

    def bind(self, target: TargetModel) -> None:
        """Check the split point and the adapter's size against the target; move the adapter."""
        if not target.supports_layer_split:
            raise ValueError("early exit needs a Llama-style target (embed_tokens/layers/norm/rotary_emb).")
        if self.exit_layer > target.num_layers:
            raise ValueError(
                f"exit_layer={self.exit_layer} but the target has {target.num_layers} layers; "
                f"choose 1 <= exit_layer <= {target.num_layers}."
            )
        if self.adapter is not None:
            if self.adapter.hidden_size != target.hidden_size:
                raise ValueError(
                    f"the exit adapter expects hidden size {self.adapter.hidden_size}, the target has "
                    f"{target.hidden_size}; use an adapter trained for this target."
                )
            self.adapter.to(device=target.device, dtype=target.lm_head.weight.dtype)
        if self.vocab is not None:
            if self.vocab.vocab_size != target.vocab_size:
                raise ValueError(
                    f"draft_vocab was built for a vocabulary of {self.vocab.vocab_size}, the target has "
                    f"{target.vocab_size}; rebuild it for this target."
                )
            self.vocab = self.vocab.to(target.device)
            self._head = self.vocab.head(target.lm_head.weight)
        self._target = target

    def reset(self) -> None:
        """No own state: the shared cache lives in the target."""

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        """Nothing to roll back: the target's crop already cut the shared cache."""

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, num_tokens: int) -> Draft:
        """Run [newest], d1, ..., d_{K-1} one at a time through layers < E of the target."""
        target = self._target
        if target is None:
            raise ValueError("EarlyExitDrafter.propose called before bind(target).")
        if ctx.token_ids.shape[0] != 1:
            raise NotImplementedError("EarlyExitDrafter supports batch size 1.")
        if target.cache_length != ctx.token_ids.shape[1] - 1:
            raise ValueError(
                f"the target caches {target.cache_length} positions but the context has "
                f"{ctx.token_ids.shape[1]} tokens; early exit expects all but the newest cached."
            )
        token = ctx.token_ids[:, -1:]  # [1, 1]
        prev = None
        if self.adapter is not None and self.adapter.context:  # final hidden before the newest token
            prev = ctx.target_hidden if ctx.target_hidden is not None else target.lm_head.weight.new_zeros(
                (1, target.hidden_size))  # [1, H]; zeros: unknown (a one-token prompt)
        tokens, probs = [], []
        for _ in range(num_tokens):
            hidden = target.forward_prefix(token.to(target.device), self.exit_layer)  # [1, 1, H]
            hidden = exit_hidden(target, hidden[:, -1], self.adapter, prev)  # [1, H] post-norm
            logits = exit_head(target, hidden, self._head, inference=True)  # [1, V|M]
            prev = hidden  # the next draft position's context: the exit's own feature
            q = warp(logits, ctx.sampling)
            token = draw(q, ctx.sampling, ctx.generator)[:, None]  # [1, 1]
            if self.vocab is not None:
                q, token = self.vocab.expand(q), self.vocab.to_target(token)
            tokens.append(token)
            probs.append(q)
        if not self.share_kv:
            target.discard_prefix()
        return Draft(token_ids=torch.cat(tokens, dim=1), probs=torch.stack(probs, dim=1))
