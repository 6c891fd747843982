"""Prefix caching across requests: prefill only what an earlier request has not already computed.

A multi-turn chat resends the whole conversation every turn; a task applied to many inputs resends
the same system prompt and instruction; an agent resends its tool schemas. vLLM (automatic prefix
caching), SGLang (RadixAttention) and llama.cpp's server (`cache_prompt`) keep the target's K/V of
earlier requests and prefill only the new tokens. `PrefixCache` is that for one sequence at a time:
it keeps the K/V of whole earlier sequences (prompt + answer), newest first within a token budget;
a new prompt restores the longest prefix it shares with one of them (`restore`) and the decoder
prefills the rest. A sequence that extends a kept one (the next turn of a chat) replaces it.

The restored K/V are the ones the target computed for those tokens before, so the output is the
target's (greedy output equals a fresh prefill's up to floating-point summation order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from specdraft.target import TargetModel


@dataclass(frozen=True, eq=False)  # compared by identity: its fields are tensors
class CachedSequence:
    """One earlier sequence: its tokens and the target's K/V for them."""

    tokens: Tensor  # [L] long, on the CPU
    kv: tuple[tuple[Tensor, Tensor], ...]  # per layer (keys, values) [1, kv_heads, L, D]

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    def prefix(self, n: int) -> CachedSequence:
        """The first n positions (copies, so the rest is freed)."""
        if n >= self.num_tokens:
            return self
        return CachedSequence(self.tokens[:n].clone(), first_positions(self.kv, n))


def first_positions(kv: Sequence[tuple[Tensor, Tensor]], n: int) -> tuple[tuple[Tensor, Tensor], ...]:
    """Copies of the first n positions of every layer's (keys, values) [1, kv_heads, L, D]."""
    return tuple((k[:, :, :n].clone(), v[:, :, :n].clone()) for k, v in kv)


def check_prefix_cache_tokens(value: int) -> int:
    """`prefix_cache_tokens` validated: an int >= 0, the prefix cache's budget in positions (0 = none)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"prefix_cache_tokens must be an integer >= 0 (0 = no prefix caching), got {value!r}.")
    return value


def common_prefix(a: Tensor, b: Tensor) -> int:
    """Length of the longest common prefix of token vectors a [n] and b [m]."""
    n = min(a.shape[0], b.shape[0])
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0, 0]) if differ.numel() else n


class PrefixCache:
    """The target's K/V of earlier sequences, at most `max_tokens` positions in all (the oldest
    sequences leave first); see the module docstring.

    max_tokens: the budget in cached positions (memory: 2 * layers * kv_heads * head_dim * dtype
        bytes per position; `memory_bytes` says what is held).
    min_tokens: the shortest common prefix worth restoring (a copy per layer costs more than
        prefilling a handful of tokens).
    """

    def __init__(self, max_tokens: int, min_tokens: int = 16) -> None:
        for name, value, low in (("max_tokens", max_tokens, 1), ("min_tokens", min_tokens, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"PrefixCache: {name} must be an integer >= {low}, got {value!r}.")
        self.max_tokens, self.min_tokens = max_tokens, min_tokens
        self.sequences: list[CachedSequence] = []  # oldest first
        self.hits = 0  # restores that reused a prefix
        self.reused_tokens = 0  # positions restored instead of prefilled, over all restores

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.sequences)

    def memory_bytes(self) -> int:
        """Bytes held by the kept K/V."""
        return sum(t.numel() * t.element_size() for s in self.sequences for kv in s.kv for t in kv)

    def restore(self, target: TargetModel, prompt: Tensor, limit: int) -> int:
        """Start `target` on a new sequence: an empty cache, or the K/V of the longest prefix of
        prompt [T] (at most `limit` positions) that a kept sequence shares, when it is at least
        `min_tokens` long. Returns the number of positions restored (0 = nothing reused)."""
        prompt = prompt.detach().to("cpu", torch.long).reshape(-1)
        best, length = None, 0
        for seq in reversed(self.sequences):  # the newest first: ties go to it
            n = min(common_prefix(seq.tokens, prompt), limit)
            if n > length:
                best, length = seq, n
        if best is None or length < self.min_tokens:
            target.reset()
            return 0
        target.load_cache([(k[:, :, :length], v[:, :, :length]) for k, v in best.kv])
        self.sequences.remove(best)  # the most recently used goes last: evicted last
        self.sequences.append(best)
        self.hits += 1
        self.reused_tokens += length
        return length

    def snapshot(self, target: TargetModel, tokens: Tensor) -> CachedSequence | None:
        """A copy of the K/V the target's cache holds for tokens [L] (its first L positions), to
        `add` once the sequence is known to be worth keeping; None when it could never be kept
        (shorter than `min_tokens` or longer than the whole budget)."""
        tokens = tokens.detach().to("cpu", torch.long).reshape(-1)
        n = int(tokens.shape[0])
        if n < self.min_tokens or n > self.max_tokens:
            return None
        layers = target.cache_tensors()
        if any(k.shape[0] != 1 or k.shape[2] < n for k, _ in layers):
            raise ValueError(f"the target's cache must hold one sequence of at least {n} positions to keep them.")
        return CachedSequence(tokens, first_positions(layers, n))

    def add(self, seq: CachedSequence) -> None:
        """Keep `seq`: kept sequences that are prefixes of it are replaced, and the oldest leave
        while the budget is exceeded."""
        if not self.min_tokens <= seq.num_tokens <= self.max_tokens:
            return
        self.sequences = [s for s in self.sequences
                          if not (s.num_tokens <= seq.num_tokens and common_prefix(s.tokens, seq.tokens) == s.num_tokens)]
        self.sequences.append(seq)
        while self.num_tokens > self.max_tokens:
            self.sequences.pop(0)
