"""Where has the current suffix been seen before, and what followed it how often?

Suffix decoding (SuffixDecoding; vLLM's `suffix` method) drafts the continuations that most often
followed the longest match of the current context's suffix, in the current request and in earlier
ones. This module is that lookup, as plain data structures with no model in sight:

- `SuffixIndex`: every occurrence of every n-gram (n = 1..anchor) in a set of token sequences,
  indexed by the gram, oldest occurrence first. A sequence may grow (the current request: O(anchor)
  dictionary updates per new token); a bounded index evicts whole sequences, oldest first, to stay
  within `max_tokens` (the global store). `match` finds the longest suffix of a context that occurs
  with a continuation: the longest indexed gram first, then, for each of its most recent
  occurrences, how much further back the agreement goes (up to `max_match` tokens), so matches
  longer than the indexed grams are found without indexing them.
- `continuation_tree`: the tokens that followed the matched occurrences, merged into a counted tree
  of candidates (node probability = the share of occurrences that continue through it, i.e. the
  product of count(child) / count(parent) down its path), best first, parents first.

A depth-bounded suffix trie (Arctic Inference) keeps counts in O(tokens x depth) nodes; this index
keeps O(tokens x anchor) positions and counts continuations on the fly from the matched occurrences
only, which is what a round needs.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Match:
    """The longest matched suffix: its length and the occurrences (sequence id, end position of
    the match in that sequence) that agree with the context over all `length` tokens."""

    length: int
    occurrences: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Candidate:
    """One node of a continuation tree: its token, its parent node (-1 = the context's newest
    token), its depth (1 = right after the context) and its estimated probability of being
    the continuation (the share of matched occurrences that continue through it)."""

    token: int
    parent: int
    depth: int
    prob: float


class SuffixIndex:
    """Occurrences of every n-gram (n = 1..anchor) in a set of sequences (module docstring).

    anchor: the longest gram that is indexed; matches up to `max_match` tokens are found by
        extending an anchor-long match backwards.
    max_tokens: the most tokens kept over all sequences (None = unbounded); adding past it evicts
        the oldest sequences whole (a single sequence longer than the budget keeps its last
        max_tokens tokens).
    """

    def __init__(self, anchor: int = 4, max_tokens: int | None = None) -> None:
        if anchor < 1:
            raise ValueError(f"anchor must be >= 1 (the longest indexed n-gram), got {anchor}.")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be None (unbounded) or >= 1, got {max_tokens}.")
        self.anchor = anchor
        self.max_tokens = max_tokens
        self.sequences: dict[int, list[int]] = {}  # id -> tokens, in insertion order (oldest first)
        self._occurrences: dict[tuple[int, ...], deque[tuple[int, int]]] = {}  # gram -> (id, end), oldest first
        self._indexed: dict[int, int] = {}  # id -> grams ending before this position are indexed
        self._next_id = 0
        self.num_tokens = 0

    # ------------------------------------------------------------------------------- building
    def add(self, tokens: Sequence[int]) -> int:
        """A new sequence, e.g. a finished request's tokens; returns its id."""
        seq = self.start()
        self.extend(seq, tokens)
        return seq

    def start(self) -> int:
        """A new, empty sequence that grows with `extend` (the current request); returns its id."""
        seq = self._next_id
        self._next_id += 1
        self.sequences[seq] = []
        self._indexed[seq] = 0
        return seq

    def extend(self, seq: int, tokens: Sequence[int]) -> None:
        """Append tokens to sequence `seq` and index every gram that ends before its last token
        (a gram ending at the last token has no continuation yet). Evicts to stay in budget."""
        toks = self.sequences[seq]
        if self.max_tokens is not None and seq != self._next_id - 1:
            raise ValueError("a bounded index grows only its newest sequence (eviction keeps the oldest's "
                             "occurrences first); add finished sequences with add().")
        if self.max_tokens is not None and len(tokens) > self.max_tokens:
            tokens = tokens[len(tokens) - self.max_tokens :]
        toks.extend(int(t) for t in tokens)
        self.num_tokens += len(tokens)
        self._index(seq, len(toks) - 1)
        self._evict(keep=seq)

    def _index(self, seq: int, upto: int) -> None:
        """Index the grams of `seq` ending at positions [indexed, upto)."""
        occ = self._occurrences
        for end, gram in self._grams(self.sequences[seq], self._indexed[seq], upto):
            places = occ.get(gram)
            if places is None:
                occ[gram] = places = deque()
            places.append((seq, end))
        self._indexed[seq] = max(self._indexed[seq], upto)

    def _grams(self, toks: list[int], start: int, stop: int) -> Iterator[tuple[int, tuple[int, ...]]]:
        """(end, gram) for every gram of 1..anchor tokens of `toks` ending at positions [start, stop)."""
        for end in range(start, stop):
            for n in range(1, min(self.anchor, end + 1) + 1):
                yield end, tuple(toks[end - n + 1 : end + 1])

    def _evict(self, keep: int) -> None:
        """Drop the oldest sequences (never `keep`, the one being written) while over budget."""
        if self.max_tokens is None:
            return
        while self.num_tokens > self.max_tokens:
            oldest = next(iter(self.sequences))
            if oldest == keep:  # the budget is smaller than this one sequence: drop its head
                self._drop_head(keep, self.num_tokens - self.max_tokens)
                return
            self._drop(oldest)

    def _drop(self, seq: int) -> None:
        """Remove sequence `seq` (the oldest) and its occurrences, which lead every deque."""
        toks = self.sequences.pop(seq)
        indexed = self._indexed.pop(seq)
        self.num_tokens -= len(toks)
        for _, gram in self._grams(toks, 0, indexed):
            places = self._occurrences[gram]
            places.popleft()
            if not places:
                del self._occurrences[gram]

    def _drop_head(self, seq: int, count: int) -> None:
        """Re-index `seq` without its first `count` tokens (only when it alone exceeds the budget)."""
        tail = self.sequences[seq][count:]
        self._drop(seq)
        self.sequences[seq] = tail
        self._indexed[seq] = 0
        self.num_tokens += len(tail)
        self._index(seq, len(tail) - 1)

    # ------------------------------------------------------------------------------- lookup
    def match(self, context: Sequence[int], max_match: int, max_occurrences: int) -> Match | None:
        """The longest suffix of `context` (at most max_match tokens) that occurs in the index
        with a continuation, and its most recent occurrences (at most max_occurrences are
        examined); None when not even the last token occurs."""
        occ = self._occurrences
        for n in range(min(self.anchor, len(context), max_match), 0, -1):
            places = occ.get(tuple(context[len(context) - n :]))
            if places is None:
                continue
            recent = [places[-1 - i] for i in range(min(max_occurrences, len(places)))]
            if n < self.anchor:  # a longer agreement would have matched a longer gram
                return Match(n, tuple(recent))
            lengths = [self._agreement(context, seq, end, max_match) for seq, end in recent]
            best = max(lengths)
            return Match(best, tuple(o for o, m in zip(recent, lengths) if m == best))
        return None

    def _agreement(self, context: Sequence[int], seq: int, end: int, max_match: int) -> int:
        """How many tokens context's suffix and sequence `seq` ending at `end` share (<= max_match)."""
        toks = self.sequences[seq]
        limit = min(max_match, len(context), end + 1)
        n = self.anchor
        while n < limit and toks[end - n] == context[len(context) - 1 - n]:
            n += 1
        return n

    def continuations(self, match: Match, depth: int) -> list[list[int]]:
        """The (up to `depth`) tokens after each matched occurrence."""
        return [self.sequences[seq][end + 1 : end + 1 + depth] for seq, end in match.occurrences]

    def memory_bytes(self) -> int:
        """An estimate of the index's memory in CPython, calibrated with tracemalloc: 36 bytes per
        stored token id, 64 per occurrence entry (a pair in a deque), 700 per distinct gram (its
        key, dictionary slot and deque)."""
        entries = sum(len(p) for p in self._occurrences.values())
        return 36 * self.num_tokens + 64 * entries + 700 * len(self._occurrences)


def continuation_tree(windows: Iterable[Sequence[int]], max_nodes: int, min_prob: float,
                      prior: float = 0.0, trust: float = 1.0) -> list[Candidate]:
    """The windows' continuations merged into a tree of counted candidates: the (at most
    max_nodes) most probable nodes with probability >= min_prob, parents before children.

    A node's probability is count(node) / (number of windows + prior) x trust^depth: `prior`
    pseudo-windows that continue with none of the candidates keep a few occurrences from promising
    certainty, and `trust` (<= 1) discounts every further token of a copy. Both never grow down a
    path, so the most probable nodes always include their ancestors and best-first order is
    parent-first.
    """
    check_trust(trust)
    windows = [w for w in windows if w]
    if not windows or max_nodes <= 0:
        return []
    counts: dict[tuple[int, ...], int] = {}
    for w in windows:
        for d in range(1, len(w) + 1):
            key = tuple(w[:d])
            counts[key] = counts.get(key, 0) + 1
    total = len(windows) + prior
    scored = ((-c / total * trust ** len(k), len(k), k) for k, c in counts.items())
    # most probable first; ties: shallower first (a parent before its child), then the token order
    ranked = heapq.nsmallest(max_nodes, (s for s in scored if -s[0] >= min_prob))
    index: dict[tuple[int, ...], int] = {}
    out: list[Candidate] = []
    for neg, depth, key in ranked:
        index[key] = len(out)
        out.append(Candidate(token=key[-1], parent=index[key[:-1]] if depth > 1 else -1, depth=depth, prob=-neg))
    return out


def best_chain(windows: Iterable[Sequence[int]], min_prob: float, prior: float = 0.0,
               trust: float = 1.0) -> list[Candidate]:
    """The most frequent chain through the windows: at every depth the token that most of the
    windows agreeing so far continue with (ties: the smaller token id), while its probability (its
    share of all windows plus `prior` pseudo-windows, x trust^depth, as in `continuation_tree`)
    stays >= min_prob."""
    check_trust(trust)
    alive = [w for w in windows if w]
    total = len(alive) + prior
    chain: list[Candidate] = []
    while alive:
        d = len(chain)
        counts: dict[int, int] = {}
        for w in alive:
            if len(w) > d:
                counts[w[d]] = counts.get(w[d], 0) + 1
        if not counts:
            break
        token, count = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        prob = count / total * trust ** (d + 1)
        if prob < min_prob:
            break
        chain.append(Candidate(token=token, parent=d - 1, depth=d + 1, prob=prob))
        alive = [w for w in alive if len(w) > d and w[d] == token]
    return chain


def check_trust(trust: float) -> None:
    """A per-token discount must lie in (0, 1]: above 1 a child could outrank its parent."""
    if not 0.0 < trust <= 1.0:
        raise ValueError(f"trust must be in (0, 1] (a per-token discount), got {trust!r}.")
