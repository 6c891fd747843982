"""Medusa drafting: K small heads on the target's last hidden state guess the next K tokens.

Head k (0-based) reads the target's post-norm hidden state at the position that produced the
newest token x_n and guesses x_{n+k+1}; one target forward therefore yields the next draft for free
(no second model, no sequential drafting passes). The heads, their file format and the recurrent
(Hydra-style) variant, where head k is also told the token drafted before it, are
`specdraft.formats.medusa_heads`; their fast inference forms `drafters.medusa_forms`; the
candidate trees `drafters.medusa_tree`.

Proposals: a chain (top-1 of every head at temperature 0; at temperature > 0 a sample from each
head's warped distribution, returned as q: the heads do not condition on the earlier draft tokens,
which is still a valid q for the lossless verifier), or a candidate tree (plain lists of top-k rank
paths) verified in one forward with a tree mask (`specdraft.tree`): greedily at temperature 0, by
rejection sampling over the siblings (one-hot q, residual renormalised) at temperature > 0.

Copy first (`copy_ngram`, on by default): where the last copy_ngram..copy_max_ngram committed tokens
occurred earlier in the context, the round drafts what followed them there (prompt lookup) instead
of the heads' guess (`drafters.copy_first`): the heads guess new text, copying is right where text
repeats. `copy_ngram=null` drafts with the heads alone.

Trees at batch size 1 only, a chain at B > 1: the decoder verifies a tree with one tree mask for
the whole batch (`specdraft.tree`), so a batch (`generate_batch`) gets every row's chain from the
heads, drafted for all rows at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from drafters.copy_first import CopyFirst
from drafters.medusa_forms import CompiledHeads, PackedHeads, PackedRecurrentHeads
from drafters.medusa_tree import (
    AUTO,
    MAX_TREE_NODES,
    Path_,
    TreeSpec,
    check_tree_spec,
    path_tree_draft,
    require_accuracy,
    resolve_tree,
    tree_draft,
)
from specdraft import costs
from specdraft.formats.medusa_heads import (
    HeadAccuracy,
    MedusaHeads,
    base_heads,
    check_heads_target,
    load_accuracy,
    load_heads,
    resolve_heads_dir,
)
from specdraft.protocol import Draft, DraftContext
from specdraft.sampling import sample, warp
from specdraft.vocab import PrunedVocab, resolve_pruned_vocab

if TYPE_CHECKING:
    from specdraft.target import TargetModel


class MedusaDrafter:
    """Medusa drafter. `specdraft-generate drafter=medusa` (shipped heads for smollm2-135m).

    heads: adapter directory written by specdraft-train-medusa, or shipped heads: a target alias
        ("smollm2-135m": its Medusa heads) or alias/name ("smollm2-135m/medusa_recurrent": the
        recurrent heads, each told the token drafted before it); None builds fresh heads (zero
        blocks, no LoRA: every head then proposes the target's own next-token guess, for tests).
    num_heads: use the first K heads (None = all that were trained; a fresh set has 3).
    tree: "auto" for the tree grown from the accuracies saved with the heads and sized for the
        target's measured verify-cost curve (`specdraft.costs.verify_curve`, measured on the first
        proposal, never when building or binding), an int N for that tree with exactly N nodes, an
        explicit list of paths (lists of top-k ranks, e.g. [[0], [1], [0, 0]]), or None for a
        chain; at any temperature (see the module docstring).
    pruned_vocab: "auto" projects onto the pruned vocabulary saved with the heads
        (pruned_vocab.json, the one they were trained on), much cheaper than the full lm_head;
        None = the full vocabulary; or a path / `specdraft.vocab.PrunedVocab`. Tokens outside it
        are never proposed; verification stays exact either way.
    copy_ngram: None = the heads alone; else a round whose last copy_ngram..copy_max_ngram tokens
        occurred earlier in the context drafts what followed them there (longest suffix first, the
        most recent occurrence) instead of the heads' draft (module docstring).

    Batched: the tree at batch size 1 only; at B > 1 the chain for all rows at once (module
    docstring: one tree mask per batch). Per-row state: only the copy index.
    """

    needs_target_hidden: ClassVar[bool] = True
    feature_layers: tuple[int, ...] = ()
    hf_counterpart: ClassVar[str | None] = None
    verify_curve_tokens: int = MAX_TREE_NODES  # tree="auto" is sized on the curve
    sizes_own_drafts: ClassVar[bool] = False
    batched: ClassVar[bool] = True

    def __init__(
        self,
        heads: str | Path | None = "smollm2-135m",
        num_heads: int | None = None,
        tree: TreeSpec = AUTO,
        pruned_vocab: str | Path | PrunedVocab | None = AUTO,
        copy_ngram: int | None = 2,
        copy_max_ngram: int = 4,
    ) -> None:
        check_tree_spec(tree)
        self.copy_ngram = copy_ngram
        self.copy_max_ngram = copy_max_ngram
        self._copy = CopyFirst(copy_ngram, copy_max_ngram)
        self.draft_sources: tuple[str, ...] = self._copy.sources
        self.heads_source = heads
        self.num_heads = num_heads
        self.tree_spec = tree
        self.pruned_vocab = pruned_vocab
        self.vocab: PrunedVocab | None = None  # the pruned vocabulary in use (None = all of V)
        self.model: nn.Module | None = None
        self.paths: list[Path_] | None = None  # the candidate tree (None = a chain, or "auto" not yet sized)
        self.tree_curve: list[float] | None = None  # T_v(k)/T_v(0) that sized an "auto" tree
        self._target: TargetModel | None = None
        self._accuracy: HeadAccuracy | None = None
        self._compiled: CompiledHeads | None = None
        self._packed: PackedHeads | None = None  # the fast inference form (shared projection)
        self._step: Callable[[int, Tensor, Tensor], tuple[Tensor, Tensor]] | None = None  # recurrent

    # ------------------------------------------------------------------ protocol
    def bind(self, target: TargetModel) -> None:
        """Load the heads onto the target's lm_head (heads attached in memory are kept), after
        checking that they were trained for this target. Does no timing: a tree "auto" is sized
        for this target on the first proposal."""
        self._target = target
        weight = target.lm_head.weight
        if self._compiled is not None and self._compiled.weights[0] is weight:
            self._forget_auto_tree()  # already on this target's lm_head (loaded, or attached in memory)
            return
        if self.heads_source is None:
            model: nn.Module = MedusaHeads(weight, num_heads=self.num_heads or 3)
        else:
            check_heads_target(self.heads_source, target)  # a named error, not a size mismatch
            model = load_heads(self.heads_source, weight, target.model.get_input_embeddings().weight)
        self.attach(model)

    def attach(self, model: nn.Module) -> None:
        """Use an in-memory (optionally PEFT-wrapped) MedusaHeads, e.g. fresh from training; the
        pruned vocabulary is the `pruned_vocab` option's (resolved against the heads directory)."""
        base = base_heads(model)
        available = base.num_heads
        k = self.num_heads or available
        if not 1 <= k <= available:
            raise ValueError(f"num_heads must be in [1, {available}] for these heads, got {k}.")
        self.model = model.eval()
        heads_dir = None if self.heads_source is None else resolve_heads_dir(self.heads_source)
        weight = base.lm_heads[0].weight  # [V, H]
        vocab = resolve_pruned_vocab(self.pruned_vocab, heads_dir, int(weight.shape[0]))
        self.vocab = None if vocab is None else vocab.to(weight.device)
        self._compiled = CompiledHeads(model, self.vocab)
        self._compiled.truncate(k)
        use_packed = self._compiled.shared and not self._compiled.recurrent
        self._packed = PackedHeads(self._compiled) if use_packed else None
        packed_recurrent = self._compiled.shared and self._compiled.recurrent
        # recurrent heads draft one head at a time: the packed step where it applies
        self._step = PackedRecurrentHeads(self._compiled).step if packed_recurrent else self._compiled.step
        self._accuracy = load_accuracy(heads_dir, max_depth=k)
        if self.tree_spec == AUTO:  # needs the accuracies; sized on the first proposal
            require_accuracy(self.tree_spec, self._accuracy)
            self._forget_auto_tree()
        else:
            self.paths = resolve_tree(self.tree_spec, self._accuracy, k)

    def reset(self) -> None:
        """New prompt: the heads keep nothing; the copy index starts over."""
        self._copy.reset()

    def learn(self, token_ids: torch.Tensor, prompt_len: int) -> dict[str, Any]:
        """Nothing is kept across requests."""
        return {}

    def commit(self, ctx: DraftContext, num_accepted: Sequence[int]) -> None:
        """The heads have nothing to roll back; the copy index catches up on the committed tokens."""
        self._copy.commit(ctx, num_accepted)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """The hidden states come with every DraftContext; only the copy index is per row."""
        self._copy.keep_rows(rows)

    def head_logits(self, hidden: Tensor) -> Tensor:
        """hidden [B, H] -> logits [B, K, M] of the heads in use (M = the pruned vocabulary's size or V)."""
        if self._compiled is None:
            raise ValueError("MedusaDrafter is not bound to a target; call bind(target) first.")
        if self._compiled.recurrent:
            raise ValueError("recurrent heads depend on the drafted tokens: use propose().")
        if self._packed is not None:
            return self._packed(hidden)
        return self._compiled.logits(hidden)

    def source_of(self, ctx: DraftContext) -> list[int]:
        """Per row, 0 = a copy drafts next, 1 = the model (`drafters.copy_first`)."""
        return self._copy.source_of(ctx)

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, num_tokens: int) -> Draft:
        batch = ctx.batch_size
        if batch == 1:
            self._size_auto_tree(ctx)  # a tree is drafted at batch size 1 only
        return self._copy.propose(ctx, num_tokens, lambda: self._propose_heads(ctx, num_tokens), self.model_vocab)

    def _propose_heads(self, ctx: DraftContext, num_tokens: int) -> Draft:
        """The heads' draft: a chain, or the candidate tree at batch size 1."""
        batch = ctx.batch_size
        hidden = ctx.target_hidden  # [B, H] or None
        empty = torch.empty((batch, 0), dtype=torch.long, device=ctx.token_ids.device)
        if hidden is None or num_tokens <= 0:
            return Draft(token_ids=empty)
        tree = self.paths if batch == 1 else None
        if self._compiled is not None and self._compiled.recurrent:
            return self._propose_recurrent(ctx, hidden, num_tokens, tree)
        logits = self.head_logits(hidden)  # [B, K, M]
        if tree:  # candidates = top-k ranks; verified losslessly at any temperature (specdraft.tree)
            return tree_draft(tree, logits[0], num_tokens, self.vocab)
        logits = logits[:, :num_tokens]  # [B, K', M]
        if ctx.sampling.greedy:
            return Draft(token_ids=self._to_target(logits.argmax(dim=-1)))
        q = warp(logits, ctx.sampling)  # [B, K', M]
        tokens = self._to_target(sample(q, ctx.generator).to(logits.device))  # [B, K']
        return Draft(token_ids=tokens, probs=self._on_target_vocab(q))

    # ------------------------------------------------------------------ internals
    def _forget_auto_tree(self) -> None:
        """An "auto" tree is (re)sized for the bound target on the next proposal."""
        if self.tree_spec == AUTO:
            self.paths, self.tree_curve = None, None

    def _size_auto_tree(self, ctx: DraftContext) -> None:
        """Size a tree "auto" once per bind, for the bound target's verify-cost curve.

        Measuring the curve (once per process and model, `specdraft.costs.verify_curve`) runs
        forwards on the target and leaves its KV cache empty; the committed prefix the cache held
        is then run again (on the first proposal of a generation that is the prefill, redone).
        """
        if self.tree_spec != AUTO or self.paths is not None:
            return
        target = self._target
        if target is None or self._compiled is None:
            raise ValueError("tree='auto' is sized for the bound target's verify-cost curve: call bind(target) first.")
        cached = target.cache_length
        self.tree_curve = costs.verify_curve(target, MAX_TREE_NODES)  # T_v(k)/T_v(0), k + 1 positions
        if target.cache_length != cached:  # a measurement ran: restore the committed prefix
            target.reset()
            if cached:
                target.forward(ctx.token_ids[:, :cached].to(target.device), num_logits=0)
        self.paths = resolve_tree(AUTO, self._accuracy, len(self._compiled.blocks), self.tree_curve)

    def _propose_recurrent(self, ctx: DraftContext, hidden: Tensor, num_tokens: int,
                           tree: list[Path_] | None) -> Draft:
        """Recurrent heads: each head is told the token drafted before it (K sequential steps, all
        rows at once); `tree`: the candidate tree (batch size 1), None = a chain."""
        compiled = self._compiled
        assert compiled is not None and self._step is not None
        newest = ctx.token_ids[:, -1]  # [B] y_0
        if tree:  # a node's children come from its own path's head state
            return path_tree_draft(tree, self._step, hidden, newest, num_tokens, self.vocab)
        state, token = hidden, newest
        tokens, qs = [], []
        for k in range(min(num_tokens, len(compiled.blocks))):
            state, logits = self._step(k, state, token)  # [B, H], [B, M]
            if ctx.sampling.greedy:
                index = logits.argmax(dim=-1)  # [B]
            else:
                q = warp(logits, ctx.sampling)  # [B, M] q of this head given the draft before it
                index = sample(q, ctx.generator).to(logits.device)
                qs.append(q)
            token = self._to_target(index)
            tokens.append(token)
        if not tokens:
            return Draft(token_ids=ctx.token_ids.new_empty((ctx.batch_size, 0)))
        ids = torch.stack(tokens, dim=1)  # [B, K']
        if ctx.sampling.greedy:
            return Draft(token_ids=ids)
        return Draft(token_ids=ids, probs=self._on_target_vocab(torch.stack(qs, dim=1)))  # q [B, K', V]

    @property
    def model_vocab(self) -> int:
        """V, the target's vocabulary size."""
        assert self._compiled is not None
        return int(self._compiled.weights[0].shape[0])

    def _to_target(self, index: Tensor) -> Tensor:
        """Indices into the projected columns -> target token ids."""
        return index if self.vocab is None else self.vocab.to_target(index)

    def _on_target_vocab(self, q: Tensor) -> Tensor:
        """q [..., M] over the projected columns -> [..., V] over the target's ids (zero outside
        the pruned vocabulary)."""
        return q if self.vocab is None else self.vocab.expand(q)
