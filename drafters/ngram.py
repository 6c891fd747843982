"""Prompt-lookup (n-gram) drafting: copy what followed the last occurrence of the current suffix.

When the output repeats the prompt (code edits, extraction, summaries that quote), the tokens after
an earlier occurrence of the last n tokens are a free, often right, draft. The drafter keeps an
incremental index {n-gram -> end position of its most recent occurrence} over the committed tokens,
so each round costs O(new tokens * n) dictionary updates instead of a scan of the whole context.
In a batch every row has its own index (a row copies only from its own prompt and output).
Deterministic: `Draft.probs` is None (one-hot q), which the verifier handles losslessly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from specdraft.protocol import Draft, DraftContext

if TYPE_CHECKING:
    from specdraft.target import TargetModel


class NGramIndex:
    """Most recent occurrence of every n-gram (min_n..max_n) in a growing token sequence.

    `propose` and `next_token` answer: where did the suffix of length n occur last, *before* the
    suffix itself?
    Grams are indexed by their end position; a gram ending at the last token is only added once
    another token follows, so a lookup never finds the suffix itself.
    """

    def __init__(self, min_ngram: int, max_ngram: int) -> None:
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.tokens: list[int] = []
        self._last_end: dict[tuple[int, ...], int] = {}
        self._indexed_upto = 0  # grams ending at positions < this are indexed

    def extend(self, new_tokens: list[int]) -> None:
        """Append tokens, then index every gram that ends before the (new) last token."""
        self.tokens.extend(new_tokens)
        toks = self.tokens
        for end in range(self._indexed_upto, len(toks) - 1):
            for n in range(self.min_ngram, min(self.max_ngram, end + 1) + 1):
                self._last_end[tuple(toks[end - n + 1 : end + 1])] = end
        self._indexed_upto = max(self._indexed_upto, len(toks) - 1)

    def catch_up(self, committed: torch.Tensor) -> None:
        """Index the tokens of committed [T] past those already indexed (a drafter's committed
        tokens only grow within a prompt); a shorter committed is a new prompt: start over."""
        if committed.shape[0] < len(self.tokens):
            self.tokens, self._last_end, self._indexed_upto = [], {}, 0
        if committed.shape[0] > len(self.tokens):
            self.extend(committed[len(self.tokens) :].tolist())

    def next_token(self, suffix: list[int]) -> int | None:
        """The token that followed the most recent indexed occurrence of the longest of suffix's
        last min_ngram..max_ngram tokens, or None. suffix may run past the indexed tokens (a
        drafter's own proposals): only occurrences whose next token is indexed are found."""
        for n in range(min(self.max_ngram, len(suffix)), self.min_ngram - 1, -1):
            end = self._last_end.get(tuple(suffix[len(suffix) - n :]))
            if end is not None:
                return self.tokens[end + 1]
        return None

    def propose(self, num_tokens: int) -> list[int]:
        """Tokens after the most recent earlier occurrence of the longest matching suffix."""
        toks = self.tokens
        for n in range(min(self.max_ngram, len(toks)), self.min_ngram - 1, -1):
            end = self._last_end.get(tuple(toks[len(toks) - n :]))
            if end is not None:
                return toks[end + 1 : end + 1 + num_tokens]
        return []


def new_row_tokens(ctx: DraftContext, have: Sequence[int]) -> list[list[int]]:
    """Each row's committed tokens past its first have[i] (have[i] <= its length): one host copy
    of the newest columns for all rows, so a round costs O(new tokens), not O(context)."""
    lengths = ctx.row_lengths()
    counts = [n - h for n, h in zip(lengths, have)]  # new tokens per row
    m = max(counts)
    if m <= 0:
        return [[] for _ in counts]
    tail = ctx.token_ids[:, ctx.token_ids.shape[1] - m :].tolist()  # [B, m] the newest columns
    return [row[m - c :] if c > 0 else [] for row, c in zip(tail, counts)]


def ngram_propose(token_ids: list[int], num_tokens: int, min_ngram: int, max_ngram: int) -> list[int]:
    """Pure function form of the matcher (used by tests and as the reference semantics)."""
    index = NGramIndex(min_ngram, max_ngram)
    index.extend(token_ids)
    return index.propose(num_tokens)


class NGramDrafter:
    """Prompt-lookup drafter. `specdraft-generate drafter=ngram drafter.max_ngram=4`.

    min_ngram / max_ngram: suffix lengths tried, longest first; the most recent occurrence wins.
    Batched: one index per row; rows whose match is shorter are padded (`Draft.lengths`).
    """

    needs_target_hidden: ClassVar[bool] = False
    feature_layers: tuple[int, ...] = ()
    draft_sources: tuple[str, ...] = ()
    hf_counterpart: ClassVar[str | None] = "hf_prompt_lookup"
    verify_curve_tokens: int = 0
    sizes_own_drafts: ClassVar[bool] = False
    batched: ClassVar[bool] = True

    def __init__(self, min_ngram: int = 1, max_ngram: int = 3) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(
                f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}."
            )
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self._indexes: list[NGramIndex] = []  # one per row of the current batch
        self.reset()

    def bind(self, target: TargetModel) -> None:
        """Nothing to share: the drafter only reads token ids."""

    def hf_peer_kwargs(self) -> dict[str, Any]:
        """No arguments of its own for HF prompt lookup: the bench sweeps the peer's
        `prompt_lookup_num_tokens` itself (bench.hf_prompt_lookup_num_tokens)."""
        return {}

    def reset(self) -> None:
        self._indexes = [NGramIndex(self.min_ngram, self.max_ngram)]

    def _rows(self, ctx: DraftContext) -> list[NGramIndex]:
        """The per-row indexes, caught up on ctx's committed tokens (another batch size than the
        indexes have, without `keep_rows`, is a new batch: start over)."""
        b = ctx.batch_size
        if len(self._indexes) != b:
            self._indexes = [NGramIndex(self.min_ngram, self.max_ngram) for _ in range(b)]
        if b == 1:
            self._indexes[0].catch_up(ctx.token_ids[0])
            return self._indexes
        for i, n in enumerate(ctx.row_lengths()):
            if n < len(self._indexes[i].tokens):  # a row shorter than its index: a new prompt
                self._indexes[i] = NGramIndex(self.min_ngram, self.max_ngram)
        for index, new in zip(self._indexes, new_row_tokens(ctx, [len(ix.tokens) for ix in self._indexes])):
            if new:
                index.extend(new)
        return self._indexes

    def source_of(self, ctx: DraftContext) -> list[int]:
        """One source."""
        return [0] * ctx.batch_size

    def propose(self, ctx: DraftContext, num_tokens: int) -> Draft:
        indexes = self._rows(ctx)
        if len(indexes) == 1:
            proposal = indexes[0].propose(num_tokens)
            return Draft(token_ids=torch.tensor([proposal], dtype=torch.long).reshape(1, len(proposal)))  # [1, K]
        proposals = [index.propose(num_tokens) for index in indexes]
        counts = [len(p) for p in proposals]
        k = max(counts)
        ids = torch.tensor([p + [0] * (k - len(p)) for p in proposals], dtype=torch.long).reshape(len(proposals), k)  # [B, K]
        lengths = None if min(counts) == k else torch.tensor(counts, dtype=torch.long)  # [B]
        return Draft(token_ids=ids, lengths=lengths)

    def learn(self, token_ids: torch.Tensor, prompt_len: int) -> dict[str, Any]:
        """Nothing is kept across requests."""
        return {}

    def commit(self, ctx: DraftContext, num_accepted: Sequence[int]) -> None:
        self._rows(ctx)

    def keep_rows(self, rows: Sequence[int]) -> None:
        self._indexes = [self._indexes[r] for r in rows]
