"""Early-exit self-drafting (LayerSkip style): the draft is the target's own first E layers.

Each draft token runs through the target's first `exit_layer` decoder layers, then an optional
trained exit adapter (`specdraft.formats.exit_adapter.ExitAdapter`), then the target's final norm
and lm_head. No second model: the weights are the target's. Tokens are drafted by the shared loop
(`specdraft.draft_loop.draft_autoregressively`); only the next-token logits are this drafter's
(`ExitStep`).

Shared KV cache: the draft's K/V for layers < E are the target's own cache entries
(`TargetModel.forward_prefix`), and when the target verifies [newest] + draft it reuses them and the
layer-E hidden states, running only layers >= E for the drafted positions. On rejection the
target's `crop` rolls back both parts. `share_kv=False` discards the draft's entries before the
verify forward instead (the recompute baseline the benchmark compares against).

A context adapter (`ExitAdapter(context=True)`) also reads the final-layer hidden state of the
position before each draft position: the target's own (`DraftContext.target_hidden`) for the first
draft token, the exit's own output for the next ones.

Copy first (`copy_ngram`, on by default, `drafters.copy_first`): a round whose last tokens occurred
earlier in the context drafts what followed them there instead of running the exit.

Batch size 1 only (`batched = False`): the shared cache is one prefix of layers < E that the draft
and the verify forward share, and `TargetModel.forward_prefix` runs it for one sequence, not on
ragged rows; decode a batch's prompts one by one.

    EarlyExitDrafter()                                  # the shipped adapter for smollm2-135m (layer 6)
    EarlyExitDrafter(exit_layer=4, adapter=None)        # the plain exit after layer 4, no adapter
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from drafters.copy_first import CopyFirst
from specdraft.draft_loop import draft_autoregressively
from specdraft.formats.exit_adapter import (
    ExitAdapter,
    check_adapter_target,
    exit_head,
    exit_hidden,
    load_adapter,
)
from specdraft.protocol import Draft, DraftContext
from specdraft.shipped import require_artifact
from specdraft.vocab import AUTO, PrunedVocab, resolve_pruned_vocab

if TYPE_CHECKING:
    from specdraft.target import TargetModel


def resolve_adapter(adapter: str | Path | None) -> Path | None:
    """None (no adapter), or the exit-adapter directory `adapter` names: a directory, a shipped
    name (`smollm2-135m/early_exit`) or a bare target alias (`smollm2-135m`)."""
    if adapter is None:
        return None
    return require_artifact(adapter, "exit adapter", default="early_exit")


class ExitStep:
    """The next-token logits of one round of early-exit drafting: tokens -> the target's layers < E
    (their K/V go into the target's cache) -> adapter -> final norm -> (pruned) lm_head.

    prev: the context adapter's second input for the next position, [1, H] post-norm: the
    target's own final hidden state before the round's first token, then the exit's own output.
    """

    def __init__(
        self, target: TargetModel, exit_layer: int, adapter: ExitAdapter | None, head: Tensor | None,
        prev: Tensor | None,
    ) -> None:
        self.target, self.exit_layer, self.adapter, self.head = target, exit_layer, adapter, head
        self.prev = prev

    def __call__(self, feed: Tensor) -> Tensor:
        """feed [1, n] after the cached positions -> logits [1, M or V] for the token after them."""
        target = self.target
        hidden = target.forward_prefix(feed.to(target.device), self.exit_layer)  # [1, n, H] layer E output
        if self.adapter is not None and self.adapter.context:
            for i in range(hidden.shape[1]):  # each position reads the exit's output at the one before
                self.prev = exit_hidden(target, hidden[:, i], self.adapter, self.prev)  # [1, H] post-norm
            out = self.prev
        else:
            out = exit_hidden(target, hidden[:, -1], self.adapter)  # [1, H] post-norm
        return exit_head(target, out, self.head, inference=True)  # [1, M or V]


class EarlyExitDrafter:
    """Draft with the target's first `exit_layer` layers (+ adapter) -> final norm -> lm_head.

    `specdraft-generate drafter=early_exit drafter.adapter=null drafter.exit_layer=4`

    exit_layer: E, 1 <= E <= number of layers (E = all layers, no adapter: q == p, every draft
        token is accepted). None: the adapter's own exit layer (required without an adapter).
    adapter: None (no adapter), an adapter directory, a shipped name (`smollm2-135m/early_exit`)
        or a target alias with a shipped adapter (`smollm2-135m`, the default).
    share_kv: reuse the draft's layers < E when the target verifies (False: recompute them).
    pruned_vocab: "auto" = the subset the adapter was trained on, if it saved one (else the full
        vocabulary); None = the full vocabulary; a path to a `PrunedVocab` JSON; or a `PrunedVocab`.
        The exit then projects onto that subset of ids only (q is zero elsewhere, so verification
        stays exact): the full lm_head is most of a shallow exit's cost.
    copy_ngram: None = the exit alone; else a round whose last copy_ngram..copy_max_ngram tokens
        occurred earlier in the context drafts what followed them there (`drafters.copy_first`).
    confidence_threshold: end an exit round's draft after a token whose draft probability is below
        it (`specdraft.draft_loop`; transformers' `assistant_confidence_threshold`); None = always
        draft the K asked for.

    Batch size 1 only: the shared layer-< E cache (`TargetModel.forward_prefix`) is one sequence's.
    """

    needs_target_hidden: ClassVar[bool] = True  # read by context adapters (a slice of the verify output)
    feature_layers: tuple[int, ...] = ()
    hf_counterpart: ClassVar[str | None] = "hf_early_exit"  # transformers' assistant_early_exit
    verify_curve_tokens: int = 0
    sizes_own_drafts: ClassVar[bool] = False
    batched: ClassVar[bool] = False  # the shared prefix cache is one sequence's (module docstring)

    def __init__(
        self,
        exit_layer: int | None = None,
        adapter: str | Path | None = "smollm2-135m",
        share_kv: bool = True,
        pruned_vocab: str | Path | PrunedVocab | None = AUTO,
        copy_ngram: int | None = 2,
        copy_max_ngram: int = 4,
        confidence_threshold: float | None = None,
    ) -> None:
        if confidence_threshold is not None and not 0.0 < confidence_threshold < 1.0:
            raise ValueError(f"confidence_threshold must be in (0, 1) or null (always draft K), got {confidence_threshold}.")
        self.confidence_threshold = confidence_threshold
        self.copy_ngram, self.copy_max_ngram = copy_ngram, copy_max_ngram
        self._copy = CopyFirst(copy_ngram, copy_max_ngram)
        self.draft_sources: tuple[str, ...] = self._copy.sources
        self.adapter: ExitAdapter | None = None
        self.adapter_meta: dict = {}  # adapter_config.json (the target it was trained for, how)
        self.adapter_dir = resolve_adapter(adapter)
        if self.adapter_dir is not None:
            self.adapter, meta = load_adapter(self.adapter_dir)
            self.adapter_meta = meta
            trained_at = int(meta["exit_layer"])
            if exit_layer is not None and exit_layer != trained_at:
                raise ValueError(
                    f"the adapter in {str(self.adapter_dir)!r} was trained at exit_layer={trained_at}, not "
                    f"{exit_layer}; set drafter.exit_layer={trained_at} (or null) or drafter.adapter=null."
                )
            exit_layer = trained_at
        if exit_layer is None or exit_layer < 1:
            raise ValueError(
                f"exit_layer must be an integer >= 1, got {exit_layer!r}; without an adapter "
                "(adapter=null) set it, e.g. drafter.exit_layer=4."
            )
        self.exit_layer = int(exit_layer)
        self.share_kv = share_kv
        self.pruned_vocab_spec = pruned_vocab
        self.vocab: PrunedVocab | None = None  # resolved in bind, where the target's vocabulary is known
        self._head: Tensor | None = None  # [M, H] pruned lm_head rows
        self._target: TargetModel | None = None

    def hf_peer_kwargs(self) -> dict[str, int]:
        """The arguments of the `hf_counterpart` "hf_early_exit" (`specdraft.bench.HFCounterpart`):
        transformers' self-speculative `generate(..., assistant_early_exit=<exit layer>)`."""
        return {"assistant_early_exit": self.exit_layer}

    def bind(self, target: TargetModel) -> None:
        """Check the target (the one the adapter was trained for, the split point); move the adapter."""
        if not target.supports_layer_split:
            raise ValueError("early exit needs a Llama-style target (embed_tokens/layers/norm/rotary_emb).")
        if self.adapter_dir is not None:
            check_adapter_target(self.adapter_dir, self.adapter_meta, target)
        if self.exit_layer > target.num_layers:
            raise ValueError(
                f"exit_layer={self.exit_layer} but the target has {target.num_layers} layers; "
                f"choose 1 <= exit_layer <= {target.num_layers}."
            )
        if self.adapter is not None:
            self.adapter.to(device=target.device, dtype=target.lm_head.weight.dtype)
        vocab = resolve_pruned_vocab(self.pruned_vocab_spec, self.adapter_dir, target.vocab_size)
        self.vocab = vocab.to(target.device) if vocab is not None else None
        self._head = self.vocab.head(target.lm_head.weight) if self.vocab is not None else None
        self._target = target

    def reset(self) -> None:
        """The shared cache lives in the target; the copy index starts over."""
        self._copy.reset()

    def learn(self, token_ids: torch.Tensor, prompt_len: int) -> dict[str, Any]:
        """Nothing is kept across requests."""
        return {}

    def commit(self, ctx: DraftContext, num_accepted: Sequence[int]) -> None:
        """Nothing to roll back (the target's crop already cut the shared cache); the copy index
        catches up on the committed tokens."""
        self._copy.commit(ctx, num_accepted)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Batch size 1: keeping row 0 is a no-op; anything else is not a batch this drafter ran."""
        if list(rows) != [0]:
            raise ValueError(
                f"EarlyExitDrafter runs at batch size 1 only (its shared prefix cache is one sequence's), "
                f"so keep_rows({list(rows)}) has no rows to keep; only [0] is valid."
            )

    def source_of(self, ctx: DraftContext) -> list[int]:
        """Per row, 0 = a copy drafts next, 1 = the model (`drafters.copy_first`)."""
        return self._copy.source_of(ctx)

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, num_tokens: int) -> Draft:
        """Run [newest], d1, ..., d_{K-1} one at a time through layers < E of the target."""
        target = self._target
        if target is None:
            raise ValueError("EarlyExitDrafter.propose called before bind(target).")
        if ctx.batch_size != 1:
            raise ValueError(
                f"EarlyExitDrafter runs at batch size 1 only (its shared prefix cache is one sequence's), "
                f"got {ctx.batch_size} rows; decode the prompts one by one."
            )
        if target.cache_length != ctx.token_ids.shape[1] - 1:
            raise ValueError(
                f"the target caches {target.cache_length} positions but the context has "
                f"{ctx.token_ids.shape[1]} tokens; early exit expects all but the newest cached."
            )
        return self._copy.propose(ctx, num_tokens, lambda: self._exit_draft(ctx, num_tokens), target.vocab_size)

    def _exit_draft(self, ctx: DraftContext, num_tokens: int) -> Draft:
        """The exit's own draft: K tokens through layers < E (+ adapter), on the shared cache."""
        target = self._target
        assert target is not None
        prev = None
        if self.adapter is not None and self.adapter.context:  # final hidden before the newest token
            prev = ctx.target_hidden if ctx.target_hidden is not None else target.lm_head.weight.new_zeros(
                (1, target.hidden_size))  # [1, H]; zeros: unknown (a one-token prompt)
        step = ExitStep(target, self.exit_layer, self.adapter, self._head, prev)
        draft = draft_autoregressively(step, ctx.token_ids[:, -1:], num_tokens, ctx, self.vocab,
                                       stop_below=self.confidence_threshold)
        if not self.share_kv:
            target.discard_prefix()
        return draft
