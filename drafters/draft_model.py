"""Draft-model drafting: a small causal LM that shares the target's tokenizer drafts K tokens.

The classic setup: Mq imitates Mp. The drafter keeps its own KV cache, drafts K tokens
autoregressively from its warped q (the shared `warp`, so greedy at temperature 0) and returns q.
Between rounds it keeps the longest prefix of its cache that matches the committed tokens, so the
recovered / bonus token (and a fully accepted last draft token) are fed next round without
recomputing the prefix, and a rejected draft never leaves stale KV behind.

Optionally it drafts over a pruned vocabulary (`specdraft.vocab.PrunedVocab`): its head then
projects onto M of the target's V tokens (V / M times cheaper) and q is zero outside the subset,
which keeps verification exact.

By default it also copies (`copy_ngram`), twice over. A round whose last copy_ngram..copy_max_ngram
committed tokens occurred earlier in the context drafts what followed them there without running the
draft (`copy_first`, `drafters.copy_first`; such rounds are a draft source of their own, so the K
policy sizes copies apart from the model's guesses). Inside the model's rounds, where the tokens
drafted so far end in such an earlier occurrence, the token that followed it is mixed into q with
weight `copy_weight` (`specdraft.draft_loop.mix_in_copy`; greedy: it is the draft when the weight is
>= 0.5). A small draft cannot copy from its context (it has no induction heads), and on chat and qa
that is where most of its fixable misses are (benchmarks/RESULTS.md).

    DraftModelDrafter()                                 # the shipped distilled draft for smollm2-135m + copying
    DraftModelDrafter(model="HuggingFaceTB/SmolLM2-135M-Instruct", pruned_vocab=None)
    DraftModelDrafter(model=my_module)                  # any in-memory HF causal LM
    DraftModelDrafter(copy_ngram=None)                  # the draft alone, no copying
    DraftModelDrafter(siblings=0)                       # greedy: a chain, without the runner-up tokens beside it

Batches (`generate_batch`): every row keeps its own prefix of the draft's cache (the cache's rows
are ragged, `specdraft.draft_loop.DraftCache`) and its own copy index; one draft forward per step
serves every row.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from drafters.copy_first import CopyFirst
from drafters.ngram import NGramIndex
from specdraft import costs
from specdraft.draft_loop import CopySource, DraftCache, draft_autoregressively
from specdraft.linear_formats import PackedLinear
from specdraft.formats.draft import is_draft_artifact, load_draft_artifact
from specdraft.models import load_model, load_tokenizer, resolve_source
from specdraft.protocol import Draft, DraftContext
from specdraft.shipped import resolve_artifact
from specdraft.target import TargetModel
from specdraft.vocab import AUTO, PrunedVocab, resolve_pruned_vocab

SHIPPED_DRAFT = "smollm2-135m/draft"  # the default `model`: the distilled draft shipped for smollm2-135m
MAX_TREE_NODES = 32  # with siblings: the verify-cost curve is read this far (chain + siblings)


def load_draft(
    model: str | Path | nn.Module, target: TargetModel
) -> tuple[PreTrainedModel, Path | None, object | None]:
    """Resolve `model` to (draft module, the directory whose `pruned_vocab.json` belongs to it or
    None, its tokenizer or None). Draft artifacts (shipped `<alias>/<artifact>` names or exported
    directories) are rebuilt from `target` (a clear error when they were made for another target);
    anything else goes through `specdraft.models`."""
    if isinstance(model, nn.Module):
        return model, None, None
    if not isinstance(model, (str, Path)):
        raise ValueError(f"model must be a name, a path or an nn.Module, got {type(model).__name__}.")
    name = str(model)
    art = resolve_artifact(name)
    if art is not None and is_draft_artifact(art):
        return load_draft_artifact(art, target), art, None
    src = resolve_source(name)  # raises a clear ValueError for unknown names / missing paths
    weight = target.lm_head.weight
    draft = load_model(name, device=weight.device, dtype=weight.dtype)
    try:
        tok = load_tokenizer(name)
    except (OSError, ValueError):
        tok = None
    return draft, None if src.hub_id else Path(src.path), tok


def load_draft_hf_model(name: str | Path | nn.Module, target: TargetModel) -> PreTrainedModel:
    """The draft as a plain Hugging Face `PreTrainedModel` with a full-vocabulary head, e.g. for
    `target.model.generate(..., assistant_model=load_draft_hf_model("smollm2-135m/draft", t))`."""
    draft, _, _ = load_draft(name, target)
    return draft.to(target.device).eval()


class DraftModelDrafter:
    """Drafts with a small causal LM. `specdraft-generate drafter=draft_model`.

    model: a shipped draft artifact ("smollm2-135m/draft", `specdraft.shipped`) or an exported
        artifact directory (`specdraft.formats.draft`); an alias / save_pretrained directory / hub id
        / .gguf (via `specdraft.models`; "smollm2-135m" is the full target model used as a draft);
        or an in-memory `nn.Module` (a HF causal LM). Resolved in `bind`, where the target is known.
    pruned_vocab: `specdraft.vocab.resolve_pruned_vocab`: "auto" = the `pruned_vocab.json` saved
        with the draft if any (else the full vocabulary); None = always the full vocabulary; a path
        to a `PrunedVocab` JSON; or a `PrunedVocab`.
    strict_tokenizer: raise (instead of warn) when the draft's token texts differ from the target's.
    fast: run the draft on the fast layer stack (`TargetModel(fast=...)`: packed weights, in-place
        KV cache); "auto" = when its architecture supports it.
    copy_ngram: None = off; else the shortest suffix (in tokens) whose earlier occurrence in the
        context is copied; copy_max_ngram the longest tried first (the most recent occurrence wins).
    copy_weight: the copied token's weight w in q' = (1 - w) q + w onehot (0 < w <= 1).
    copy_first: also copy whole rounds (`drafters.copy_first`): a round whose last copy_ngram..copy_max_ngram
        tokens occurred earlier drafts what followed them there without running the draft at all;
        False = copies only mixed into the draft's q.
    confidence_threshold: end a round's draft after a token whose draft probability is below it
        (transformers' `assistant_confidence_threshold`; `specdraft.draft_loop`); None = always
        draft the K asked for.
    siblings: greedy decoding of one sequence: at each drafted position also consider the draft's
        next `siblings` best tokens, as leaves of a candidate tree verified in the same forward
        (`specdraft.tree.chain_with_siblings`; no extra draft forward, more verify positions),
        keeping those the target's verify-cost curve pays for (`specdraft.draft_loop`); 0 = a
        chain. At temperature > 0 and in batches the draft is a chain.
    """

    needs_target_hidden: ClassVar[bool] = False
    feature_layers: tuple[int, ...] = ()
    hf_counterpart: ClassVar[str | None] = "hf_assisted"  # HF assisted generation with the same draft
    verify_curve_tokens: int = MAX_TREE_NODES  # 0 without siblings
    sizes_own_drafts: ClassVar[bool] = False
    batched: ClassVar[bool] = True

    def __init__(
        self,
        model: str | Path | nn.Module = SHIPPED_DRAFT,
        pruned_vocab: str | Path | PrunedVocab | None = AUTO,
        strict_tokenizer: bool = False,
        fast: bool | str = "auto",
        copy_ngram: int | None = 2,
        copy_max_ngram: int = 4,
        copy_weight: float = 0.9,
        copy_first: bool = True,
        confidence_threshold: float | None = None,
        siblings: int = 1,
    ) -> None:
        if copy_ngram is not None and not 1 <= copy_ngram <= copy_max_ngram:
            raise ValueError(
                f"need 1 <= copy_ngram <= copy_max_ngram, got copy_ngram={copy_ngram}, "
                f"copy_max_ngram={copy_max_ngram}; set copy_ngram=null to turn copying off."
            )
        if not 0.0 < copy_weight <= 1.0:
            raise ValueError(f"copy_weight must be in (0, 1], got {copy_weight}; the default is 0.9.")
        if confidence_threshold is not None and not 0.0 < confidence_threshold < 1.0:
            raise ValueError(f"confidence_threshold must be in (0, 1) or null (always draft K), got {confidence_threshold}.")
        if isinstance(siblings, bool) or not isinstance(siblings, int) or siblings < 0:
            raise ValueError(f"siblings must be an integer >= 0 (0 = draft a chain), got {siblings!r}.")
        self.confidence_threshold = confidence_threshold
        self.siblings = siblings
        self.verify_curve_tokens = MAX_TREE_NODES if siblings else 0
        self.copy_ngram = copy_ngram
        self.copy_max_ngram = copy_max_ngram
        self.copy_weight = copy_weight
        self.copy_first = copy_first and copy_ngram is not None  # copy_ngram=None turns every copy off
        self._copy_rounds = CopyFirst(copy_ngram if self.copy_first else None, copy_max_ngram)
        self.draft_sources: tuple[str, ...] = self._copy_rounds.sources
        self._copy_indexes: list[NGramIndex] = []  # per row: n-grams of its committed tokens (copy_ngram set)
        self.model_spec = model
        self.fast = fast
        self.pruned_vocab_spec = pruned_vocab
        self.strict_tokenizer = strict_tokenizer
        self.model: PreTrainedModel | None = None
        self.vocab: PrunedVocab | None = None
        self._head: Tensor | None = None  # [M or V, H]
        self._cache: DraftCache | None = None  # the draft's own layers + KV cache, synced to the context
        self._head_linear: PackedLinear | None = None
        self._target: TargetModel | None = None  # whose verify-cost curve weighs siblings

    def hf_peer_kwargs(self) -> dict[str, PreTrainedModel]:
        """The arguments of the `hf_counterpart` "hf_assisted" (`specdraft.bench.HFCounterpart`):
        `generate(..., assistant_model=<the bound draft>)`. Asked after `bind`."""
        return {"assistant_model": self.hf_assistant_model()}

    def hf_assistant_model(self) -> PreTrainedModel:
        """The bound draft as a plain HF model (full-vocabulary head) for `assistant_model=`: what
        the `hf_counterpart` "hf_assisted" runs, so the bench compares this drafter with Hugging Face
        assisted generation on the same weights."""
        if self.model is None:
            raise ValueError("bind the drafter to a target before asking for its HF model.")
        return self.model

    # ------------------------------------------------------------------------------ binding
    def bind(self, target: TargetModel) -> None:
        """Load/rebuild the draft next to the target, check the vocabulary, build the head."""
        draft, vocab_dir, draft_tok = load_draft(self.model_spec, target)
        head_weight = draft.get_output_embeddings().weight  # [V_draft, H]
        if head_weight.shape[0] != target.vocab_size:
            raise ValueError(
                f"the draft's vocabulary has {head_weight.shape[0]} tokens but the target's has "
                f"{target.vocab_size}; use a draft that shares the target's tokenizer."
            )
        self._check_token_texts(draft_tok, target.tokenizer)
        vocab = resolve_pruned_vocab(self.pruned_vocab_spec, vocab_dir, target.vocab_size)
        self.model = draft.to(target.device).eval()
        self.vocab = vocab.to(target.device) if vocab is not None else None
        weight = self.model.get_output_embeddings().weight
        self._head = vocab.head(weight) if vocab is not None else weight.detach()  # [M or V, H]
        self._cache = DraftCache(TargetModel(self.model, fast=self.fast))  # same fast path as the target
        self._head_linear = PackedLinear(self._head, None)
        self._target = target
        self.reset()

    def _check_token_texts(self, draft_tok: object | None, target_tok: object | None, n: int = 64) -> None:
        if draft_tok is None or target_tok is None:
            return
        size = min(len(draft_tok), len(target_tok))  # type: ignore[arg-type]
        ids = torch.linspace(0, size - 1, n).long().unique().tolist()
        a = draft_tok.convert_ids_to_tokens(ids)  # type: ignore[attr-defined]
        b = target_tok.convert_ids_to_tokens(ids)  # type: ignore[attr-defined]
        bad = [(i, x, y) for i, x, y in zip(ids, a, b) if x != y]
        if bad:
            msg = (
                f"the draft's tokenizer differs from the target's on {len(bad)} of {len(ids)} sampled "
                f"ids (e.g. id {bad[0][0]}: {bad[0][1]!r} vs {bad[0][2]!r}); acceptance will be poor."
            )
            if self.strict_tokenizer:
                raise ValueError(msg + " Use a draft trained with the target's tokenizer.")
            warnings.warn(msg, stacklevel=2)

    # ------------------------------------------------------------------------------ protocol
    def reset(self) -> None:
        """New prompt: an empty cache."""
        if self._cache is not None:
            self._cache.reset()
        self._copy_indexes = [self._new_index()] if self.copy_ngram else []
        self._copy_rounds.reset()

    def learn(self, token_ids: torch.Tensor, prompt_len: int) -> dict[str, Any]:
        """Nothing is kept across requests."""
        return {}

    def commit(self, ctx: DraftContext, num_accepted: Sequence[int]) -> None:
        """Keep only each row's cached positions that match its committed tokens (drops rejected KV)."""
        if self._cache is not None:
            self._cache.sync(ctx)
        self._copy_rounds.commit(ctx, num_accepted)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Only these rows go on: drop the others' cache rows and copy indexes."""
        if self._cache is not None:
            self._cache.keep_rows(rows)
        if len(self._copy_indexes) > 1:
            self._copy_indexes = [self._copy_indexes[r] for r in rows]
        self._copy_rounds.keep_rows(rows)

    def source_of(self, ctx: DraftContext) -> list[int]:
        """With copy_first, per row 0 = a copy drafts next, 1 = the draft model; else one source."""
        return self._copy_rounds.source_of(ctx)

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, num_tokens: int) -> Draft:
        if self._cache is None:
            raise ValueError("DraftModelDrafter.propose was called before bind(target).")
        return self._copy_rounds.propose(ctx, num_tokens, lambda: self._draft(ctx, num_tokens), self._target_vocab_size())

    def _draft(self, ctx: DraftContext, num_tokens: int) -> Draft:
        """The draft model's own K tokens (copies mixed into q when copy_ngram is set)."""
        assert self._cache is not None
        if ctx.batch_size == 1:
            feed = self._cache.feed(ctx.token_ids)  # [1, n >= 1] not yet in the draft cache
            siblings = self.siblings if ctx.sampling.greedy else 0  # a tree of one-hot candidates: greedy only
            curve = costs.verify_curve(self._target, MAX_TREE_NODES) if siblings and self._target is not None else None
            return draft_autoregressively(self._next_logits, feed, num_tokens, ctx, self.vocab,
                                          self._copy_source(ctx.token_ids), self.confidence_threshold, siblings, curve)
        rows = self._cache.feed(ctx)  # every row's tokens not yet in the draft cache (>= 1 each)
        return draft_autoregressively(self._next_logits, rows, num_tokens, ctx, self.vocab, self._copy_sources(ctx),
                                      self.confidence_threshold)

    # ------------------------------------------------------------------------------ internals
    def _new_index(self) -> NGramIndex:
        assert self.copy_ngram is not None
        return NGramIndex(self.copy_ngram, self.copy_max_ngram)

    def _copy_source(self, committed: Tensor) -> CopySource | None:
        """Index the new committed tokens [1, T]; the copies for this round, or None (copying off)."""
        if not self._copy_indexes:
            return None
        if len(self._copy_indexes) != 1:  # after a batch: one row again
            self._copy_indexes = [self._new_index()]
        return self._row_source(self._copy_indexes[0], committed[0])

    def _copy_sources(self, ctx: DraftContext) -> list[CopySource | None] | None:
        """Per row: index its new committed tokens; its copies for this round (None: copying off)."""
        if not self._copy_indexes:
            return None
        batch = ctx.batch_size
        if len(self._copy_indexes) != batch:  # a new batch (rows only leave through keep_rows)
            self._copy_indexes = [self._new_index() for _ in range(batch)]
        tokens = ctx.token_ids.cpu()  # [B, T] one copy for every row's index
        width = tokens.shape[1]
        return [self._row_source(index, tokens[i, width - n :])
                for i, (index, n) in enumerate(zip(self._copy_indexes, ctx.row_lengths()))]

    def _row_source(self, index: NGramIndex, committed: Tensor) -> CopySource:
        """Index a row's new committed tokens [T]; its copies for this round."""
        index.catch_up(committed)
        tail = index.tokens[-index.max_ngram :]
        return CopySource(lambda drafted: index.next_token(tail + drafted), self.copy_weight, self._target_vocab_size())

    def _target_vocab_size(self) -> int:
        """V, the target's vocabulary (q is over the target's ids even on a pruned head)."""
        assert self._head is not None
        return self.vocab.vocab_size if self.vocab is not None else int(self._head.shape[0])

    def _next_logits(self, feed: Tensor, counts: Sequence[int] | None = None) -> Tensor:
        """Run feed [B, n] after the cached positions (row i: its last counts[i] columns, None =
        all); logits for each row's next token [B, M or V]."""
        assert self._cache is not None and self._head_linear is not None
        hidden = self._cache.forward(feed, counts)  # [B, H] post-norm
        return self._head_linear(hidden).float()  # [B, M or V]
