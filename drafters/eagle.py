"""EAGLE-3 drafting: a one-layer head drafts from the target's own layer features.

The head (`specdraft.formats.eagle_head`) sees, at position j, the token x_{j+1} and a feature of
position j; for every position the target has verified that feature is a fusion of the target's
hidden states entering three of its layers, read from the verify forward itself
(`feature_layers`, `DraftContext.target_features`: no second pass). It therefore runs one position
behind the target: after the target kept the features of positions ..T-2, the head's output at
pair (f_{T-2}, x_{T-1}) (x_{T-1} the newest committed token) guesses the first draft token. Each
further draft token feeds the head's own output back as the feature (EAGLE's "feature
extrapolation"), with the drafted token's embedding.

The head keeps its own KV cache of the pairs with verified features; the entries its drafting
added are cropped at the next round and replaced by the verified ones. Drafting goes through the
shared loop (`specdraft.draft_loop.draft_autoregressively`), so q is the head's warped distribution
over its draft vocabulary expanded to the target's ids, and verification is exact for greedy and
sampled decoding alike.

`tree` ("auto", the default, or N; None drafts a chain: chain vs tree on CPU is in benchmarks/RESULTS.md)
drafts an EAGLE-2 dynamic tree (`drafters.eagle_tree`): up to `tree_depth` tokens deep and never
deeper than the round's K (the K policy sizes a tree's depth, as it sizes a chain's length), each
depth expands the `tree_topk` most probable paths (all of a depth in one head pass, with a tree
mask over the head's cache), and the best nodes are kept, as many as the target's measured
verify-cost curve pays for given the head's path probabilities (the node count is the tree's own
choice, not K's: a tree capped at K nodes is a chain with fewer tokens deep). The candidates are
deterministic, so the tree verifier (`specdraft.tree`) keeps the output exact at any temperature.

Drafting runs the head's inference form (`PackedEagleHead`: the same pass with its projections
packed for few rows, as the target's own layers are); training uses the module itself.

Copy first (`copy_ngram`, on by default, `drafters.copy_first`): a round whose last tokens occurred
earlier in the context drafts what followed them there instead of the head (the head still takes
that round's verified features).

Batch size 1 (`batched = False`: per-row feature streams are not built yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from drafters.copy_first import CopyFirst
from drafters.eagle_tree import best_nodes, expansion_mask, grow_tree, node_budget
from specdraft import costs
from specdraft.draft_loop import draft_autoregressively
from specdraft.formats.eagle_head import EagleHead, HeadCache, PackedEagleHead, load_head, random_head
from specdraft.protocol import Draft, DraftContext
from specdraft.vocab import PrunedVocab

MAX_TREE_NODES = 32  # the largest tree drafted (the verify-cost curve is measured this far)

if TYPE_CHECKING:
    from specdraft.target import TargetModel


class EagleDrafter:
    """EAGLE-3 drafter: `drafter=eagle drafter.head=<directory written by specdraft-train-eagle or
    any speculators EAGLE-3 head for the target>`.

    head: a shipped head (a target alias: "smollm2-135m" is `smollm2-135m/eagle`), a head
        directory, an in-memory `EagleHead`, or None for a random head (tests only: `seed`,
        `aux_layers` and `draft_ids` shape it).
    tree: None = a chain (verified against the head's q); "auto" = an EAGLE-2 dynamic tree of as
        many nodes as the target's verify-cost curve pays for, given the draft's path
        probabilities; an int N = the N most probable nodes (at most MAX_TREE_NODES). A tree is
        never deeper than the round's K.
    tree_topk: a tree's width: the paths expanded at every depth, and the children of each.
    tree_depth: how many tokens deep a tree grows (depth - 1 head passes after the first).
    copy_ngram: None = the head alone; else a round whose last copy_ngram..copy_max_ngram tokens
        occurred earlier in the context drafts what followed them there (`drafters.copy_first`).
    """

    needs_target_hidden: ClassVar[bool] = False
    hf_counterpart: ClassVar[str | None] = None
    verify_curve_tokens: int = MAX_TREE_NODES  # tree="auto" reads the curve this far
    sizes_own_drafts: ClassVar[bool] = False
    batched: ClassVar[bool] = False

    def __init__(self, head: str | Path | EagleHead | None = "smollm2-135m", seed: int = 0,
                 aux_layers: Sequence[int] | None = None, draft_ids: Sequence[int] | None = None,
                 tree: int | str | None = "auto", tree_topk: int = 4, tree_depth: int = 3,
                 copy_ngram: int | None = 2, copy_max_ngram: int = 4) -> None:
        if tree is not None and tree != "auto" and (isinstance(tree, bool) or not isinstance(tree, int)
                                                    or not 1 <= tree <= MAX_TREE_NODES):
            raise ValueError(f"tree must be null (a chain), \"auto\" or a node count in [1, {MAX_TREE_NODES}], "
                             f"got {tree!r}.")
        for name, value in (("tree_topk", tree_topk), ("tree_depth", tree_depth)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        self.tree, self.tree_topk, self.tree_depth = tree, tree_topk, tree_depth
        self.copy_ngram, self.copy_max_ngram = copy_ngram, copy_max_ngram
        self._copy = CopyFirst(copy_ngram, copy_max_ngram)
        self.draft_sources: tuple[str, ...] = self._copy.sources
        self.head_source = head
        self.seed, self.aux_layers, self.draft_ids = seed, aux_layers, draft_ids
        self.head: EagleHead | None = head if isinstance(head, EagleHead) else None
        self._run: PackedEagleHead | None = None  # the bound head's inference form (drafting runs this)
        self.feature_layers: tuple[int, ...] = () if self.head is None else tuple(self.head.config.aux_layers)
        self.vocab: PrunedVocab | None = None
        self._target: TargetModel | None = None
        self._cache: HeadCache | None = None
        self._fed = 0  # pairs with verified features in the head's cache (pair j at position j)
        self._pending: Tensor | None = None  # [1, p, F] verified features of pairs _fed.. not yet fed
        self._last: tuple[Tensor, Tensor] | None = None  # (logits [1, M], output [1, 1, H]) after pair _fed - 1

    # ------------------------------------------------------------------ protocol
    def bind(self, target: TargetModel) -> None:
        """Load the head (checked against the target) and read its feature layers."""
        if self.head is None or self._target is not target:
            if isinstance(self.head_source, EagleHead):
                self.head = self.head_source
            elif self.head_source is None:
                self.head = random_head(target, self.seed, self.draft_ids, self.aux_layers)
            else:
                self.head = load_head(self.head_source, target)
        head = self.head
        if head.config.hidden_size != target.hidden_size or head.config.vocab_size != target.vocab_size:
            raise ValueError(
                f"this EAGLE-3 head was made for a target with hidden size {head.config.target_hidden_size} "
                f"and vocab {head.config.vocab_size}; this target has {target.hidden_size} and {target.vocab_size}."
            )
        if max(head.config.aux_layers) >= target.num_layers:
            raise ValueError(f"the head reads target layers {list(head.config.aux_layers)}, but the target has "
                             f"{target.num_layers} layers.")
        self.head = head.to(device=target.device, dtype=target.lm_head.weight.dtype).eval()
        self._run = self.head.inference_form()
        self.feature_layers = tuple(head.config.aux_layers)
        vocab = head.vocab()
        self.vocab = None if vocab.size == target.vocab_size else vocab.to(target.device)
        self._target = target
        self.reset()

    def source_of(self, ctx: DraftContext) -> list[int]:
        """Per row, 0 = a copy drafts next, 1 = the model (`drafters.copy_first`)."""
        return self._copy.source_of(ctx)

    def propose(self, ctx: DraftContext, num_tokens: int) -> Draft:
        empty = Draft(token_ids=ctx.token_ids.new_zeros((1, 0)))
        self._take(ctx)
        if num_tokens <= 0 or self._fed + self._num_pending() == 0:
            return empty  # a one-token prompt: no verified feature yet
        if self._fed + self._num_pending() != ctx.token_ids.shape[1] - 1:
            raise ValueError("the EAGLE-3 drafter lost track of the target's features (it needs every round's).")
        assert self._target is not None
        return self._copy.propose(ctx, num_tokens, lambda: self._head_draft(ctx, num_tokens), self._target.vocab_size)

    def _head_draft(self, ctx: DraftContext, num_tokens: int) -> Draft:
        """The head's draft (a chain or a dynamic tree) after feeding it the pending verified pairs."""
        if self._cache is not None:
            self._cache.crop(self._fed)  # last round's drafted entries go
        with torch.inference_mode():
            if self.tree is not None:
                return self._tree(ctx, min(num_tokens, self.tree_depth))
            return draft_autoregressively(self._step_fn(ctx), ctx.token_ids[:, -1:], num_tokens, ctx, self.vocab)

    def commit(self, ctx: DraftContext, num_accepted: Sequence[int]) -> None:
        self._take(ctx)
        self._copy.commit(ctx, num_accepted)

    def keep_rows(self, rows: Sequence[int]) -> None:
        if list(rows) != [0]:
            raise ValueError("the EAGLE-3 drafter runs at batch size 1.")

    def reset(self) -> None:
        self._cache, self._fed, self._pending, self._last = None, 0, None, None
        self._copy.reset()

    def learn(self, token_ids: Tensor, prompt_len: int) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------------ internals
    def _num_pending(self) -> int:
        return 0 if self._pending is None else int(self._pending.shape[1])

    def _take(self, ctx: DraftContext) -> None:
        """Keep the features of pairs not yet seen: ctx.target_features [1, n, F] cover pairs
        T-1-n .. T-2 (T committed tokens); a context seen twice adds nothing."""
        feats = ctx.target_features
        if feats is None or feats.shape[1] == 0:
            return
        first = ctx.token_ids.shape[1] - 1 - feats.shape[1]  # pair index of feats[:, 0]
        known = self._fed + self._num_pending()
        if first > known:
            raise ValueError("the EAGLE-3 drafter missed the target's features of a round.")
        new = feats[:, known - first :]
        if new.shape[1]:
            self._pending = new if self._pending is None else torch.cat([self._pending, new], dim=1)

    def _rope(self, positions: Tensor, like: Tensor) -> tuple[Tensor, Tensor]:
        """The target's rotary (cos, sin) at `positions` [1, n], in `like`'s dtype: the head's layer
        rotates as the target's layers do."""
        assert self._target is not None
        return self._target.model.base_model.rotary_emb(like, position_ids=positions.to(like.device))

    @staticmethod
    def _span(start: int, n: int) -> Tensor:
        return torch.arange(start, start + n)[None]  # [1, n]: n consecutive positions

    def _feed_verified(self, ctx: DraftContext) -> tuple[Tensor, Tensor]:
        """Feed every pending verified pair (features, the token after each) to the head; returns
        what the head says after the last one: (logits [1, M] float, output [1, 1, H])."""
        head, target = self._run, self._target
        assert head is not None and target is not None
        if self._pending is None:  # every verified pair is fed already
            assert self._last is not None
            return self._last
        n = self._pending.shape[1]
        tokens = ctx.token_ids[:, self._fed + 1 : self._fed + 1 + n]  # [1, n] x_{j+1}
        hidden = head.fuse(self._pending.to(head.dtype))  # [1, n, H]
        embeds = target.model.get_input_embeddings()(tokens)  # [1, n, H]
        logits, out, self._cache = head(embeds, hidden, self._rope(self._span(self._fed, n), embeds), self._cache)
        self._fed += n
        self._pending = None
        self._last = (logits[:, -1].float(), out[:, -1:])
        return self._last

    def _step_fn(self, ctx: DraftContext):  # noqa: ANN202
        """next_logits for the drafting loop: the first call feeds every pending verified pair and
        returns the logits after the last one; each later call feeds (own output, drafted token)."""
        head, target = self._run, self._target
        assert head is not None and target is not None
        state: dict[str, Tensor] = {}

        def next_logits(feed: Tensor) -> Tensor:
            if "out" not in state:
                logits, state["out"] = self._feed_verified(ctx)
                return logits
            tokens = feed[:, -1:]  # the drafted token, with the head's own output before it
            embeds = target.model.get_input_embeddings()(tokens)  # [1, 1, H]
            start = self._cache.length if self._cache is not None else 0
            logits, out, self._cache = head(embeds, state["out"], self._rope(self._span(start, 1), embeds), self._cache)
            state["out"] = out[:, -1:]
            return logits[:, -1].float()  # [1, M]

        return next_logits

    def _tree(self, ctx: DraftContext, depth: int) -> Draft:
        """An EAGLE-2 dynamic tree `depth` deep (module docstring), as many nodes as the tree option
        says ("auto": the verify-cost curve pays for, given the head's path probabilities; N: N)."""
        head, target = self._run, self._target
        assert head is not None and target is not None
        root_logits, root_out = self._feed_verified(ctx)  # [1, M], [1, 1, H]
        outputs: dict[int, Tensor] = {-1: root_out[0]}  # expanded node -> the head's output there [1, H]
        slot: dict[int, int] = {}  # expanded node -> its position in the head's cache
        embed = target.model.get_input_embeddings()

        def expand(nodes: list[int], tokens: Tensor, parents: list[int]) -> Tensor:
            """Feed these nodes (one depth; each with its parent's output) and return their children's log q."""
            assert self._cache is not None
            paths, level = [], 0
            for node in nodes:  # the cache slots of each node's ancestors (all fed by earlier expansions)
                chain, p = [], parents[node]
                while p >= 0:
                    chain.append(slot[p])
                    p = parents[p]
                paths.append(chain)
                level = len(chain)  # every node of one expansion has the same depth
            length = self._cache.length
            hidden = torch.cat([outputs[parents[n]] for n in nodes], dim=0)[None]  # [1, f, H]
            ids = tokens if self.vocab is None else self.vocab.to_target(tokens)
            embeds = embed(ids[None])  # [1, f, H]
            cos_sin = self._rope(torch.full((1, len(nodes)), self._fed + level), embeds)  # depth d at fed + d
            mask = expansion_mask(self._fed, length, paths, embeds.dtype).to(embeds.device)  # [f, L + f]
            logits, out, self._cache = head(embeds, hidden, cos_sin, self._cache, mask)
            for r, node in enumerate(nodes):
                outputs[node], slot[node] = out[:, r], length + r
            return torch.log_softmax(logits[0].float(), dim=-1)  # [f, M]

        tree = grow_tree(torch.log_softmax(root_logits[0], dim=-1), expand, self.tree_topk, depth)
        if self.tree == "auto":
            n = node_budget(tree.scores, costs.verify_curve(target, MAX_TREE_NODES))
        else:
            n = int(self.tree)
        if n == 0:
            return Draft(token_ids=ctx.token_ids.new_zeros((1, 0)))
        tokens, parents = best_nodes(tree, n)  # [N] draft indices, [N]
        ids = tokens if self.vocab is None else self.vocab.to_target(tokens)
        device = ctx.token_ids.device
        return Draft(token_ids=ids[None].to(device), parents=parents[None].to(device))
