"""How many tokens to draft each round (`num_draft_tokens`): a fixed number, or the online cost
model (`"auto"`).

The seed picks gamma by maximising E[N] / (gamma c + 1) for one alpha and a constant c. Real
hardware breaks both assumptions: acceptance falls with the position in the draft, and the target's
forward over k+1 positions can cost visibly more than over 1 (how much depends on the machine and
the stack). The cost model keeps running estimates of

    a_i      = P(draft token i accepted | tokens 0..i-1 accepted)     (per position, Beta prior)
    T_d(k)   = seconds the drafter spends on a round that drafts k tokens
    T_v(k)   = seconds of the target forward that scores k draft tokens (k+1 positions)

and every round picks

    K* = argmax_{k in [0, k_max]}  E[N](k) / (T_d(k) + T_v(k)),   E[N](k) = sum_{j=0..k} prod_{i<j} a_i

(E[N] from `specdraft.theory.expected_tokens_from_profile`), i.e. the K with the most expected
emitted tokens per second, *including K = 0* (plain AR) when drafting does not pay. Estimates are
exponential moving averages, so they follow the prompt (a copy region makes the n-gram drafter right
for a while, then wrong). T_v(k) = s * curve(k): the shape is the target's measured verify-cost
curve (`specdraft.costs.verify_curve`, the one verify-cost model), taken as non-decreasing in k so a
noisy dip never makes drafting look free; the scale s is updated by every round (so one slow sample
at a rarely used k cannot freeze the choice at K = 0). T_d(k) grows linearly with the measured
per-token drafting cost. When K* = 0 the policy still probes k = 1 after `probe_every` rounds at
K = 0, so a drafter that becomes useful again is noticed; every probe that is rejected doubles that
interval (up to `max_probe_every`) and an accepted probe resets it, so a drafter that stays wrong
costs ever fewer probes (short generations, where one probe is a visible part of the time, stop
paying for them). No probe at all when even a fully accepted k = 1 round would be slower per token
than AR (then probing cannot pay).
The very first draft is a single token, so a slow drafter costs one drafted token, not K, before
its cost is known.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from specdraft.theory import expected_tokens_from_profile


class DraftLengthPolicy(Protocol):
    """Chooses K each round and learns from what the round cost and kept."""

    def choose(self, k_max: int) -> int: ...

    def observe(self, num_drafted: int, num_accepted: int, draft_s: float | None, verify_s: float) -> None:
        """draft_s=None: this round's drafting time is not a per-token cost (the first round of a
        generation also catches the drafter up on the whole prompt)."""
        ...


@dataclass
class FixedDraftLength:
    """Always draft `k` tokens (capped by what the round allows)."""

    k: int

    def choose(self, k_max: int) -> int:
        return min(self.k, k_max)

    def observe(self, num_drafted: int, num_accepted: int, draft_s: float | None, verify_s: float) -> None:
        """A fixed K learns nothing."""


@dataclass
class CostModelDraftLength:
    """Online cost-model choice of K (see module docstring for the rule).

    verify_curve: the target's T_v(k) / T_v(0) for k = 0..max_k (`specdraft.costs.verify_curve`).
    max_k: largest K ever drafted. decay: weight of history in the moving averages.
    prior_accept / prior_weight: Beta prior on each a_i (optimistic enough to try drafting).
    draft_decay: weight of history for the per-token drafting cost, which is only observed on
        drafting rounds (rare once K = 0 wins), so it must recover from one slow sample quickly.
    """

    verify_curve: Sequence[float]
    max_k: int = 8
    decay: float = 0.95
    prior_accept: float = 0.5
    prior_weight: float = 2.0
    probe_every: int = 16
    max_probe_every: int = 256
    draft_decay: float = 0.8
    _accepted: list[float] = field(default_factory=list, repr=False)
    _reached: list[float] = field(default_factory=list, repr=False)
    _draft_per_token: float | None = field(default=None, repr=False)
    _rounds_at_zero: int = field(default=0, repr=False)
    _probe_interval: int = field(default=0, repr=False)  # current gap between probes (backs off)
    _probing: bool = field(default=False, repr=False)  # the last choice was a probe
    _shape: list[float] = field(default_factory=list, repr=False)  # verify_curve, made non-decreasing
    _scale: float | None = field(default=None, repr=False)  # seconds per curve unit, from every round

    def __post_init__(self) -> None:
        if self.max_k < 0:
            raise ValueError(f"max_k must be >= 0, got {self.max_k}.")
        if not 1 <= self.probe_every <= self.max_probe_every:
            raise ValueError(
                f"need 1 <= probe_every <= max_probe_every, got {self.probe_every} and {self.max_probe_every}."
            )
        curve = [float(c) for c in self.verify_curve]
        if len(curve) <= self.max_k or not all(c > 0 for c in curve):
            raise ValueError(
                f"verify_curve must hold max_k + 1 = {self.max_k + 1} positive costs T_v(k)/T_v(0), "
                f"k = 0..max_k, got {curve}; use specdraft.costs.verify_curve(target, max_k)."
            )
        self.verify_curve = curve
        # Scoring more positions cannot really be cheaper: a noisy dip would make drafting look free.
        self._shape = [max(curve[: i + 1]) for i in range(len(curve))]
        self._probe_interval = self.probe_every
        self._accepted = [0.0] * self.max_k
        self._reached = [0.0] * self.max_k

    # ------------------------------------------------------------------------- estimates
    def acceptance(self) -> list[float]:
        """Current a_i estimates, one per draft position."""
        w, a0 = self.prior_weight, self.prior_accept
        return [(acc + w * a0) / (n + w) for acc, n in zip(self._accepted, self._reached)]

    def verify_cost(self, k: int) -> float:
        """Estimated T_v(k): the curve's (non-decreasing) shape times one scale that every round,
        drafting or not, keeps current, so a slow sample at a rarely used k cannot stick. Relative
        units (T_v(0) = 1) until the first round is observed."""
        return (self._scale or 1.0) * self._shape[k]

    def draft_cost(self, k: int) -> float:
        return k * (self._draft_per_token or 0.0)

    def expected_rate(self, k: int) -> float:
        """Expected emitted tokens per second (or per relative unit) of a round drafting k."""
        tokens = expected_tokens_from_profile(self.acceptance(), k)
        return tokens / (self.draft_cost(k) + self.verify_cost(k))

    # ------------------------------------------------------------------------- policy
    def choose(self, k_max: int) -> int:
        k_max = min(k_max, self.max_k)
        best = max(range(k_max + 1), key=lambda k: (self.expected_rate(k), -k))
        if self._draft_per_token is None:  # drafting cost unknown: measure it with one token first
            best = min(best, 1)
        self._probing = False
        if best == 0 and k_max > 0:
            self._rounds_at_zero += 1
            if self._rounds_at_zero >= self._probe_interval and self._probe_could_pay():
                self._rounds_at_zero = 0
                self._probing = True
                return 1
        elif best > 0:
            self._rounds_at_zero = 0
            self._probe_interval = self.probe_every  # drafting pays again: probe eagerly later
        return best

    def _probe_could_pay(self) -> bool:
        """A k=1 round can only beat AR if, even when always accepted (2 tokens), it is faster per
        token than one AR step; drafters too slow for that (e.g. bitsandbytes on CPU) are not probed."""
        return 2.0 / (self.draft_cost(1) + self.verify_cost(1)) > 1.0 / self.verify_cost(0)

    def observe(self, num_drafted: int, num_accepted: int, draft_s: float | None, verify_s: float) -> None:
        d = self.decay
        if self._probing and num_drafted > 0:
            accepted = num_accepted > 0
            self._probe_interval = (
                self.probe_every if accepted else min(2 * self._probe_interval, self.max_probe_every)
            )
            self._probing = False
        for i in range(min(num_drafted, self.max_k)):
            self._reached[i] *= d
            self._accepted[i] *= d
            if i <= num_accepted:  # position i was reached
                self._reached[i] += 1.0
                self._accepted[i] += 1.0 if i < num_accepted else 0.0
        if num_drafted < len(self._shape):
            ratio = verify_s / self._shape[num_drafted]
            self._scale = ratio if self._scale is None else d * self._scale + (1 - d) * ratio
        if num_drafted > 0 and draft_s is not None:
            per_token = draft_s / num_drafted
            prev, dd = self._draft_per_token, self.draft_decay
            self._draft_per_token = per_token if prev is None else dd * prev + (1 - dd) * per_token


def check_num_draft_tokens(num_draft_tokens: int | str) -> int | str:
    """`num_draft_tokens` as users write it, validated: an int >= 0 (0 = plain autoregressive) or
    "auto" (the cost model)."""
    if num_draft_tokens == "auto":
        return "auto"
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 0:
        raise ValueError(
            f"num_draft_tokens must be an integer >= 0 (0 = plain autoregressive) or 'auto', "
            f"got {num_draft_tokens!r}."
        )
    return num_draft_tokens


def make_draft_length_policy(
    num_draft_tokens: int | str, max_k: int = 8, verify_curve: Sequence[float] | None = None
) -> DraftLengthPolicy:
    """A fresh policy for `num_draft_tokens`: a fixed number, or "auto" (the cost model up to max_k
    on the target's `verify_curve`, which "auto" requires)."""
    if check_num_draft_tokens(num_draft_tokens) != "auto":
        return FixedDraftLength(int(num_draft_tokens))
    if verify_curve is None:
        raise ValueError(
            "num_draft_tokens='auto' needs the target's verify-cost curve: pass "
            "verify_curve=specdraft.costs.verify_curve(target, max_k)."
        )
    return CostModelDraftLength(verify_curve, max_k=max_k)
