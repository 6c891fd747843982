"""The Drafter protocol: the one interface every drafting strategy implements.

A drafter proposes K tokens per round (`propose`), learns how many the target kept (`commit`),
forgets the prompt's state on a new prompt (`reset`) and may remember a finished generation
across requests (`learn`). It never touches the target's KV cache except through
`TargetModel`'s public methods. Capabilities are class attributes (`needs_target_hidden`, `hf_counterpart`,
`sizes_own_drafts`, `batched`, and `feature_layers`, `draft_sources` and `verify_curve_tokens`,
which are data on the instance because they may depend on the target or the settings), so the
decoding loop never branches on a drafter's type.

Batches: with `batched = True` a drafter drafts for B rows at once. Rows have their own lengths:
`DraftContext.token_ids` is left padded to the longest row and `DraftContext.lengths` gives each
row's own length (`DraftContext.row(i)` is row i's tokens); a `Draft` pads shorter rows' drafts to
the longest and says in `Draft.lengths` how many tokens of each row are real. `commit` gets each
row's accepted count, and `keep_rows` says which rows are still in the batch when some finish.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor

from specdraft.sampling import SamplingConfig

if TYPE_CHECKING:
    from specdraft.target import TargetModel


@dataclass(frozen=True)
class Draft:
    """The drafter's proposal for one round.

    token_ids: [B, K] int64; K may be 0 ("no proposal": the round is plain autoregressive).
    probs: [B, K, V] q after the SAME warping as the target (`specdraft.sampling.warp`);
        None = deterministic drafter (q is one-hot at token_ids).
    parents: None for a chain; for a candidate tree of deterministic candidates (probs is then
        ignored) the parent node of every draft token, -1 = the newest committed token
        (specdraft/tree.py verifies it, greedily or by rejection sampling over siblings).
    """

    token_ids: Tensor
    probs: Tensor | None = None
    parents: Tensor | None = None  # [B, K] parent index per node, -1 = root (a tree, specdraft/tree.py)
    lengths: Tensor | None = None  # [B] int64 real tokens per row (the rest is padding); None = all K

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[1])


@dataclass(frozen=True)
class DraftContext:
    """What a drafter may look at when it proposes or commits.

    token_ids: [B, T] committed tokens: prompt + accepted output (the newest token last; it is not
        yet in the target's KV cache).
    target_hidden: [B, H] target's last-layer hidden state at the position that produced the newest
        token, filled only for drafters with `needs_target_hidden = True` (None on the first round
        of a one-token prompt).
    sampling: the generation's sampling settings (the drafter warps q with them).
    generator: the generation's random generator (CPU); drafters draw from it, never from the
        global RNG.
    lengths: [B] each row's own number of tokens when rows differ (token_ids is then left padded
        to the longest: a row's tokens are its last lengths[i] columns, so token_ids[:, -1] is
        every row's newest token); None = every row has all T.
    target_features: [1, n, F] for drafters with `feature_layers` (batch size 1): the target's
        inputs of those layers (side by side, `TargetOutput.features`) at the n positions it
        processed and kept since the previous context: after the prefill every position but the
        newest token's (n = T - 1), after a round the previous newest token's and the accepted
        drafts' (n = accepted + 1). Position T - 1 - n + j's features predicted token T - n + j,
        so the features end one position before the newest token. None for other drafters.
    """

    token_ids: Tensor
    target_hidden: Tensor | None
    sampling: SamplingConfig
    generator: torch.Generator
    lengths: tuple[int, ...] | None = None
    target_features: Tensor | None = None

    @property
    def batch_size(self) -> int:
        return int(self.token_ids.shape[0])

    def row_lengths(self) -> tuple[int, ...]:
        """Each row's own number of committed tokens."""
        return self.lengths if self.lengths is not None else (int(self.token_ids.shape[1]),) * self.batch_size

    def row(self, i: int) -> Tensor:
        """Row i's committed tokens [T_i] (its padding cut off)."""
        n = self.row_lengths()[i]
        return self.token_ids[i, self.token_ids.shape[1] - n :]


@runtime_checkable
class Drafter(Protocol):
    """A way of drafting tokens. See drafters/ for implementations."""

    needs_target_hidden: ClassVar[bool]  # fill DraftContext.target_hidden for this drafter
    # The target layers (ids j in [0, num_layers): the input of layer j) whose states the drafter
    # reads at every position the target keeps (DraftContext.target_features), from the verify
    # forward itself; () = none. Final after `bind` (the ids depend on the target's depth).
    feature_layers: tuple[int, ...]
    # The Hugging Face generation mode that does the same thing (a `specdraft.bench` peer name such
    # as "hf_assisted"), or None: the bench compares each drafter with its counterpart.
    hf_counterpart: ClassVar[str | None]
    # Up to how many draft tokens (tree nodes) the drafter reads the target's verify-cost curve
    # (`specdraft.costs.verify_curve`, e.g. to size a candidate tree); 0 = it does not. The decoder
    # measures the curve that far before a generation's clock starts. Final after `__init__`.
    verify_curve_tokens: int
    # True: the drafter chooses how many tokens each round drafts from its own evidence (suffix
    # decoding: per-candidate probabilities from counts, weighed on the verify-cost curve), so under
    # num_draft_tokens="auto" the decoder offers it max_draft_tokens every round instead of capping
    # it with the acceptance-rate cost model (`specdraft.draft_length`).
    sizes_own_drafts: ClassVar[bool]
    # True: propose/commit take a batch of B rows (generate_batch); False: batch size 1 only, and
    # the decoder raises a clear error for a batch.
    batched: ClassVar[bool]
    # The sources the drafter drafts from, named (data on the instance, final after `bind`); with two
    # or more (a copy where the context repeats, else the model's guess) `source_of` says before each
    # round which one drafts each row, and the K policy learns every source apart
    # (`specdraft.draft_length.PerSourceDraftLength`); () = one source.
    draft_sources: tuple[str, ...]

    def bind(self, target: TargetModel) -> None:
        """Called once before generation: share weights, check the vocabulary, move to device."""
        ...

    def source_of(self, ctx: DraftContext) -> list[int]:
        """Per row, the index into `draft_sources` of the source that drafts the next proposal for
        ctx (a function of the committed tokens only); [0] * B for a drafter of one source."""
        ...

    def propose(self, ctx: DraftContext, num_tokens: int) -> Draft:
        """Propose up to `num_tokens` tokens continuing ctx.token_ids: a chain, or a candidate tree at
        most `num_tokens` deep (its nodes are the drafter's to size; the K policy counts its depth)."""
        ...

    def commit(self, ctx: DraftContext, num_accepted: Sequence[int]) -> None:
        """Row i of the target kept num_accepted[i] draft tokens and appended one more (ctx is the
        new state): roll own state back to the accepted prefix."""
        ...

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Only these rows (indices into the current batch, in this order) go on; the others
        finished. Per-row state of the dropped rows is forgotten."""
        ...

    def reset(self) -> None:
        """Forget all per-prompt state."""
        ...

    def learn(self, token_ids: Tensor, prompt_len: int) -> dict[str, Any]:
        """A generation finished: token_ids [T] is its prompt (the first prompt_len tokens) and
        output. A drafter that learns across requests (suffix decoding's store) keeps what it
        needs and returns a summary of what it now keeps (the bench records it); every other
        drafter keeps nothing and returns {}. Not called for the decoder's own calibration."""
        ...
