"""Filters for self-generated prompts and answers, and the diversity report of a dataset.

A filter returns the reason a text is rejected ("too_short", "too_long", "unfinished", "refusal",
"repetitive", "not_a_request") or None; reasons are counted, never hidden, and the report of a
dataset says what was kept and what was dropped. The diversity report is the evidence that the
data is broad: how many distinct prompts, how many distinct ways of starting one (leading word
3-grams), the length histograms and the mix of kinds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from specdraft.train.dedup import words

REFUSALS = (
    "i'm sorry", "i am sorry", "i apologize", "i apologise", "i cannot", "i can't", "i can not",
    "as an ai", "as a language model", "i'm not able to", "i am not able to", "i'm unable to",
)
# A Magpie sample that opens like an answer is the model talking as the assistant, not a request.
ASSISTANT_OPENINGS = ("sure", "certainly", "of course", "absolutely", "great question", "here is", "here's")
LENGTH_BINS = (0, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def repetition(text: str, n: int = 3) -> float:
    """The share of word n-grams of `text` that repeat an earlier one (0 = none, near 1 = a loop)."""
    w = words(text)
    grams = [tuple(w[i : i + n]) for i in range(len(w) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def is_refusal(text: str) -> bool:
    """Whether the opening of `text` refuses (a refusal taught as a draft target wastes data)."""
    head = " ".join(text.lower().split())[:200]
    return any(r in head for r in REFUSALS)


def prompt_problem(text: str, num_tokens: int, finished: bool, *, min_tokens: int = 4,
                   max_tokens: int = 4096, max_repetition: float = 0.3) -> str | None:
    """Why a user turn is rejected, or None. `finished`: the sampler stopped at the end of the turn."""
    if not finished:
        return "unfinished"
    if num_tokens < min_tokens or len(words(text)) < 2:
        return "too_short"
    if num_tokens > max_tokens:
        return "too_long"
    if is_refusal(text):
        return "refusal"
    if normalized_start(text).startswith(ASSISTANT_OPENINGS):
        return "not_a_request"
    if repetition(text) > max_repetition:
        return "repetitive"
    return None


def answer_problem(text: str, num_tokens: int, *, min_tokens: int = 2, max_repetition: float = 0.5) -> str | None:
    """Why an answer is rejected, or None. Long unfinished answers are kept: the target writes them."""
    if num_tokens < min_tokens:
        return "too_short"
    if is_refusal(text):
        return "refusal"
    if repetition(text) > max_repetition:
        return "repetitive"
    return None


def loop_start(ids: Sequence[int], span: int = 16) -> int | None:
    """Where a looping answer starts repeating itself: the index of the first token that begins a
    second copy of an earlier `span`-token run (a span that long repeats verbatim only in a loop),
    or None if no span repeats. The ids before it are still the target's own text, worth keeping
    when the whole answer is degenerate."""
    seen: set[tuple[int, ...]] = set()
    for i in range(len(ids) - span + 1):
        gram = tuple(ids[i : i + span])
        if gram in seen:
            return i
        seen.add(gram)
    return None


def normalized_start(text: str) -> str:
    return " ".join(words(text)[:3])


def histogram(values: Iterable[int], bins: tuple[int, ...] = LENGTH_BINS) -> dict[str, int]:
    """Counts per half-open bin "[lo, hi)" (the last bin is open: ">= lo")."""
    counts = Counter()
    for v in values:
        i = max(j for j, lo in enumerate(bins) if v >= lo)
        counts[i] += 1
    labels = [f"{bins[i]}-{bins[i + 1] - 1}" for i in range(len(bins) - 1)] + [f">={bins[-1]}"]
    return {labels[i]: counts[i] for i in range(len(bins)) if counts[i]}


def diversity_report(records: list[Mapping[str, Any]], rejected: Mapping[str, int]) -> dict[str, Any]:
    """What a dataset of selfgen records holds: distinct prompts, leading 3-grams, lengths, mix.

    records: the kept answer records ({"conversation", "turn", "mode", "kind", "source", "split",
    "prompt", "prompt_ids", "completion_ids"}); rejected: counts of dropped texts by "stage:reason"."""
    prompts = {(r["conversation"], r["turn"]): r for r in records}
    firsts = [r for r in prompts.values() if r["turn"] == 1]
    return {
        "conversations": len({r["conversation"] for r in records}),
        "distinct_prompts": len({r["prompt"] for r in prompts.values()}),
        "distinct_first_turns": len({r["prompt"] for r in firsts}),
        "distinct_leading_3grams": len({normalized_start(r["prompt"]) for r in firsts}),
        "answers": len(records),
        "answer_tokens": sum(len(r["completion_ids"]) for r in records),
        "answers_by_mode": dict(Counter(r["mode"] for r in records)),
        "answers_cut_at_a_loop": sum(bool(r.get("truncated")) for r in records),
        "prompts_by_turn": dict(sorted(Counter(str(r["turn"]) for r in prompts.values()).items())),
        "conversations_by_kind": dict(Counter(r["kind"] for r in firsts).most_common()),
        "conversations_by_source": dict(Counter(r["source"] for r in firsts).most_common()),
        # records written before the field existed were all written by the float32 target
        "answer_tokens_by_writer_dtype": dict(Counter(
            d for r in records for d in [r.get("writer_dtype", "float32")] for _ in r["completion_ids"])),
        "answer_tokens_by_split": {s: sum(len(r["completion_ids"]) for r in records if r["split"] == s)
                                   for s in sorted({r["split"] for r in records})},
        "prompt_tokens_histogram": histogram(len(r["prompt_ids"]) for r in prompts.values()),
        "user_turn_words_histogram": histogram(len(words(r["prompt"])) for r in prompts.values()),
        "answer_tokens_histogram": histogram(len(r["completion_ids"]) for r in records),
        "top_leading_3grams": Counter(normalized_start(r["prompt"]) for r in firsts).most_common(15),
        "rejected": dict(sorted(rejected.items())),
    }


def report_markdown(report: Mapping[str, Any]) -> str:
    """A short human-readable rendering of `diversity_report`."""
    lines = ["| measure | value |", "|---|---|"]
    for key in ("conversations", "distinct_prompts", "distinct_first_turns", "distinct_leading_3grams",
                "answers", "answers_cut_at_a_loop", "answer_tokens"):
        lines.append(f"| {key.replace('_', ' ')} | {report[key]} |")
    for key in ("answers_by_mode", "prompts_by_turn", "conversations_by_kind", "conversations_by_source",
                "answer_tokens_by_split", "answer_tokens_by_writer_dtype", "prompt_tokens_histogram", "answer_tokens_histogram", "rejected"):
        value = ", ".join(f"{k}: {v}" for k, v in report[key].items()) or "-"
        lines.append(f"| {key.replace('_', ' ')} | {value} |")
    lines.append("| top leading 3-grams | " + ", ".join(f"{g!r}: {c}" for g, c in report["top_leading_3grams"]) + " |")
    return "\n".join(lines)
