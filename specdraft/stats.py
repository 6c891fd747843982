"""GenerationStats: what one generation did and where its time went.

Vocabulary: a *round* is one drafter proposal + one target forward; it emits
accepted + 1 tokens. acceptance_rate = accepted / drafted; mean_accepted_length = emitted tokens
per round (= tokens per target forward).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class GenerationStats:
    """Counters and timings of one `SpeculativeDecoder.generate` call (batch size 1)."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    # Per draft position i: rounds that drafted a token there; rounds that reached it (all tokens
    # before i accepted); rounds that accepted it.
    drafted_per_position: list[int] = field(default_factory=list)
    reached_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_round: list[int] = field(default_factory=list)  # the draft length of every round, in order
    draft_s_per_round: list[float] = field(default_factory=list)  # drafter seconds of every round, in order
    verify_s_per_round: list[float] = field(default_factory=list)  # target scoring seconds of every round
    # the draft source of every round (an index into `Drafter.draft_sources`; 0 for a drafter of one)
    source_per_round: list[int] = field(default_factory=list)
    # verify_s_by_k[k] = [seconds, rounds] of target forwards that scored k draft tokens.
    verify_s_by_k: dict[int, list[float]] = field(default_factory=dict)
    prefill_s: float = 0.0
    cached_prompt_tokens: int = 0  # prompt positions restored from the prefix cache, not prefilled
    draft_s: float = 0.0  # drafter.propose + drafter.commit
    verify_s: float = 0.0  # the target's scoring forward over [newest] + draft
    total_s: float = 0.0  # wall time of generate(), prefill included

    def record_round(
        self, num_drafted: int, num_accepted: int, num_emitted: int, draft_s: float, verify_s: float,
        source: int = 0,
    ) -> None:
        """Count one round that drafted `num_drafted` from draft source `source`, kept `num_accepted`,
        emitted `num_emitted`, and spent `draft_s` in the drafter and `verify_s` in the target's
        scoring forward."""
        self.rounds += 1
        self.source_per_round.append(source)
        self.draft_s += draft_s
        self.draft_s_per_round.append(draft_s)
        self.verify_s_per_round.append(verify_s)
        entry = self.verify_s_by_k.setdefault(num_drafted, [0.0, 0])
        entry[0] += verify_s
        entry[1] += 1
        self.verify_s += verify_s
        self.drafted += num_drafted
        self.accepted += num_accepted
        self.new_tokens += num_emitted
        self.drafted_per_round.append(num_drafted)
        for counts in (self.drafted_per_position, self.reached_per_position, self.accepted_per_position):
            _grow(counts, num_drafted)
        for i in range(num_drafted):
            self.drafted_per_position[i] += 1
        for i in range(min(num_accepted + 1, num_drafted)):
            self.reached_per_position[i] += 1
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    @property
    def acceptance_rate(self) -> float:
        """alpha-hat = accepted / drafted (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Emitted tokens per round (= tokens per target forward)."""
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        """P(draft token i accepted | a token was drafted at i and all before it were accepted)."""
        return [
            a / d if d else 0.0
            for a, d in zip(self.accepted_per_position, self.reached_per_position)
        ]

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def overhead_s(self) -> float:
        """Wall time outside the target's forwards and the drafter's calls."""
        return max(0.0, self.total_s - self.prefill_s - self.draft_s - self.verify_s)

    @property
    def overhead_fraction(self) -> float:
        return self.overhead_s / self.total_s if self.total_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict: raw counters plus the derived rates."""
        out = asdict(self)
        out["verify_s_by_k"] = {str(k): v for k, v in self.verify_s_by_k.items()}
        for name in (
            "acceptance_rate",
            "mean_accepted_length",
            "acceptance_per_position",
            "tokens_per_s",
            "overhead_s",
            "overhead_fraction",
        ):
            out[name] = getattr(self, name)
        return out


def _grow(counts: list[int], length: int) -> None:
    if len(counts) < length:
        counts.extend([0] * (length - len(counts)))


@dataclass
class BatchStats:
    """What one `SpeculativeDecoder.generate_batch` call did as a whole (each row's own counters
    are in its `GenerationStats`; a row's total_s is its latency: batch start until it finished)."""

    batch_size: int = 0
    rounds: int = 0
    new_tokens: int = 0  # of all rows
    prefill_s: float = 0.0
    total_s: float = 0.0  # wall time of the whole batch
    drafted_per_round: list[int] = field(default_factory=list)  # the K the batch drafted each round
    live_rows_per_round: list[int] = field(default_factory=list)  # rows still generating each round

    @property
    def tokens_per_s(self) -> float:
        """Throughput: new tokens of all rows per second of the batch."""
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tokens_per_s"] = self.tokens_per_s
        return out
