"""How many tokens to draft each round (`num_draft_tokens`): a fixed number, or the cost model
(`"auto"`).

The seed picks gamma by maximising E[N] / (gamma c + 1) for one alpha and a constant c. Real
hardware breaks both assumptions: acceptance falls with the position in the draft, and the target's
forward over k+1 positions can cost visibly more than over 1 (how much depends on the machine and
the stack). The cost model keeps running estimates of

    a_i      = P(draft token i accepted | tokens 0..i-1 accepted)     (per position, a Beta prior
               centred on a_{i-1}: a position not reached yet is expected to do as well as the one
               before, so a drafter whose first tokens are accepted is tried at longer drafts)

and, in units of one plain target step T_v(0), takes the costs measured before the generation:

    T_v(k)   = the target's verify-cost curve (`specdraft.costs.verify_curve`: k draft tokens, k+1
               positions), taken as non-decreasing in k so a noisy dip never makes drafting look free
    T_d(k)   = k * draft_cost (the drafter's measured seconds per drafted token / T_v(0))

and every round picks

    K* = argmax_{k in [0, k_max]}  E[N](k) / (T_d(k) + T_v(k)),   E[N](k) = sum_{j=0..k} prod_{i<j} a_i

(E[N] from `specdraft.theory.expected_tokens_from_profile`), i.e. the K with the most expected
emitted tokens per unit of time, *including K = 0* (plain AR) when drafting does not pay. The
acceptance estimates are exponential moving averages, so they follow the prompt (a copy region
makes the n-gram drafter right for a while, then wrong).

Costs are frozen while a generation runs, on purpose: K then depends only on what was accepted,
which is a function of the seed, the prompt and the settings, so a seeded sampled generation gives
the same tokens however loaded the machine is (the wall clock never picks K).

Batches: one K is drafted for every live row of a round. b rows at once emit b * E[N](k) tokens per
round against b per AR step, so the same rule holds with the curve measured at that batch size:
T_v(k) becomes T_v(b, k) / T_v(b, 0) (`specdraft.costs.verify_curve(target, k, batch_size=b)`; the
policy reads the curve of the smallest measured batch size >= b, the largest if none is). As b
grows that curve steepens (the forward multiplies weights instead of reading them), so K* falls and
reaches 0 where drafting stops paying. The acceptance estimates pool every row's outcome (one
`observe` per row), and the drafter's cost per token is the one measured at that batch size too
(`batch_draft_costs`: a draft model's batched forward amortises like the target's, a quantized
copy's int4 product or the n-gram's per-row lookups do not).

A row of a batch that drafts fewer than the round's K (an n-gram row with no match) is observed as
offered K: its shortfall counts as a rejection where its draft ended, so E[N](k) is what a row of
the batch emits on average. What the shortfall costs depends on the target: a padded forward pays
for all b * (k + 1) positions, while a target that packs a ragged batch (`packs_ragged`: the fast
stack runs the projections on the real tokens only) pays for the drafted ones, so its cost is read
at k * fill, fill being the running mean of drafted / offered (the curve interpolated between whole
k). Alone (batch size 1) a shorter draft is a shorter forward and counts as drafted.

Draft sources: a drafter that drafts from several sources (`Drafter.draft_sources`: a copy where
the context repeats, else its model) gets one such policy per source (`PerSourceDraftLength`), each
with its own acceptance estimates and its own measured cost per drafted token.

When K* = 0 the policy still probes k = 1 after `probe_every` rounds at K = 0, so a drafter that
becomes useful again is noticed; every probe that is rejected doubles that interval (up to
`max_probe_every`) and an accepted probe resets it, so a drafter that stays wrong costs ever fewer
probes. No probe at all when even a fully accepted k = 1 round would be slower per token than AR
(then probing cannot pay).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Protocol

from specdraft.theory import expected_tokens_from_profile


def non_decreasing(costs: Sequence[float]) -> list[float]:
    """costs[k] raised to the largest of costs[0..k]: verifying more positions never really costs
    less, and a measured dip would make a longer draft look free."""
    return list(accumulate((float(c) for c in costs), max))


class DraftLengthPolicy(Protocol):
    """Chooses K each round and learns from what the round cost and kept."""

    def choose(self, k_max: int, batch_size: int = 1, sources: Sequence[int] | None = None) -> int:
        """K for the next round of `batch_size` live rows, at most k_max; sources: each row's draft
        source this round (`Drafter.source_of`; None = the drafter has one source)."""
        ...

    def observe(self, num_drafted: int, num_accepted: int, num_offered: int | None = None, source: int = 0) -> None:
        """The round drafted `num_drafted` tokens and the target kept `num_accepted` of them;
        num_offered: the K a batch round allowed this row (None = a round of its own); source: the
        row's draft source."""
        ...


@dataclass
class FixedDraftLength:
    """Always draft `k` tokens (capped by what the round allows)."""

    k: int

    def choose(self, k_max: int, batch_size: int = 1, sources: Sequence[int] | None = None) -> int:
        return min(self.k, k_max)

    def observe(self, num_drafted: int, num_accepted: int, num_offered: int | None = None, source: int = 0) -> None:
        """A fixed K learns nothing."""


@dataclass
class CostModelDraftLength:
    """Cost-model choice of K (see module docstring for the rule).

    verify_curve: the target's T_v(k) / T_v(0) for k = 0..max_k (`specdraft.costs.verify_curve`).
    batch_curves: batch size -> T_v(b, k) / T_v(b, 0), k = 0..max_k, for batches (see the module
        docstring); batch size 1 reads verify_curve.
    batch_draft_costs: batch size -> the drafter's cost per token in units of T_v(b, 0); a batch
        size without one reads draft_cost.
    packs_ragged: the target's batch forward costs only the tokens rows really drafted (see the
        module docstring), so a batch's verify cost is read at k * fill.
    draft_cost: the drafter's cost per drafted token, in units of T_v(0) (measured by
        `SpeculativeDecoder` before the generation; 0 = free).
    max_k: largest K ever drafted. decay: weight of history in the acceptance averages.
    prior_accept / prior_weight: Beta prior on a_0 (optimistic enough to try drafting); a_i for
        i > 0 is shrunk with the same weight towards the estimate of a_{i-1}.
    """

    verify_curve: Sequence[float]
    draft_cost: float = 0.0
    max_k: int = 8
    decay: float = 0.95
    prior_accept: float = 0.5
    prior_weight: float = 2.0
    probe_every: int = 16
    max_probe_every: int = 256
    batch_curves: dict[int, Sequence[float]] = field(default_factory=dict)
    batch_draft_costs: dict[int, float] = field(default_factory=dict)
    packs_ragged: bool = False
    _fill: float = field(default=1.0, repr=False)  # running mean of drafted / offered in batch rounds
    _accepted: list[float] = field(default_factory=list, repr=False)
    _reached: list[float] = field(default_factory=list, repr=False)
    _rounds_at_zero: int = field(default=0, repr=False)
    _probe_interval: int = field(default=0, repr=False)  # current gap between probes (backs off)
    _probing: bool = field(default=False, repr=False)  # the last choice was a probe
    _shapes: dict[int, list[float]] = field(default_factory=dict, repr=False)  # batch size -> curve, non-decreasing

    def __post_init__(self) -> None:
        if self.max_k < 0:
            raise ValueError(f"max_draft_tokens (max_k) must be >= 0, got {self.max_k}.")
        if not 1 <= self.probe_every <= self.max_probe_every:
            raise ValueError(
                f"need 1 <= probe_every <= max_probe_every, got {self.probe_every} and {self.max_probe_every}."
            )
        if not self.draft_cost >= 0 or not all(c >= 0 for c in self.batch_draft_costs.values()):
            raise ValueError(f"draft_cost and batch_draft_costs must be >= 0 (units of one target step), got "
                             f"{self.draft_cost} and {self.batch_draft_costs}.")
        self._shapes = {b: self._checked_shape(c, b) for b, c in {**self.batch_curves, 1: self.verify_curve}.items()}
        self.verify_curve = [float(c) for c in self.verify_curve]
        self._probe_interval = self.probe_every
        self._accepted = [0.0] * self.max_k
        self._reached = [0.0] * self.max_k

    def _checked_shape(self, curve: Sequence[float], batch_size: int) -> list[float]:
        """The curve, validated and made non-decreasing: scoring more positions cannot really be
        cheaper, and a noisy dip would make drafting look free."""
        values = [float(c) for c in curve]
        if batch_size < 1 or len(values) <= self.max_k or not all(c > 0 for c in values):
            raise ValueError(
                f"the verify curve of batch size {batch_size} must hold max_k + 1 = {self.max_k + 1} positive "
                f"costs T_v(k)/T_v(0), k = 0..max_k, got {values}; use "
                "specdraft.costs.verify_curve(target, max_k, batch_size)."
            )
        return non_decreasing(values)

    def _measured_size(self, batch_size: int) -> int:
        """The batch size whose costs a round of `batch_size` rows reads: the smallest measured
        one >= it, else the largest measured."""
        sizes = sorted(self._shapes)
        return next((b for b in sizes if b >= batch_size), sizes[-1])

    def shape_for(self, batch_size: int) -> list[float]:
        """The verify curve a round of `batch_size` rows reads."""
        return self._shapes[self._measured_size(batch_size)]

    # ------------------------------------------------------------------------- estimates
    def acceptance(self) -> list[float]:
        """Current a_i estimates, one per draft position."""
        w, prior = self.prior_weight, self.prior_accept
        estimates = []
        for acc, n in zip(self._accepted, self._reached):
            prior = (acc + w * prior) / (n + w)  # shrunk towards the position before
            estimates.append(prior)
        return estimates

    def verify_cost(self, k: int, batch_size: int = 1) -> float:
        """T_v(b, k) / T_v(b, 0): the curve's non-decreasing shape at this batch size; read at
        k * fill for a packing target's batch (linear between whole k)."""
        shape = self.shape_for(batch_size)
        if not self.packs_ragged or batch_size == 1:
            return shape[k]
        x = k * self._fill
        lo = int(x)
        return shape[lo] if lo >= k else shape[lo] + (x - lo) * (shape[lo + 1] - shape[lo])

    def fill(self) -> float:
        """Running mean of drafted / offered over the rows of batch rounds (1 before any)."""
        return self._fill

    def draft_cost_of(self, k: int, batch_size: int = 1) -> float:
        """T_d(b, k) / T_v(b, 0)."""
        return k * self.batch_draft_costs.get(self._measured_size(batch_size), self.draft_cost)

    def expected_rate(self, k: int, batch_size: int = 1) -> float:
        """Expected emitted tokens per row per T_v(b, 0) of a round drafting k for b rows."""
        tokens = expected_tokens_from_profile(self.acceptance(), k)
        return tokens / (self.draft_cost_of(k, batch_size) + self.verify_cost(k, batch_size))

    # ------------------------------------------------------------------------- policy
    def choose(self, k_max: int, batch_size: int = 1, sources: Sequence[int] | None = None) -> int:
        """The best K for the acceptance so far (one source: `sources` is not read)."""
        k_max = min(k_max, self.max_k)
        best = max(range(k_max + 1), key=lambda k: (self.expected_rate(k, batch_size), -k))
        self._probing = False
        if best == 0 and k_max > 0:
            self._rounds_at_zero += 1
            if self._rounds_at_zero >= self._probe_interval and self._probe_could_pay(batch_size):
                self._rounds_at_zero = 0
                self._probing = True
                return 1
        elif best > 0:
            self._rounds_at_zero = 0
            self._probe_interval = self.probe_every  # drafting pays again: probe eagerly later
        return best

    def _probe_could_pay(self, batch_size: int = 1) -> bool:
        """A k=1 round can only beat AR if, even when always accepted (2 tokens), it is faster per
        token than one AR step; drafters too slow for that (e.g. bitsandbytes on CPU) are not probed."""
        shape = self.shape_for(batch_size)
        return 2.0 / (self.draft_cost_of(1, batch_size) + shape[1]) > 1.0 / shape[0]

    def observe(self, num_drafted: int, num_accepted: int, num_offered: int | None = None, source: int = 0) -> None:
        d = self.decay
        if num_offered is not None and num_offered > 0:  # a batch row: its shortfall is a rejection
            self._fill = d * self._fill + (1.0 - d) * min(num_drafted, num_offered) / num_offered
            num_drafted = max(num_drafted, num_offered)
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


@dataclass
class PerSourceDraftLength:
    """One K policy per draft source (`Drafter.draft_sources`), each learning its own acceptance at
    its own cost per drafted token.

    A drafter that copies where the context repeats and drafts with its model elsewhere mixes two
    very different proposals: a copy is right far more often than a guess and costs almost nothing
    to draft, so one pooled policy sizes copies as short as guesses (and often drafts nothing where
    a copy was there to take). Which source drafts a round depends only on the committed tokens, so
    the choice of K stays a function of the accepted tokens (seeded runs reproduce). A batch round's
    K is the largest its rows' sources choose; each row's outcome teaches its own source's policy.
    """

    policies: Sequence[DraftLengthPolicy]

    def __post_init__(self) -> None:
        if not self.policies:
            raise ValueError("PerSourceDraftLength needs one policy per draft source, got none.")

    def choose(self, k_max: int, batch_size: int = 1, sources: Sequence[int] | None = None) -> int:
        present = sorted(set(sources)) if sources is not None else [0]
        return max(self.policies[s].choose(k_max, batch_size) for s in present)

    def observe(self, num_drafted: int, num_accepted: int, num_offered: int | None = None, source: int = 0) -> None:
        self.policies[source].observe(num_drafted, num_accepted, num_offered)


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


def check_max_draft_tokens(max_draft_tokens: int) -> int:
    """`max_draft_tokens` validated: an int >= 0, the most draft tokens "auto" may choose."""
    if isinstance(max_draft_tokens, bool) or not isinstance(max_draft_tokens, int) or max_draft_tokens < 0:
        raise ValueError(
            f"max_draft_tokens must be an integer >= 0 (the most draft tokens num_draft_tokens=auto "
            f"may choose), got {max_draft_tokens!r}."
        )
    return max_draft_tokens


def make_draft_length_policy(
    num_draft_tokens: int | str, max_k: int = 8, verify_curve: Sequence[float] | None = None,
    draft_cost: float | None = None, batch_curves: dict[int, Sequence[float]] | None = None,
    batch_draft_costs: dict[int, float] | None = None, packs_ragged: bool = False,
) -> DraftLengthPolicy:
    """A fresh policy for `num_draft_tokens`: a fixed number, or "auto" (the cost model up to max_k
    on the target's `verify_curve` and the drafter's `draft_cost`, which "auto" requires, and the
    curves and drafter costs of larger batch sizes, `batch_curves` / `batch_draft_costs`, when it
    decodes batches; `packs_ragged`: the target's batch forward costs only the drafted tokens)."""
    if check_num_draft_tokens(num_draft_tokens) != "auto":
        return FixedDraftLength(int(num_draft_tokens))
    if verify_curve is None or draft_cost is None:
        raise ValueError(
            "num_draft_tokens='auto' needs the target's verify-cost curve and the drafter's cost per "
            "token: pass verify_curve=specdraft.costs.verify_curve(target, max_k) and draft_cost "
            "(seconds per drafted token / seconds of one target step)."
        )
    return CostModelDraftLength(verify_curve, draft_cost=draft_cost, max_k=max_k, batch_curves=dict(batch_curves or {}),
                                batch_draft_costs=dict(batch_draft_costs or {}), packs_ragged=packs_ragged)
