"""Where to audit: a context in which the drafter's drafts are accepted.

An audit only tests acceptance and the bonus token if drafts get accepted, and on an arbitrary
prompt they may not be (a drafter may open a chat answer with a token the target never emits).
The target's own greedy continuation makes good contexts: the candidates are the prompt, the
prompt followed by the first j tokens of that continuation, and the prompt + continuation + its
first j tokens again (the continuation repeating, where copy-style drafters fire). Each candidate
is scored by a few short generations whose seeds are disjoint from the audit's, and the audit runs
on the candidate with the most accepted drafts (ties: the earlier, shorter one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specdraft.check.greedy import reference_greedy
from specdraft.decode import SpeculativeDecoder

SCORING_SEED_OFFSET = 2**40  # scoring runs use seeds base + 2**40 + i; the audit's are base + [0, N)


@dataclass(frozen=True)
class Context:
    """A candidate audit context and how the scoring runs went on it."""

    label: str  # how it was built, for the report
    token_ids: tuple[int, ...]
    accepted: int = 0  # drafts accepted over the scoring runs
    drafted: int = 0


def candidate_contexts(
    prompt: Sequence[int], continuation: Sequence[int], room: int, cuts: Sequence[int] = (2, 4, 8, 16),
) -> list[Context]:
    """The prompt, prompt + continuation[:j], prompt + continuation + continuation[:j] for j in
    `cuts`, deduplicated, each at most `room` tokens long."""
    prompt, cont = tuple(prompt), tuple(continuation)
    found = [Context("the prompt", prompt)]
    for j in cuts:
        if j <= len(cont):
            found.append(Context(f"prompt + {j} tokens of the target's greedy continuation", prompt + cont[:j]))
    for j in cuts:
        if j <= len(cont):
            found.append(Context(f"prompt + its {len(cont)}-token greedy continuation + that continuation's "
                                 f"first {j} tokens again", prompt + cont + cont[:j]))
    seen: set[tuple[int, ...]] = set()
    out = []
    for ctx in found:
        if ctx.token_ids not in seen and len(ctx.token_ids) <= room:
            seen.add(ctx.token_ids)
            out.append(ctx)
    return out


def score_context(decoder: SpeculativeDecoder, ctx: Context, depth: int, runs: int) -> Context:
    """`ctx` with the drafts drafted and accepted over `runs` generations of `depth` tokens."""
    base = decoder.sampling
    accepted = drafted = 0
    for i in range(runs):
        sampling = base.with_seed(base.seed + SCORING_SEED_OFFSET + i)
        stats = decoder.generate(list(ctx.token_ids), depth, stop_token_ids=[], sampling=sampling).stats
        accepted += stats.accepted
        drafted += stats.drafted
    return Context(ctx.label, ctx.token_ids, accepted, drafted)


def choose_context(
    decoder: SpeculativeDecoder, prompt: Sequence[int], depth: int, continuation_tokens: int = 16,
    runs: int = 4,
) -> tuple[Context, list[Context]]:
    """The best-scoring candidate context for an audit of the first `depth` tokens, and every
    scored candidate (in candidate order)."""
    target = decoder.target
    room = target.max_context - depth
    if len(prompt) > room:
        raise ValueError(
            f"the prompt ({len(prompt)} tokens) + the audit's {depth} tokens exceed the target's context "
            f"length of {target.max_context}; shorten the prompt."
        )
    cont_len = max(0, min(continuation_tokens, (room - len(prompt)) // 2))
    continuation = reference_greedy(target, prompt, cont_len, target.eos_token_ids) if cont_len else []
    scored = [score_context(decoder, ctx, depth, runs) for ctx in candidate_contexts(prompt, continuation, room)]
    best = max(scored, key=lambda c: c.accepted)  # max keeps the first of equals
    return best, scored
