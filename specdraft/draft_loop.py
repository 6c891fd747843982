"""The autoregressive drafting loop: the one loop of every drafter that drafts a token at a time
with a model (a draft model, a quantized copy of the target, the target's own early exit).

They all draft the same way: feed the tokens the model has not seen, take the next-token logits,
warp them with the shared sampling rule, draw a token (the argmax at temperature 0), feed it back.
Only "how to get the next logits" differs, so that is the one argument (`next_logits`). A drafter
that runs a model of its own keeps that model's KV cache in step with the committed tokens through
`DraftCache`.

Optionally a copy source (`copy`: e.g. prompt lookup over the context) proposes the token that
followed an earlier occurrence of the current suffix; it is mixed into q as
q' = (1 - w) q + w * onehot(copy) (`mix_in_copy`), and the token is drawn from q', so the draft
stays a proper distribution and verification stays exact. Small drafts miss exactly these tokens:
they cannot copy from their context the way the target's induction heads do.
A greedy copy (weight >= 0.5) does not depend on q, so the model is not run for it: the copied
tokens are fed to it together with the next token it has to predict (one forward instead of one
per token), which makes a run of copies nearly as cheap as prompt lookup.

Optionally (`stop_below`) a round's draft ends after a token the model is unsure of: its
probability under the draft's own distribution (q; the softmax of the logits when greedy, where q
is one-hot) below the threshold, as transformers' `assistant_confidence_threshold` does. The
tokens after it would rarely be kept and each costs a draft step and a verify position. Whether
the draft goes on depends only on what the drafter computed, never on the target, so the
proposal is still a proper one and verification stays exact. A greedy copy is never unsure.

Optionally (`siblings`, greedy and batch size 1) the round becomes a candidate tree: at every
position the model ran for, its next-best guesses hang beside the drafted token as leaves
(`specdraft.tree.chain_with_siblings`). They cost no extra draft forward, only verify positions,
and where the chain misses the target often takes one of them. Given the target's verify-cost
curve, only the siblings worth their positions are kept: a sibling at depth d is taken to be
accepted with the draft's probability of the chain up to d - 1 times its own (EAGLE-2's
confidence as acceptance; a greedy copy counts as sure), and the chain plus the best siblings
maximise expected tokens per verify time (`specdraft.costs.nodes_worth_verifying`).

Batches (B > 1 rows of their own lengths, `specdraft.protocol`): the loop drafts every row at once,
one model forward per step for all rows. What a row has not fed yet is the tail of a `RowFeed`:
right aligned, so column -1 is every row's newest input and rows that feed fewer tokens are left
padded (marked with `valid`, so the padding never enters a row's cache as a token). A row that
copies greedily feeds nothing that step; the model is skipped only when every row copies.
`DraftCache` keeps each row's cached tokens and crops every row to its own common prefix with
the committed tokens. Batch size 1 runs the unpadded code path it always ran (no masks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from specdraft.costs import nodes_worth_verifying
from specdraft.protocol import Draft, DraftContext
from specdraft.sampling import draw, sample, warp
from specdraft.tree import chain_with_siblings
from specdraft.verify import leading_true
from specdraft.vocab import PrunedVocab

if TYPE_CHECKING:
    from specdraft.target import TargetModel


def mix_in_copy(q: Tensor, copy_id: int, weight: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Mix a copy proposal into the sampled draft distribution q [1, V] and draw from the mixture:
    q' = (1 - weight) q + weight * onehot(copy_id). Returns (q' [1, V], token [1]). (Greedy copies
    never mix: `draft_autoregressively` drafts the copy or ignores it.)"""
    mixed = q * (1.0 - weight)  # [1, V]
    mixed[:, copy_id] += weight
    return mixed, sample(mixed, generator)


@dataclass(frozen=True)
class CopySource:
    """Where a drafter's copies come from and how much they weigh.

    next_token(drafted so far) -> the target id to mix in, or None; weight w in
    q' = (1 - w) q + w onehot; vocab_size: the target's V (the width of a greedy copy's one-hot q).
    """

    next_token: Callable[[list[int]], int | None]
    weight: float
    vocab_size: int


@dataclass(frozen=True)
class RowFeed:
    """What B rows feed a model in one forward: row i's inputs are the last counts[i] columns of
    tokens [B, n] (right aligned, left padded: column -1 is every feeding row's newest input);
    counts None = every row feeds all n. A row with count 0 feeds nothing (all padding)."""

    tokens: Tensor
    counts: tuple[int, ...] | None = None

    def valid(self) -> Tensor | None:
        """[B, n] bool, which columns are real inputs (None when all are)."""
        return None if self.counts is None else feed_valid(self.tokens.shape[1], self.counts)


def feed_valid(n: int, counts: Sequence[int]) -> Tensor:
    """[B, n] bool (CPU): row i's last counts[i] of n columns are real, the ones before padding."""
    pad = torch.tensor([n - c for c in counts], dtype=torch.long)  # [B]
    return torch.arange(n)[None] >= pad[:, None]


def draft_autoregressively(
    next_logits: Callable[..., Tensor],
    feed: Tensor | RowFeed,
    num_tokens: int,
    ctx: DraftContext,
    vocab: PrunedVocab | None = None,
    copy: CopySource | Sequence[CopySource | None] | None = None,
    stop_below: float | None = None,
    siblings: int = 0,
    curve: Sequence[float] | None = None,
) -> Draft:
    """Draft up to num_tokens tokens one at a time and return them with their q.

    next_logits(feed [1, n]) -> logits [1, M or V] for the token after feed (it appends feed to
    the drafter's own cache). feed [1, n >= 1]: the committed tokens the cache has not seen yet.
    vocab: the pruned draft vocabulary the logits are over (M columns), or None (V columns);
    q is always returned over the target's V ids (zeros outside the subset), so verification
    stays exact. copy: mixes copies of earlier context into q (module docstring), or None.
    stop_below: end the draft after a token whose probability is below it (module docstring);
    None = always num_tokens. siblings: at greedy decoding of one row, add the model's next
    `siblings` best tokens at each position it ran for as leaves (module docstring): the draft is
    then a candidate tree of depth <= num_tokens (`Draft.parents`; q is not needed); 0 = a chain.
    curve: the target's verify-cost curve (`specdraft.costs.verify_curve`): keep only the siblings
    it pays for (module docstring); None = every sibling.

    Batches (ctx.batch_size > 1): feed is a `RowFeed` (or [B, n] tokens that are all real), copy
    one source per row (or None), and next_logits(tokens [B, n], counts) -> [B, M or V] the logits
    after each row's last column, where counts (a tuple, or None = all n) says how many of the
    last columns of each row are real (`RowFeed`); every row drafts num_tokens tokens, or with
    stop_below up to its own unsure token (`Draft.lengths`; the loop ends when every row has).
    """
    rows = ctx.batch_size > 1 or isinstance(feed, RowFeed) or not (copy is None or isinstance(copy, CopySource))
    if siblings and (rows or not ctx.sampling.greedy):
        raise ValueError(
            f"siblings={siblings} needs greedy decoding of one row: a tree's candidates are verified as "
            "one-hot drafts, which would lose the q ratio at temperature > 0; draft a chain (siblings=0) there."
        )
    if rows:
        return _draft_rows(next_logits, feed, num_tokens, ctx, vocab, copy, stop_below)
    # Greedy drafts are one-hot, so the mixture's argmax is the copy when w >= 0.5 (ties go to the
    # copy) and the draft's own token otherwise: below 0.5 a greedy draft never uses a copy.
    greedy = ctx.sampling.greedy
    lookup = copy if copy is not None and not (greedy and copy.weight < 0.5) else None
    tokens, probs = [], []
    drafted: list[int] = []
    others: list[list[tuple[int, float]]] = []  # per position: the model's next-best (token, probability)
    sure_of: list[float] = []  # per position: the model's probability of the drafted token (a copy: 1)
    for _ in range(num_tokens):
        copy_id = lookup.next_token(drafted) if lookup is not None else None
        best: list[tuple[int, float]] = []  # the model's top siblings + 1 (token id, probability) where it ran
        own = 1.0  # the model's probability of the drafted token (siblings only)
        if copy_id is not None and greedy:
            assert lookup is not None
            tok = feed.new_full((1,), copy_id)  # [1] the copy, whatever q says: q is not computed
            q = torch.zeros((1, lookup.vocab_size), device=feed.device).scatter_(-1, tok[:, None], 1.0)  # [1, V]
            feed = torch.cat([feed, tok[:, None]], dim=1)  # [1, n + 1] fed with the next forward
            sure = True
        else:
            logits = next_logits(feed)  # [1, M or V]
            if siblings:
                top_p, top = torch.softmax(logits[0].float(), dim=-1).topk(min(siblings + 1, logits.shape[-1]))  # [s + 1]
                ids = (vocab.to_target(top) if vocab is not None else top).tolist()
                best = list(zip(ids, top_p.tolist()))
                own = best[0][1]  # greedy: the drafted token is the top one
            q = warp(logits, ctx.sampling)  # [1, M or V]
            if copy_id is None:
                tok = draw(q, ctx.sampling, ctx.generator)  # [1] index into the logits' columns
                sure = stop_below is None or confidence(logits, q, tok, greedy)[0] >= stop_below
                if vocab is not None:
                    q, tok = vocab.expand(q), vocab.to_target(tok)  # [1, V], [1] target id
            else:
                assert lookup is not None
                q = vocab.expand(q) if vocab is not None else q  # [1, V]
                q, tok = mix_in_copy(q, copy_id, lookup.weight, ctx.generator)
                sure = stop_below is None or float(q[0, tok[0]]) >= stop_below
            feed = tok[:, None]  # [1, 1]
        if lookup is not None:
            drafted.append(int(tok))
        tokens.append(tok)
        probs.append(q)
        if siblings:
            others.append([(t, p) for t, p in best if t != int(tok)][:siblings])
            sure_of.append(own)
        if not sure:
            break
    if not tokens:
        return Draft(token_ids=ctx.token_ids.new_zeros((ctx.token_ids.shape[0], 0)))
    chain = torch.stack(tokens, dim=1)  # [1, K]
    kept = worth_verifying(others, sure_of, curve) if siblings else []
    if any(kept):
        nodes, parents = chain_with_siblings(chain[0].tolist(), kept)
        return Draft(token_ids=torch.tensor([nodes], device=chain.device),  # [1, N] a candidate tree
                     parents=torch.tensor([parents], device=chain.device))
    return Draft(token_ids=chain, probs=torch.stack(probs, dim=1))  # [1, K], [1, K, V]


def worth_verifying(others: Sequence[Sequence[tuple[int, float]]], sure_of: Sequence[float],
                    curve: Sequence[float] | None) -> list[list[int]]:
    """The siblings kept per chain position (best first): all when curve is None, else the best by
    path probability as far as the verify-cost curve pays (module docstring). others[d]: (token,
    draft probability) beside chain position d; sure_of[d]: the draft's probability of the chain's
    token there."""
    if curve is None:
        return [[t for t, _ in alts] for alts in others]
    path, reach = [], 1.0  # path[d]: the draft's probability of the chain through position d
    scored = []  # (probability of the sibling's path, position, rank)
    for d, (alts, own) in enumerate(zip(others, sure_of)):
        scored += [(reach * p, d, r) for r, (_, p) in enumerate(alts)]
        reach *= own
        path.append(reach)
    scored.sort(key=lambda s: -s[0])
    n = nodes_worth_verifying([s[0] for s in scored], curve, fixed=path)
    chosen = {(d, r) for _, d, r in scored[:n]}
    return [[t for r, (t, _) in enumerate(alts) if (d, r) in chosen] for d, alts in enumerate(others)]


def confidence(logits: Tensor, q: Tensor, tok: Tensor, greedy: bool) -> list[float]:
    """Per row, the drawn token's probability under the draft's distribution: q [B, M] (warped),
    or softmax(logits [B, M]) when greedy (q is one-hot there); tok [B] indexes the columns."""
    dist = torch.softmax(logits.float(), dim=-1) if greedy else q  # [B, M]
    return dist.gather(-1, tok.to(dist.device)[:, None])[:, 0].tolist()


def _one_hot(ids: Tensor, width: int) -> Tensor:
    """float32 one-hot rows [B, width] at ids [B]."""
    return torch.zeros((ids.shape[0], width), device=ids.device).scatter_(-1, ids[:, None], 1.0)


def _draft_rows(
    next_logits: Callable[..., Tensor],
    feed: Tensor | RowFeed,
    num_tokens: int,
    ctx: DraftContext,
    vocab: PrunedVocab | None,
    copy: CopySource | Sequence[CopySource | None] | None,
    stop_below: float | None = None,
) -> Draft:
    """`draft_autoregressively` for B rows: one forward per step for all rows, unless every row copies.

    Per row the same rule as at batch size 1: a greedy copy (weight >= 0.5) is drafted without q
    and fed with the next forward; a sampled copy is mixed into the row's q. A step whose rows all
    copy runs no forward; otherwise every row feeds what it owes with it, a copying row too (its q
    stays the copy's). Were a copying row left out, a row that keeps finding copies would owe more
    every round until one forward fed its whole tail, computed for every row of the batch (a
    padded forward as wide as the longest tail). The rows' unfed tokens are the right-aligned tail
    of `tokens` (counts[i] columns of row i): a drafted token appends a column, and after a forward
    every row keeps only that one."""
    batch = ctx.batch_size
    sampling, gen = ctx.sampling, ctx.generator
    greedy = sampling.greedy
    if isinstance(feed, Tensor):
        feed = RowFeed(feed)
    tokens = feed.tokens  # [B, n]
    device = tokens.device
    counts = list(feed.counts) if feed.counts is not None else [int(tokens.shape[1])] * batch
    sources = [copy] * batch if copy is None or isinstance(copy, CopySource) else list(copy)
    if len(sources) != batch:
        raise ValueError(f"one copy source per row: got {len(sources)} for {batch} rows.")
    lookups = [s if s is not None and not (greedy and s.weight < 0.5) else None for s in sources]
    active = any(s is not None for s in lookups)
    drafted: list[list[int]] = [[] for _ in range(batch)]
    lengths = [num_tokens] * batch  # a row's draft ends after its first unsure token (stop_below)
    out_tokens, out_probs = [], []
    for step in range(num_tokens):
        copies = [s.next_token(d) if s is not None else None for s, d in zip(lookups, drafted)] \
            if active else [None] * batch
        skip = [greedy and c is not None for c in copies]  # greedy copies: the model is not asked
        copy_ids = torch.tensor([c if c is not None else 0 for c in copies], dtype=torch.long, device=device) \
            if active else None  # [B]
        if all(skip):
            assert copy_ids is not None
            tok = copy_ids  # [B]
            width = next(s.vocab_size for s in lookups if s is not None)
            q = _one_hot(tok, width)  # [B, V]
        else:
            n = max(counts)  # every row feeds what it owes (see the docstring)
            logits = next_logits(tokens[:, -n:], None if min(counts) == n else tuple(counts))  # [B, M or V]
            q = warp(logits, sampling)  # [B, M or V]
            mixed = [not greedy and c is not None for c in copies]  # sampled copies mix into q
            if any(mixed):
                assert copy_ids is not None
                q = vocab.expand(q) if vocab is not None else q  # [B, V]
                weights = torch.tensor([s.weight if m and s is not None else 0.0 for s, m in zip(lookups, mixed)],
                                       device=q.device)[:, None]  # [B, 1] (0 = q unchanged)
                q = q * (1.0 - weights) + weights * _one_hot(copy_ids.to(q.device), q.shape[1])
                tok = sample(q, gen)  # [B]
                sure = confidence(q, q, tok, False) if stop_below is not None else None
            else:
                tok = draw(q, sampling, gen)  # [B] index into the logits' columns
                sure = confidence(logits, q, tok, greedy) if stop_below is not None else None
                if vocab is not None:
                    q, tok = vocab.expand(q), vocab.to_target(tok)  # [B, V], [B] target ids
            if sure is not None:
                assert stop_below is not None
                for row, p in enumerate(sure):
                    if p < stop_below and not skip[row] and lengths[row] == num_tokens:
                        lengths[row] = step + 1
            if any(skip):
                assert copy_ids is not None
                mask = torch.tensor(skip, device=q.device)  # [B]
                q = torch.where(mask[:, None], _one_hot(copy_ids.to(q.device), q.shape[1]), q)
                tok = torch.where(mask.to(tok.device), copy_ids.to(tok.device), tok)
        tok = tok.to(device)
        counts = [c + 1 for c in counts] if all(skip) else [1] * batch  # no forward: every row still owes its tokens
        longest = max(counts)
        tokens = torch.cat([tokens, tok[:, None]], dim=1)[:, -longest:] if longest > 1 else tok[:, None]
        if active:
            for d, t in zip(drafted, tok.tolist()):
                d.append(t)
        out_tokens.append(tok)
        out_probs.append(q)
        if max(lengths) <= step + 1:  # every row has ended its draft
            break
    if not out_tokens:
        return Draft(token_ids=ctx.token_ids.new_zeros((batch, 0)))
    k = len(out_tokens)
    real = None if min(lengths) >= k else torch.tensor([min(n, k) for n in lengths], dtype=torch.long)  # [B]
    return Draft(token_ids=torch.stack(out_tokens, dim=1), probs=torch.stack(out_probs, dim=1), lengths=real)  # [B, K], [B, K, V]


def _committed(committed: Tensor | DraftContext) -> tuple[Tensor, tuple[int, ...] | None]:
    """(token ids [B, T] left padded, each row's length or None = all T)."""
    if isinstance(committed, DraftContext):
        return committed.token_ids, committed.lengths
    return committed, None


class DraftCache:
    """A drafting model's own KV cache, kept in step with the committed tokens.

    runner: the drafting model as a `TargetModel` (the fast stack when its layers allow it, the
    Hugging Face stack otherwise, e.g. for quantized layers). Between rounds the cache keeps the
    longest prefix of its tokens that matches the committed ones, so the recovered / bonus token
    (and a fully accepted last draft token) are fed next round without recomputing the prefix, and
    a rejected draft never leaves stale K/V behind.

    Batches: every row keeps its own longest common prefix (the runner's rows are cropped each to
    its own length, `TargetModel.crop` with a list, and become ragged), `feed` returns the rows'
    missing tokens as one `RowFeed`, and `keep_rows` follows the batch when rows finish. The
    invariant: `row_lengths()` equals the runner's `row_lengths()`, and row i's cached tokens are
    the first row_lengths()[i] of what it was fed.
    """

    def __init__(self, runner: TargetModel) -> None:
        self.runner = runner
        self._ids: Tensor | None = None  # [B, L] tokens whose K/V the runner caches (row i: its first lens[i])
        self._lens: list[int] | None = None  # each row's cached tokens when rows differ; None = all L

    @property
    def length(self) -> int:
        """Positions cached (the longest row's, in a batch)."""
        return 0 if self._ids is None else int(self._ids.shape[1])

    def row_lengths(self) -> list[int]:
        """Each row's cached tokens ([] while nothing is cached)."""
        if self._ids is None:
            return []
        return list(self._lens) if self._lens is not None else [int(self._ids.shape[1])] * int(self._ids.shape[0])

    def ids(self, row: int) -> Tensor:
        """Row `row`'s cached tokens [L_i]."""
        if self._ids is None:
            raise ValueError("the draft cache is empty.")
        return self._ids[row, : self.row_lengths()[row]]

    def reset(self) -> None:
        """New prompt: an empty cache."""
        self.runner.reset()
        self._ids = None
        self._lens = None

    def sync(self, committed: Tensor | DraftContext) -> None:
        """Crop the cache to the longest common prefix of its tokens and committed [1, T] (or,
        per row, of each row's and the context's row: a `DraftContext` or [B, T] all full)."""
        tokens, lengths = _committed(committed)
        if self._ids is None:
            return
        if self._ids.shape[0] != tokens.shape[0]:  # another batch: a new prompt
            self.reset()
            return
        if tokens.shape[0] == 1:
            n = min(self._ids.shape[1], tokens.shape[1])
            same = (self._ids[0, :n] == tokens[0, :n].to(self._ids.device)).long()  # [n]
            self._crop(int(same.cumprod(0).sum()))
            return
        self._crop_rows(self._common_prefix(tokens, lengths))

    def feed(self, committed: Tensor | DraftContext) -> Tensor | RowFeed:
        """Sync with committed [1, T] and return the tokens the cache has not seen [1, n >= 1]
        (when everything is cached, the newest token is dropped from the cache and fed again:
        its logits are the ones the next draft token needs). A batch (B > 1) gets a `RowFeed`:
        every row's missing tokens (>= 1 each), right aligned, in one [B, n] block."""
        tokens, lengths = _committed(committed)
        if tokens.shape[0] == 1:
            self.sync(tokens)
            if self.length >= tokens.shape[1]:
                self._crop(tokens.shape[1] - 1)
            return tokens[:, self.length :]
        batch, width = tokens.shape
        theirs = list(lengths) if lengths is not None else [int(width)] * batch
        if self._ids is not None and self._ids.shape[0] != batch:
            self.reset()
        if self._ids is not None:
            prefix = self._common_prefix(tokens, lengths)
            self._crop_rows([min(p, t - 1) for p, t in zip(prefix, theirs)])
        mine = self.row_lengths() or [0] * batch
        need = [t - m for t, m in zip(theirs, mine)]  # >= 1 each
        n = max(need)
        return RowFeed(tokens[:, width - n :], None if min(need) == n else tuple(need))

    def forward(self, feed: Tensor, counts: Sequence[int] | None = None) -> Tensor:
        """Run feed [B, n] after the cached positions; post-norm hidden [B, H] of the last one.
        counts: per row, how many of the last columns are real (`RowFeed`); None = all."""
        valid = None if counts is None else feed_valid(feed.shape[1], counts)
        hidden = self.runner.forward(feed, num_logits=0, valid=valid).hidden[:, -1]  # [B, H]
        if counts is None and self._lens is None:
            self._ids = feed if self._ids is None else torch.cat([self._ids, feed.to(self._ids.device)], dim=1)
        else:
            self._append_rows(feed, counts)
        return hidden

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Only these rows (indices into the current batch, in order) go on."""
        rows = [int(r) for r in rows]
        if self._ids is None:  # nothing cached: the runner's next forward sets its rows
            return
        if rows == list(range(self._ids.shape[0])):
            return
        mine = self.row_lengths()
        kept = [mine[r] for r in rows]
        if not kept or max(kept) == 0:
            self.reset()
            return
        self.runner.keep_rows(rows)
        width = max(kept)
        index = torch.tensor(rows, dtype=torch.long, device=self._ids.device)
        self._ids = self._ids.index_select(0, index)[:, :width]
        self._lens = None if min(kept) == width else kept

    def _crop(self, keep: int) -> None:
        """Keep the first `keep` cached positions."""
        if self._ids is None or keep >= self._ids.shape[1]:
            return
        if keep <= 0:
            self.reset()
            return
        self.runner.crop(keep)
        self._ids = self._ids[:, :keep]

    def _crop_rows(self, keep: Sequence[int]) -> None:
        """Keep the first keep[i] cached tokens of row i."""
        if self._ids is None:
            return
        mine = self.row_lengths()
        keep = [min(int(k), m) for k, m in zip(keep, mine)]
        if keep == mine:
            return
        width = max(keep)
        if width <= 0:
            self.reset()
            return
        self.runner.crop(keep)
        self._ids = self._ids[:, :width]
        self._lens = None if min(keep) == width else keep

    def _common_prefix(self, tokens: Tensor, lengths: Sequence[int] | None) -> list[int]:
        """Per row, how many leading cached tokens equal the row's committed ones (one host sync)."""
        assert self._ids is not None
        batch, width = tokens.shape
        mine = self.row_lengths()
        theirs = list(lengths) if lengths is not None else [int(width)] * batch
        n = min(int(self._ids.shape[1]), int(width))
        if n == 0:
            return [0] * batch
        device = self._ids.device
        cols = torch.arange(n, device=device)  # [n]
        tokens = tokens.to(device)
        if lengths is None:
            left = tokens[:, :n]  # [B, n]
        else:  # the context is left padded: move each row's tokens to column 0
            shift = torch.tensor([width - t for t in theirs], dtype=torch.long, device=device)  # [B]
            left = tokens.gather(1, (shift[:, None] + cols[None]).clamp(max=width - 1))  # [B, n]
        limit = torch.tensor([min(a, b) for a, b in zip(mine, theirs)], dtype=torch.long, device=device)  # [B]
        same = (self._ids[:, :n] == left) & (cols[None] < limit[:, None])  # [B, n]
        return [int(x) for x in leading_true(same).tolist()]

    def _append_rows(self, feed: Tensor, counts: Sequence[int] | None) -> None:
        """Row i's last counts[i] columns of feed [B, n] were cached after its own tokens."""
        batch, n = feed.shape
        mine = self.row_lengths() or [0] * batch
        cnt = list(counts) if counts is not None else [int(n)] * batch
        new = [m + c for m, c in zip(mine, cnt)]
        width = max(new)
        device = feed.device if self._ids is None else self._ids.device
        ids = torch.zeros((batch, width + 1), dtype=torch.long, device=device)  # + a column for the padding
        if self._ids is not None:
            ids[:, : self._ids.shape[1]] = self._ids
        start = torch.tensor([m - (n - c) for m, c in zip(mine, cnt)], dtype=torch.long, device=device)  # [B]
        dest = start[:, None] + torch.arange(n, device=device)[None]  # [B, n]
        real = dest >= torch.tensor(mine, dtype=torch.long, device=device)[:, None]
        ids.scatter_(1, torch.where(real, dest, width), feed.to(device))
        self._ids = ids[:, :width]
        self._lens = None if min(new) == width else new
