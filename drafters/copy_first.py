"""Copy first: rows whose recent tokens occurred earlier draft the copy, the others the model's draft.

A trained drafter guesses new text from what it learned; where the text repeats itself (quotes, names,
code edits, a multi-turn chat that returns to earlier words) copying what followed the earlier
occurrence is right far more often, and costs nothing. SAM-Decoding (Hu et al., 2024) combines the
two the same way: a retrieval draft where the current suffix matched earlier text, the model's draft
elsewhere. The choice depends only on the committed tokens, never on a random draw, so each round's
q is still a well-defined proposal (one-hot for a copy) and verification stays lossless.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from drafters.ngram import NGramDrafter
from specdraft.protocol import Draft, DraftContext


class CopyFirst:
    """The copy source of a model drafter: the n-gram drafter over each row's committed tokens (the
    last min_ngram..max_ngram tokens, longest first, the most recent occurrence), or off (min_ngram
    None). The owning drafter forwards reset / commit / keep_rows and drafts through `propose`."""

    def __init__(self, min_ngram: int | None, max_ngram: int) -> None:
        if min_ngram is not None and not 1 <= min_ngram <= max_ngram:
            raise ValueError(
                f"need 1 <= copy_ngram <= copy_max_ngram, got copy_ngram={min_ngram}, "
                f"copy_max_ngram={max_ngram}; set copy_ngram=null to draft with the model alone."
            )
        self._ngram = None if min_ngram is None else NGramDrafter(min_ngram, max_ngram)

    @property
    def sources(self) -> tuple[str, ...]:
        """The owning drafter's `draft_sources`: ("copy", "model"), or () when copying is off."""
        return () if self._ngram is None else ("copy", "model")

    def source_of(self, ctx: DraftContext) -> list[int]:
        """Per row, 0 where the row's context repeats (a copy drafts next), else 1 (the model); all 0
        when copying is off (one source)."""
        if self._ngram is None:
            return [0] * ctx.batch_size
        found = self._ngram.propose(ctx, 1)
        lengths = found.lengths.tolist() if found.lengths is not None else [found.num_tokens] * ctx.batch_size
        return [0 if n > 0 else 1 for n in lengths]

    def propose(self, ctx: DraftContext, num_tokens: int, model: Callable[[], Draft], vocab_size: int) -> Draft:
        """Each row's copy where its context repeats, else `model()`'s draft (`copy_first`)."""
        if self._ngram is None or num_tokens <= 0:
            return model()
        return copy_first(self._ngram.propose(ctx, num_tokens), model, vocab_size)

    def reset(self) -> None:
        if self._ngram is not None:
            self._ngram.reset()

    def commit(self, ctx: DraftContext, num_accepted: Sequence[int]) -> None:
        if self._ngram is not None:
            self._ngram.commit(ctx, num_accepted)

    def keep_rows(self, rows: Sequence[int]) -> None:
        if self._ngram is not None:
            self._ngram.keep_rows(rows)


def copy_first(copy: Draft, model: Callable[[], Draft], vocab_size: int) -> Draft:
    """Each row's copy where it has one (copy: a deterministic chain, `Draft.lengths` 0 = no match),
    else the model's draft for that row; `model` is called only when some row has no copy.

    At batch size 1 the model's draft is returned as it is (a chain or a candidate tree). In a batch
    the model's draft must be a chain; rows are padded to the longest (`Draft.lengths`), and when the
    model returns q (`Draft.probs`, sampling) copied rows get a one-hot q over `vocab_size` ids.
    """
    batch, k_copy = copy.token_ids.shape
    copy_len = copy.lengths.tolist() if copy.lengths is not None else [k_copy] * batch
    if min(copy_len) > 0:
        return copy
    drafted = model()
    if batch == 1:
        return drafted
    if drafted.parents is not None:
        raise ValueError("copy_first merges chains in a batch; a candidate tree verifies at batch size 1 only.")
    k_model = drafted.num_tokens
    model_len = drafted.lengths.tolist() if drafted.lengths is not None else [k_model] * batch
    if max(copy_len) == 0:
        return drafted
    use_copy = [n > 0 for n in copy_len]
    lengths = [c if u else m for c, m, u in zip(copy_len, model_len, use_copy)]
    k = max(lengths)
    ids = torch.zeros((batch, k), dtype=torch.long, device=drafted.token_ids.device)  # [B, K]
    probs = None
    if drafted.probs is not None:
        probs = torch.zeros((batch, k, vocab_size), dtype=drafted.probs.dtype, device=drafted.probs.device)  # [B, K, V]
    for row, (n, copied) in enumerate(zip(lengths, use_copy)):
        if copied:
            ids[row, :n] = copy.token_ids[row, :n].to(ids.device)
            if probs is not None:
                probs[row, torch.arange(n), ids[row, :n].to(probs.device)] = 1.0
        else:
            ids[row, :n] = drafted.token_ids[row, :n]
            if probs is not None:
                probs[row, :n] = drafted.probs[row, :n]
    if probs is not None:
        probs[:, :, 0] += (torch.arange(k, device=probs.device)[None] >= torch.tensor(lengths, device=probs.device)[:, None]).to(probs.dtype)  # padding: a valid one-hot
    same = min(lengths) == k
    return Draft(token_ids=ids, probs=probs, lengths=None if same else torch.tensor(lengths, dtype=torch.long))
