"""The one verify-cost model: the target's curve T_v(k) / T_v(0), measured once per process and
model instance (`verify_curve`) through a disk cache per model and device. The K policy
(`specdraft.draft_length`), Medusa's tree sizing and the bench all read it; the shape depends on the machine
and the forward stack, so it is measured, never a constant.

T_v(k) is the target forward that scores k draft tokens, i.e. k + 1 new positions, after a cached
context; the curve is the same measurement as benchmarks/verify_cost.py, shortened. A batch of b
rows has its own curve T_v(b, k) / T_v(b, 0) (every row scores k + 1 positions): as b grows the
forward turns from reading weights to multiplying them, so k extra positions per row stop being
free. Curves are measured per batch-size bucket (`batch_bucket`: 1, 2, 4, 8, ...) and a batch of b
rows reads its bucket's curve. Nothing here runs
at import or when a decoder or drafter is built: callers ask for the curve when they need it.
The same cache keeps the drafters' measured cost per drafted token (`cached_value`, written by
`SpeculativeDecoder`), so `num_draft_tokens=auto` chooses the same K on every run of one machine.
Cache: $SPECDRAFT_CACHE_DIR/costs.json (default ~/.cache/specdraft), keyed by the model's
config, device, dtype, fast/plain stack, torch version and thread count. A cache that cannot be read
or written is a warning (the value is measured again next time), never a failure.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from specdraft.draft_length import non_decreasing
from specdraft.files import cache_dir, write_text_atomically
from specdraft.target import TargetModel

CACHE_FILE = "costs.json"
CURVE_METHOD = "fastest-of-9"  # in the cache key: curves measured another way are measured again
log = logging.getLogger(__name__)


def cost_key(target: TargetModel) -> str:
    """What the curve depends on: architecture/size, device, dtype, stack, torch and threads."""
    config = target.config.to_json_string(use_diff=False)
    parts = [
        hashlib.sha1(config.encode()).hexdigest()[:16], str(target.device), str(target.lm_head.weight.dtype),
        "fast" if target.fast else "plain", torch.__version__, f"threads={torch.get_num_threads()}",
    ]
    return "|".join(parts)


def batch_bucket(batch_size: int) -> int:
    """The batch size whose verify curve a batch of `batch_size` rows reads: the next power of two."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    return 1 << (batch_size - 1).bit_length()


def batch_buckets(batch_size: int) -> list[int]:
    """Every bucket a batch of `batch_size` rows passes through as its rows finish: 1, 2, .., its own."""
    return [1 << i for i in range(batch_bucket(batch_size).bit_length())]


def time_forwards(
    targets: dict[str, TargetModel], ids: Tensor, context: int, positions: Sequence[int], reps: int
) -> dict[tuple[str, int], list[float]]:
    """Seconds of one forward over k new positions (k in `positions`) after `context` cached
    positions of ids [B, T] (every row), per target: `reps` timed sweeps after one untimed warm-up sweep,
    interleaved over k and targets so drift hits all alike; the cache is cropped back after every
    forward (as after a fully rejected draft). Synchronises CUDA around each timing. Used by the
    cost model and by benchmarks/verify_cost.py and gpu_check.py."""
    for target in targets.values():
        target.reset()
        target.forward(ids[:, :context], num_logits=0)
    times: dict[tuple[str, int], list[float]] = {(n, k): [] for n in targets for k in positions}
    for rep in range(reps + 1):
        for k in positions:
            for name, target in targets.items():
                cuda_sync(target.device)
                t0 = time.perf_counter()
                target.forward(ids[:, context : context + k])
                cuda_sync(target.device)
                if rep:
                    times[name, k].append(time.perf_counter() - t0)
                target.crop(context)
    return times


def cuda_sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op off CUDA), so a host timer measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_verify_curve(target: TargetModel, max_k: int, context: int = 256, reps: int = 9,
                         batch_size: int = 1) -> list[float]:
    """[T_v(0), ..., T_v(max_k)] / T_v(0): the fastest of `time_forwards`' `reps` sweeps over k + 1
    positions per row of `batch_size` rows after `context` cached positions (fewer if the model's
    context is short), made non-decreasing. The fastest, not the median: on a shared machine noise
    only ever adds time, and the curve is cached for good, so one busy moment must not make long
    drafts look dear for every later run. Leaves the cache empty."""
    context = max(1, min(context, target.max_context - max_k - 2))
    steps = torch.arange(context + max_k + 1)[None] + 101 * torch.arange(batch_size)[:, None]  # [B, T]
    ids = (steps * 7919 % target.vocab_size).to(target.device)  # [B, T]: rows differ
    times = time_forwards({"target": target}, ids, context, range(1, max_k + 2), reps)
    target.reset()
    fastest = [min(times["target", k + 1]) for k in range(max_k + 1)]
    return non_decreasing([t / fastest[0] for t in fastest])


def verify_curve(target: TargetModel, max_k: int, batch_size: int = 1) -> list[float]:
    """[T_v(0), ..., T_v(max_k)] / T_v(0) for this target at `batch_size` rows (its bucket's curve):
    the one verify-cost model that the K policy, the tree sizing and the bench all use. Measured
    lazily, at most once per process, model instance and bucket (kept on `target.verify_costs`),
    through the on-disk cache."""
    bucket = batch_bucket(batch_size)
    if len(target.verify_costs.get(bucket, [])) <= max_k:
        target.verify_costs[bucket] = cached_verify_curve(target, max_k, bucket)
    return list(target.verify_costs[bucket][: max_k + 1])


def cached_verify_curve(target: TargetModel, max_k: int, batch_size: int = 1) -> list[float]:
    """The curve for this target and batch bucket from the on-disk cache, measured (and stored) if
    missing."""

    def usable(curve: Any) -> bool:
        return isinstance(curve, list) and len(curve) > max_k

    bucket = batch_bucket(batch_size)
    key = f"verify_curve|{CURVE_METHOD}|{cost_key(target)}" + (f"|batch={bucket}" if bucket > 1 else "")
    curve = cached_value(key, lambda: measure_verify_curve(target, max_k, batch_size=bucket), usable)
    return [float(c) for c in curve[: max_k + 1]]


def cached_value(key: str, measure: Callable[[], Any], usable: Callable[[Any], bool] = lambda v: v is not None) -> Any:
    """The JSON value stored under `key` in the cost cache if `usable`, else `measure()` (stored).
    Reading or writing the cache may fail (a read-only or corrupt file): that is a logged warning
    and the measured value is used, never an error."""
    path = cache_dir() / CACHE_FILE
    table: dict[str, Any] = {}
    try:
        if path.exists():
            loaded = json.loads(path.read_text())
            table = loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError) as error:
        log.warning("cannot read the cost cache %s (%s); measuring instead", path, error)
    if usable(table.get(key)):
        return table[key]
    value = measure()
    table[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, json.dumps(table, indent=1))  # concurrent sweep jobs never read half a file
    except OSError as error:
        log.warning(
            "cannot write the cost cache %s (%s): it is measured again next run; set SPECDRAFT_CACHE_DIR "
            "to a writable folder to keep it", path, error,
        )
    return value


def draft_cost_ratios(
    drafted: Sequence[int], draft_s: Sequence[float], verify_s: Sequence[float], curve: Sequence[float],
    scored: Sequence[int] | None = None,
) -> list[float | None]:
    """Per round of one generation, a drafter's seconds per drafted token in units of one target
    step T_v(0): (draft seconds / tokens drafted) / (verify seconds / curve[n]) (each round's verify
    forward tells the run's T_v(0) through the curve); None for the first round (whose drafting
    also catches the drafter up on the prompt) and for rounds without a timed verify. A round that
    drafted nothing counts its drafting time as one token's (the cost of trying). n = the tokens
    the verify forward scored, `scored` (a candidate tree's nodes), or None = `drafted` (a chain)."""
    scored = drafted if scored is None else scored
    return [
        (d / max(k, 1)) / (v / curve[n]) if i > 0 and v > 0 else None
        for i, (k, n, d, v) in enumerate(zip(drafted, scored, draft_s, verify_s))
    ]


def draft_costs_by_source(sources: Sequence[int], ratios: Sequence[float | None], num_sources: int) -> list[float]:
    """One cost per draft source from per-round `draft_cost_ratios` and each round's source: the
    median over that source's rounds, the median over all rounds for a source that drafted none,
    0 when no round has a ratio."""
    by_source: list[list[float]] = [[] for _ in range(num_sources)]
    for source, ratio in zip(sources, ratios):
        if ratio is not None:
            by_source[source].append(ratio)
    pooled = [r for rs in by_source for r in rs]
    return [statistics.median(rs or pooled) if rs or pooled else 0.0 for rs in by_source]


def is_draft_cost(value: Any, num_sources: int = 1) -> bool:
    """A usable cached draft cost: a list of `num_sources` numbers >= 0 (one per draft source)."""
    return isinstance(value, list) and len(value) == num_sources and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in value
    )


def nodes_worth_verifying(probs: Sequence[float], curve: Sequence[float], fixed: Sequence[float] = ()) -> int:
    """How many of the best-first draft candidates with acceptance probabilities `probs` maximise
    expected tokens per verify time: (1 + sum of the first n probs) / curve[n], with curve[n] =
    T_v(n) / T_v(0) (0 = a plain target step is better than any guess). Suffix decoding and EAGLE-2
    trees size their drafts with it. fixed: the probabilities of candidates verified in any case
    (a drafted chain, whose siblings are the optional candidates): counted first, n more at
    curve[len(fixed) + n]."""
    base = len(fixed)
    gain = 1.0 + sum(fixed)
    best_n, best_rate = 0, gain / max(curve[min(base, len(curve) - 1)], curve[0])
    for n in range(1, min(len(probs), len(curve) - 1 - base) + 1):
        gain += probs[n - 1]
        rate = gain / max(curve[base + n], curve[0])
        if rate > best_rate:
            best_n, best_rate = n, rate
    return best_n
