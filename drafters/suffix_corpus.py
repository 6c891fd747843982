"""A static corpus for suffix decoding: what the target wrote before, as a suffix array.

The global store (`drafters.suffix_index.SuffixIndex`) learns from this process's requests and costs
a few hundred bytes per token; a deployment's logs hold millions of tokens of the target's own
answers, the evidence llama.cpp's static n-gram cache (`llama-lookup-create`) is built from. This
module keeps such a corpus read-only in about 12 bytes per token and answers the same two questions
as the store:

- `CorpusIndex.match`: the longest suffix of the context (at most `max_match` tokens) that occurs in
  the corpus with a continuation, and up to `max_occurrences` of its occurrences (spread evenly over
  all of them, so the counts estimate what usually follows);
- `CorpusIndex.continuations`: the tokens after those occurrences.

How: the corpus's sequences are joined (a separator between them) and reversed; the suffix array
of the reversed text (sorted on its first `SORTED_DEPTH` symbols by prefix doubling) puts every
occurrence of a reversed context suffix in one contiguous range, and the range for one more context
token lies inside the range before: a match is one binary search per matched token.

A corpus file (`save_corpus` / `load_corpus`) is an `.npz` of the joined tokens with a JSON record
of the target it was written by (vocabulary size, tokenizer hash) and where the tokens came from;
the suffix array is rebuilt on load (a few seconds for millions of tokens).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from drafters.suffix_index import Match
from specdraft.formats.target_info import RECORD_KEY, check_target
from specdraft.shipped import ARTIFACTS_DIR, require_artifact

if TYPE_CHECKING:
    from specdraft.target import TargetModel

SORTED_DEPTH = 32  # suffixes are sorted on this many symbols: the longest match the corpus can find
SEPARATOR = -1  # between sequences in the joined tokens (never a token id)
NARROW_VECTORISED = 128  # a sorted range this narrow is searched in one numpy pass; wider ones are bisected
CORPUS_FORMAT = "specdraft-suffix-corpus"
CORPUS_VERSION = 1
TOKENS_FILE = "corpus.npz"
RECORD_FILE = "corpus.json"
DEFAULT_ARTIFACT = "suffix_corpus"  # the shipped corpus of a target: <alias>/suffix_corpus
TARGET_KEYS = ("vocab_size", "tokenizer_hash")  # a corpus is token ids: the same ids must mean the same text


def suffix_order(symbols: np.ndarray, depth: int) -> np.ndarray:
    """Positions of `symbols` [N] (non-negative int64) sorted by the `depth` symbols starting there
    (a suffix shorter than `depth` sorts before its extensions), by prefix doubling: after round r
    every position's rank orders its first 2^r symbols. Returns [N] int64."""
    n = symbols.shape[0]
    rank = np.unique(symbols, return_inverse=True)[1].astype(np.int64).reshape(n)  # dense: 0..distinct-1
    order = np.argsort(rank, kind="stable")
    span = 1
    while span < depth and n > 1 and int(rank.max()) < n - 1:  # until every prefix is distinct
        nxt = np.zeros(n, np.int64)  # 0 = past the end: before every symbol (ranks are shifted by 1)
        if span < n:
            nxt[: n - span] = rank[span:] + 1
        combined = rank * (int(rank.max()) + 2) + nxt  # [N], orders (rank, next rank) pairs
        order = np.argsort(combined, kind="stable")
        ordered = combined[order]
        rank = np.empty(n, np.int64)
        rank[order] = np.concatenate(([0], np.cumsum(ordered[1:] != ordered[:-1])))
        span *= 2
    return order


def join_newest(sequences: Sequence[Sequence[int]], max_tokens: int | None = None) -> tuple[np.ndarray, int, int]:
    """The newest sequences (the last ones given) that fit in `max_tokens` tokens (None = all),
    oldest first, joined with SEPARATOR after each: ([N] int32, sequences kept, tokens kept)."""
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be None (all) or >= 1, got {max_tokens}.")
    kept: list[Sequence[int]] = []
    total = 0
    for seq in reversed(sequences):  # the newest first, while they fit the budget
        if not len(seq):
            continue
        if max_tokens is not None and total + len(seq) > max_tokens:
            break
        kept.append(seq)
        total += len(seq)
    kept.reverse()
    pieces = [np.append(np.asarray(seq, dtype=np.int64), SEPARATOR) for seq in kept]
    joined = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    if int(joined.min(initial=0)) < SEPARATOR or np.count_nonzero(joined == SEPARATOR) != len(kept):
        raise ValueError("corpus token ids must be >= 0.")
    return joined.astype(np.int32), len(kept), total


class CorpusIndex:
    """A read-only suffix array over token sequences (module docstring).

    sequences: the corpus, e.g. the target's earlier answers; max_tokens: keep at most this many
        tokens (the newest sequences, `join_newest`; None = all).
    """

    def __init__(self, sequences: Sequence[Sequence[int]], max_tokens: int | None = None) -> None:
        # [N] forward, SEPARATOR after every sequence
        self.tokens, self.num_sequences, self.num_tokens = join_newest(sequences, max_tokens)
        self.max_tokens = max_tokens
        # the reversed text shifted by one (separator -> 0, token t -> t + 1): the symbols that are sorted
        self._reversed = (self.tokens[::-1].astype(np.int64) + 1).astype(np.int32)  # [N]
        order = suffix_order(self._reversed.astype(np.int64), SORTED_DEPTH)  # [N]
        # keep the suffixes that start at a token with a continuation: reversed position p is forward
        # position N-1-p, whose next token is reversed position p-1 (a separator: a sequence's last token)
        last = np.ones(order.shape[0], dtype=bool)  # [N]
        last[1:] = self._reversed[:-1] == 0
        keep = (self._reversed[order] != 0) & ~last[order]
        self._order = order[keep].astype(np.int32)  # [M] sorted suffixes that can be matched with a continuation
        first = self._reversed[self._order]  # [M] each suffix's first symbol, ascending
        top = int(first.max(initial=0)) + 2
        self._first_start = np.searchsorted(first, np.arange(top), side="left").astype(np.int64)  # [top]

    def memory_bytes(self) -> int:
        """The index's arrays in bytes (tokens, reversed symbols, sorted suffixes, first-symbol table)."""
        return int(self.tokens.nbytes + self._reversed.nbytes + self._order.nbytes + self._first_start.nbytes)

    def match(self, context: Sequence[int], max_match: int, max_occurrences: int) -> Match | None:
        """The longest suffix of `context` (at most min(max_match, SORTED_DEPTH) tokens) that
        occurs in the corpus with a continuation, and up to `max_occurrences` of its occurrences,
        spread over all of them (occurrence = (0, position of its last token in the joined
        tokens)); None when even the last token never occurs."""
        limit = min(max_match, SORTED_DEPTH, len(context))
        if limit < 1:
            return None
        symbol = int(context[-1]) + 1
        if symbol + 1 >= self._first_start.shape[0]:
            return None
        lo, hi = int(self._first_start[symbol]), int(self._first_start[symbol + 1])
        if lo >= hi:
            return None
        n = self._reversed.shape[0]
        length = 1
        while length < limit:
            a, b = self._narrow(lo, hi, length, int(context[-1 - length]) + 1)
            if a >= b:
                break
            lo, hi, length = a, b, length + 1
        step = -(-(hi - lo) // max_occurrences)  # ceil: at most max_occurrences, evenly spread
        ends = n - 1 - self._order[lo:hi:step].astype(np.int64)  # [<= max_occurrences] forward end positions
        return Match(length, tuple((0, int(e)) for e in ends))

    def _narrow(self, lo: int, hi: int, length: int, symbol: int) -> tuple[int, int]:
        """The part [a, b) of the sorted range [lo, hi), whose suffixes agree on their first
        `length` symbols, with `symbol` next. A wide range (a frequent token) is bisected one
        element at a time (log2 R reads); a narrow one in one vectorised pass (R reads)."""
        order, reversed_, n = self._order, self._reversed, self._reversed.shape[0]
        if hi - lo <= NARROW_VECTORISED:
            starts = order[lo:hi].astype(np.int64) + length  # [R] where symbol `length` of each suffix sits
            column = np.where(starts < n, reversed_[np.minimum(starts, n - 1)], -1)  # [R] ascending
            return (lo + int(np.searchsorted(column, symbol, side="left")),
                    lo + int(np.searchsorted(column, symbol, side="right")))

        def below(i: int, strict: bool) -> bool:  # is suffix i's symbol `length` < symbol (<= unless strict)?
            at = int(order[i]) + length
            value = int(reversed_[at]) if at < n else -1
            return value < symbol if strict else value <= symbol

        bounds = []
        for strict in (True, False):
            a, b = lo, hi
            while a < b:
                mid = (a + b) // 2
                if below(mid, strict):
                    a = mid + 1
                else:
                    b = mid
            bounds.append(a)
        return bounds[0], bounds[1]

    def continuations(self, match: Match, depth: int) -> list[list[int]]:
        """The (up to `depth`) tokens after each matched occurrence, cut at the end of its sequence."""
        out = []
        for _, end in match.occurrences:
            window = self.tokens[end + 1 : end + 1 + depth].tolist()
            if SEPARATOR in window:
                window = window[: window.index(SEPARATOR)]
            out.append(window)
        return out

    def sequences(self) -> list[list[int]]:
        """The corpus's sequences, oldest first."""
        cuts = np.flatnonzero(self.tokens == SEPARATOR)
        starts = np.concatenate(([0], cuts[:-1] + 1)) if cuts.size else np.zeros(0, np.int64)
        return [self.tokens[s:e].tolist() for s, e in zip(starts, cuts)]


def save_corpus(sequences: Sequence[Sequence[int]], out_dir: str | Path, record: dict[str, Any],
                max_tokens: int | None = None) -> Path:
    """Write the newest sequences within `max_tokens` (`join_newest`; no suffix array is built) to
    `corpus.npz`, and `record` plus the corpus's size to `corpus.json`, in out_dir; record holds at
    least `target_model` (the target's record, `target_info`)."""
    tokens, num_sequences, num_tokens = join_newest(sequences, max_tokens)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if int(tokens.max(initial=0)) < np.iinfo(np.uint16).max else np.int32
    stored = tokens.astype(np.int64)
    stored[stored == SEPARATOR] = np.iinfo(dtype).max if dtype == np.uint16 else SEPARATOR
    tmp = out / (TOKENS_FILE + ".tmp.npz")
    np.savez_compressed(tmp, tokens=stored.astype(dtype))
    os.replace(tmp, out / TOKENS_FILE)
    full = {"format": CORPUS_FORMAT, "version": CORPUS_VERSION, **record,
            "tokens": num_tokens, "sequences": num_sequences}
    (out / RECORD_FILE).write_text(json.dumps(full, indent=2) + "\n")
    return out


def read_corpus_record(corpus_dir: str | Path) -> dict[str, Any]:
    """A corpus directory's record (`corpus.json`), or a ValueError that says what is wrong."""
    path = Path(corpus_dir) / RECORD_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{corpus_dir} has no readable {RECORD_FILE} ({err}); "
                         "write a corpus with specdraft-suffix-corpus.") from err
    if not isinstance(record, dict) or record.get("format") != CORPUS_FORMAT or record.get("version") != CORPUS_VERSION:
        raise ValueError(f"{path} is not a {CORPUS_FORMAT} record of version {CORPUS_VERSION}; "
                         "write a corpus with specdraft-suffix-corpus.")
    return record


def load_corpus(corpus_dir: str | Path, max_tokens: int | None = None) -> CorpusIndex:
    """The index of a corpus directory (`save_corpus`), keeping its newest `max_tokens` tokens."""
    read_corpus_record(corpus_dir)
    with np.load(Path(corpus_dir) / TOKENS_FILE) as data:
        stored = data["tokens"].astype(np.int64)
        sep = np.iinfo(np.uint16).max if data["tokens"].dtype == np.uint16 else SEPARATOR
    cuts = np.flatnonzero(stored == sep)
    starts = np.concatenate(([0], cuts[:-1] + 1)) if cuts.size else np.zeros(0, np.int64)
    return CorpusIndex([stored[s:e] for s, e in zip(starts, cuts)], max_tokens)


def find_corpus(spec: str | Path | None, target: TargetModel) -> Path | None:
    """The corpus directory `spec` names for `target`: None = no corpus; "auto" = the shipped corpus
    written by this target, if one is shipped (else none); a directory or shipped name otherwise,
    which must have been written with this target's tokenizer (a ValueError says so)."""
    if spec is None:
        return None
    if str(spec) == "auto":
        for record_file in sorted(ARTIFACTS_DIR.glob(f"*/{DEFAULT_ARTIFACT}/{RECORD_FILE}")):
            try:
                check_target(read_corpus_record(record_file.parent).get(RECORD_KEY, {}), target, "", TARGET_KEYS)
            except ValueError:
                continue
            return record_file.parent
        return None
    found = require_artifact(spec, "suffix corpus", default=DEFAULT_ARTIFACT)
    check_target(read_corpus_record(found).get(RECORD_KEY, {}), target, f"the suffix corpus {spec}", TARGET_KEYS,
                 fix="Write one for this target with specdraft-suffix-corpus, or set drafter.corpus=null.",
                 made="was written by")
    return found
