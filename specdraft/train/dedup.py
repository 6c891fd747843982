"""Exact and near-duplicate detection of prompts, on word n-grams (MinHash with banded LSH).

Self-generated prompts repeat themselves: a small model asked to write a user's message often writes
the same request with a word changed. Training on a thousand copies of one request teaches the
drafter that request, not the target; a held-out split that shares near-copies with the training
split measures memory, not generalisation. So every prompt goes through one `DuplicateIndex`:

- exact: the normalised text (lower case, words only) was seen before;
- near: the Jaccard similarity of its word n-gram sets with a seen prompt is >= `threshold`.
  Candidates come from MinHash signatures split into bands (the standard LSH scheme: two sets with
  Jaccard s share at least one band with probability 1 - (1 - s^r)^b); each candidate is then
  confirmed by its exact Jaccard, so there are no false positives, only rare misses.

Texts too short to have an n-gram are compared by their exact normalised form only.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field

_WORD = re.compile(r"\w+", re.UNICODE)
_PRIME = (1 << 61) - 1  # Mersenne prime for the universal hash family a*x + b mod p


def words(text: str) -> list[str]:
    """The lower-cased words of `text` (punctuation and spacing dropped)."""
    return _WORD.findall(text.lower())


def normalize(text: str) -> str:
    """The form two texts share when they differ only in case, punctuation or spacing."""
    return " ".join(words(text))


def shingles(text: str, n: int = 3) -> frozenset[str]:
    """The set of word n-grams of `text` (empty when it has fewer than n words)."""
    w = words(text)
    return frozenset(" ".join(w[i : i + n]) for i in range(len(w) - n + 1))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a & b| / |a | b| (0 for two empty sets)."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def _hash64(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big")


@dataclass
class DuplicateIndex:
    """Remembers prompts and tells whether a new one duplicates a remembered one.

    threshold: Jaccard similarity of word n-gram sets at or above which two texts are near
    duplicates; n: the n-gram length; bands x rows: MinHash signature length and its LSH banding."""

    threshold: float = 0.7
    n: int = 3
    bands: int = 16
    rows: int = 4
    seed: int = 0
    _exact: dict[str, str] = field(default_factory=dict)  # normalised text -> key
    _sets: dict[str, frozenset[str]] = field(default_factory=dict)  # key -> shingles
    _buckets: dict[tuple[int, tuple[int, ...]], list[str]] = field(default_factory=dict)
    _coeffs: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}.")
        if self.n < 1 or self.bands < 1 or self.rows < 1:
            raise ValueError(f"n, bands and rows must be >= 1, got {self.n}, {self.bands}, {self.rows}.")
        rng = random.Random(self.seed)
        self._coeffs = [(rng.randrange(1, _PRIME), rng.randrange(_PRIME)) for _ in range(self.bands * self.rows)]

    def __len__(self) -> int:
        return len(self._exact)

    def signature(self, grams: frozenset[str]) -> list[int]:
        """The MinHash signature (bands * rows values) of a non-empty n-gram set."""
        hashes = [_hash64(g) for g in grams]
        return [min((a * h + b) % _PRIME for h in hashes) for a, b in self._coeffs]

    def _band_keys(self, grams: frozenset[str]) -> list[tuple[int, tuple[int, ...]]]:
        sig = self.signature(grams)
        return [(i, tuple(sig[i * self.rows : (i + 1) * self.rows])) for i in range(self.bands)]

    def find(self, text: str) -> tuple[str, str] | None:
        """(kind, key) of a remembered duplicate of `text` ("exact" or "near"), else None."""
        norm = normalize(text)
        if norm in self._exact:
            return "exact", self._exact[norm]
        grams = shingles(text, self.n)
        if not grams:
            return None
        seen: set[str] = set()
        for band in self._band_keys(grams):
            for key in self._buckets.get(band, ()):
                if key not in seen:
                    seen.add(key)
                    if jaccard(grams, self._sets[key]) >= self.threshold:
                        return "near", key
        return None

    def add(self, key: str, text: str) -> None:
        """Remember `text` under `key` (no check; see `add_if_new`)."""
        self._exact.setdefault(normalize(text), key)
        grams = shingles(text, self.n)
        if grams:
            self._sets[key] = grams
            for band in self._band_keys(grams):
                self._buckets.setdefault(band, []).append(key)

    def add_if_new(self, key: str, text: str) -> tuple[str, str] | None:
        """Remember `text` unless it duplicates a remembered text; returns that duplicate as in `find`."""
        dup = self.find(text)
        if dup is None:
            self.add(key, text)
        return dup
