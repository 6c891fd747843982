"""Prompt-lookup (n-gram) drafting: copy what followed the last occurrence of the current suffix.

When the output repeats the prompt (code edits, extraction, summaries that quote), the tokens after
an earlier occurrence of the last n tokens are a free, often right, draft. The drafter keeps an
incremental index {n-gram -> end position of its most recent occurrence} over the committed tokens,
so each round costs O(new tokens * n) dictionary updates instead of a scan of the whole context.
Deterministic: `Draft.probs` is None (one-hot q), which the verifier handles losslessly.
"""

from __future__ import annotations

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


def ngram_propose(token_ids: list[int], num_tokens: int, min_ngram: int, max_ngram: int) -> list[int]:
    """Pure function form of the matcher (used by tests and as the reference semantics)."""
    index = NGramIndex(min_ngram, max_ngram)
    index.extend(token_ids)
    return index.propose(num_tokens)


class NGramDrafter:
    """Prompt-lookup drafter. `specdraft-generate drafter=ngram drafter.max_ngram=4`.

    min_ngram / max_ngram: suffix lengths tried, longest first; the most recent occurrence wins.
    """

    needs_target_hidden: ClassVar[bool] = False
    hf_counterpart: ClassVar[str | None] = "hf_prompt_lookup"
    verify_curve_tokens: ClassVar[int] = 0
    sizes_own_drafts: ClassVar[bool] = False

    def __init__(self, min_ngram: int = 1, max_ngram: int = 3) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(
                f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}."
            )
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self._index = NGramIndex(min_ngram, max_ngram)

    def bind(self, target: TargetModel) -> None:
        """Nothing to share: the drafter only reads token ids."""

    def hf_peer_kwargs(self) -> dict[str, Any]:
        """No arguments of its own for HF prompt lookup: the bench sweeps the peer's
        `prompt_lookup_num_tokens` itself (bench.hf_prompt_lookup_num_tokens)."""
        return {}

    def reset(self) -> None:
        self._index = NGramIndex(self.min_ngram, self.max_ngram)

    def propose(self, ctx: DraftContext, num_tokens: int) -> Draft:
        if ctx.token_ids.shape[0] != 1:
            raise NotImplementedError("NGramDrafter supports batch size 1.")
        self._index.catch_up(ctx.token_ids[0])
        proposal = self._index.propose(num_tokens)
        ids = torch.tensor([proposal], dtype=torch.long).reshape(1, len(proposal))  # [1, K]
        return Draft(token_ids=ids)

    def learn(self, token_ids: torch.Tensor, prompt_len: int) -> dict[str, Any]:
        """Nothing is kept across requests."""
        return {}

    def commit(self, ctx: DraftContext, num_accepted: int) -> None:
        self._index.catch_up(ctx.token_ids[0])
