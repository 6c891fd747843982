"""SpeculativeDecoder: the decoding loop shared by every drafter and by the AR baseline.

One round, for every live row of a batch at once:
    1. the drafter proposes K tokens continuing each row's committed sequence,
    2. the target scores [newest token] + draft (K+1 positions per row) in ONE forward,
    3. the verifier keeps each row's own `num_accepted` draft tokens and emits one more,
    4. the target's cache is cropped to each row's accepted prefix and the drafter commits.
The newest committed token is never in the target's cache at the start of a round: it is the first
input of the next forward. The autoregressive baseline is this same loop with K = 0 (`drafter=None`),
so speedups compare like with like. `generate` is a batch of one; `generate_batch` decodes prompts
of different lengths together: their rows live in one KV cache with a length each
(`specdraft.ragged`), each stops on its own stop token or budget and then leaves the batch, and the
cost model picks one K per round for the live batch size (`specdraft.draft_length`). Candidate
trees are verified at batch size 1 only (one tree mask per forward); a tree drafter drafts a chain
per row in a batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from specdraft import costs
from specdraft.draft_length import (
    DraftLengthPolicy,
    PerSourceDraftLength,
    check_max_draft_tokens,
    check_num_draft_tokens,
    make_draft_length_policy,
)
from specdraft.prefix_cache import CachedSequence, PrefixCache, check_prefix_cache_tokens, common_prefix
from specdraft.protocol import Draft, DraftContext, Drafter
from specdraft.sampling import SamplingConfig, warp
from specdraft.stats import BatchStats, GenerationStats
from specdraft.target import TargetModel
from specdraft.tree import tree_accept, tree_depth, tree_score
from specdraft.verify import VerifyResult, greedy_verify, rejection_sample


@dataclass(frozen=True)
class GenerationResult:
    """New tokens (prompt excluded) and what the generation measured."""

    token_ids: Tensor  # [1, N] int64 on CPU
    stats: GenerationStats


@dataclass(frozen=True)
class BatchResult:
    """What `generate_batch` returns: one result per prompt, in order, and the batch's stats.
    Iterates and indexes like the list of results."""

    results: list[GenerationResult]
    stats: BatchStats

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, i: int) -> GenerationResult:
        return self.results[i]

    def __iter__(self) -> Iterator[GenerationResult]:
        return iter(self.results)


class SpeculativeDecoder:
    """Generate from `target`, drafting with `drafter` (None = plain autoregressive decoding).

    num_draft_tokens: the draft tokens asked for per round (an int >= 0), or "auto": the cost
        model of `specdraft.draft_length` picks K each round (0 = a plain AR round when drafting
        does not pay) from the acceptance so far and costs measured before the generation; a
        drafter that sizes its own drafts (`Drafter.sizes_own_drafts`) is offered max_draft_tokens
        every round instead.
    max_draft_tokens: the largest K "auto" may choose.
    verify_curve: for "auto": the target's T_v(k)/T_v(0), k = 0..max_draft_tokens; None = the one
        verify-cost model, `specdraft.costs.verify_curve(target, max_draft_tokens)`, measured on the
        first generation that needs it (outside that generation's timings), once per model.
    draft_cost: for "auto": the drafter's seconds per drafted token in units of one target step
        T_v(0); None = measured on the first generation that needs it (outside its timings), once
        per decoder and sampling mode, through the on-disk cost cache when `cost_key` is given.
    cost_key: names the drafter's configuration in the cost cache (the console scripts pass a hash
        of the drafter config), so every run on this machine reuses one measurement and a seeded
        run with "auto" gives the same tokens every time; None = measure once per decoder.
    sampling: temperature / top-k / top-p / seed, applied identically to target and drafter (a
        `generate` call may pass its own instead).
    sampler: the lossless verifier for temperature > 0 (injectable only so that audits such as
        `specdraft-check` can prove they catch a broken one).
    keep_policy: False (default): every `generate` starts the K policy afresh, so a prompt's K
        choices never depend on the prompts before it. True: one policy learns across calls (a
        server that sees one kind of traffic).
    prefix_cache_tokens: 0 (default) = every `generate` prefills its whole prompt; > 0 = keep the
        target's K/V of earlier generations (up to this many positions, `specdraft.prefix_cache`)
        and prefill only what a new prompt does not share with one of them (prefix caching, as
        vLLM and SGLang serve by default). Batch size 1; not with a drafter that reads the
        target's layer features (its head needs every prompt position's features).

    Reproducibility: the tokens are a deterministic function of (seed, prompt, settings, measured
    costs); the wall clock never picks K during a generation. With a fixed num_draft_tokens, or with
    "auto" and the same cost cache (same machine), the same seed gives the same tokens. Across
    machines "auto" may choose other K, and sampled output is then only equal in distribution;
    greedy output is always token-for-token the autoregressive output.
    Construction does no timing and writes nothing: everything measured is measured lazily.
    """

    CALIBRATION_PROMPT = 48  # tokens of the synthetic prompt the drafter's cost is measured on
    CALIBRATION_TOKENS = 32  # tokens generated there at K = max_draft_tokens

    def __init__(
        self,
        target: TargetModel,
        drafter: Drafter | None = None,
        num_draft_tokens: int | str = "auto",
        sampling: SamplingConfig | None = None,
        sampler: Callable[..., VerifyResult] = rejection_sample,
        max_draft_tokens: int = 8,
        verify_curve: Sequence[float] | None = None,
        keep_policy: bool = False,
        draft_cost: float | None = None,
        cost_key: str | None = None,
        prefix_cache_tokens: int = 0,
    ) -> None:
        num_draft_tokens = check_num_draft_tokens(num_draft_tokens)
        check_prefix_cache_tokens(prefix_cache_tokens)
        if prefix_cache_tokens and drafter is not None and tuple(drafter.feature_layers):
            raise ValueError("prefix_cache_tokens > 0 cannot serve a drafter that reads the target's layer features "
                             "(e.g. eagle): it needs every prompt position's features, which a restored prefix "
                             "does not recompute; set prefix_cache_tokens=0 for it.")
        check_max_draft_tokens(max_draft_tokens)
        if isinstance(verify_curve, str) or (verify_curve is not None and len(verify_curve) <= max_draft_tokens):
            raise ValueError(
                f"verify_curve must be None (measure it) or max_draft_tokens + 1 = {max_draft_tokens + 1} "
                f"floats T_v(k)/T_v(0), got {verify_curve!r}."
            )
        if draft_cost is not None and not (isinstance(draft_cost, (int, float)) and draft_cost >= 0):
            raise ValueError(f"draft_cost must be None (measure it) or a number >= 0, got {draft_cost!r}.")
        self.target = target
        self.drafter = drafter
        self.num_draft_tokens = num_draft_tokens if drafter is not None else 0
        self.max_draft_tokens = max_draft_tokens
        self.verify_curve = None if verify_curve is None else [float(c) for c in verify_curve]
        self.draft_cost = None if draft_cost is None else float(draft_cost)
        self.cost_key = cost_key
        self.sampling = sampling or SamplingConfig()
        self.sampler = sampler
        self.keep_policy = keep_policy
        self._kept_policy: DraftLengthPolicy | None = None
        self._kept_bucket = 0  # the largest batch-size bucket the kept policy has costs for
        self._measured_draft_cost: dict[tuple[bool, int], tuple[float, ...]] = {}  # (greedy?, bucket) -> per source
        self.prefix_cache = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens else None
        self._finished: CachedSequence | None = None  # the last generation's K/V, until `learn` keeps it
        if drafter is not None:
            drafter.bind(target)

    # ------------------------------------------------------------------------------- public
    def new_policy(self, sampling: SamplingConfig | None = None, batch_size: int = 1) -> DraftLengthPolicy:
        """A fresh K policy for this decoder's setting; for "auto" this reads the target's verify
        curves (at every batch-size bucket up to `batch_size`'s) and the drafter's cost under
        `sampling` (measured here the first time)."""
        if self.num_draft_tokens != "auto":
            return make_draft_length_policy(self.num_draft_tokens)
        if self._sizes_own_drafts():  # its own cost model picks each round's length, up to the cap
            return make_draft_length_policy(self.max_draft_tokens)
        sampling = sampling or self.sampling
        curve = self.verify_curve or costs.verify_curve(self.target, self.max_draft_tokens)
        buckets = costs.batch_buckets(batch_size)[1:]
        batch_curves = {b: costs.verify_curve(self.target, self.max_draft_tokens, batch_size=b) for b in buckets}
        per_source = [self.draft_costs_per_token(sampling, b) for b in [1, *buckets]]  # [bucket][source]
        policies = [
            make_draft_length_policy("auto", self.max_draft_tokens, curve, per_source[0][s], batch_curves,
                                     {b: c[s] for b, c in zip(buckets, per_source[1:])}, self.target.packs_ragged)
            for s in range(len(per_source[0]))
        ]
        return policies[0] if len(policies) == 1 else PerSourceDraftLength(policies)

    def draft_costs_per_token(self, sampling: SamplingConfig, batch_size: int = 1) -> tuple[float, ...]:
        """The drafter's seconds per drafted token / seconds of one target step, one per draft
        source (`Drafter.draft_sources`; one value for a drafter of one source), under `sampling`'s
        mode (greedy or sampled) at `batch_size` rows (its bucket, `costs.batch_bucket`): given
        (`draft_cost`, the same for every source), cached, or measured now on synthetic prompts."""
        num_sources = max(1, len(self.drafter.draft_sources)) if self.drafter is not None else 1
        if self.draft_cost is not None:
            return (self.draft_cost,) * num_sources
        greedy, bucket = sampling.greedy, costs.batch_bucket(batch_size)
        if (greedy, bucket) not in self._measured_draft_cost:
            def measure() -> list[float]:
                return self._measure_draft_cost(sampling, bucket)

            if self.cost_key is None or self.max_draft_tokens == 0:
                value = measure()
            else:
                key = (f"draft_cost|{costs.cost_key(self.target)}|{self.cost_key}|"
                       f"{'greedy' if greedy else 'sample'}|k={self.max_draft_tokens}"
                       + (f"|batch={bucket}" if bucket > 1 else "") + f"|sources={num_sources}")
                value = costs.cached_value(key, measure, lambda v: costs.is_draft_cost(v, num_sources))
            self._measured_draft_cost[greedy, bucket] = tuple(float(v) for v in value)
        return self._measured_draft_cost[greedy, bucket]

    def generate(
        self,
        prompt_ids: Tensor | Sequence[int],
        max_new_tokens: int,
        stop_token_ids: Sequence[int] | None = None,
        sampling: SamplingConfig | None = None,
        learn: bool = True,
    ) -> GenerationResult:
        """Generate up to `max_new_tokens` tokens after `prompt_ids` ([T] or [1, T] token ids).

        Generation ends after the first stop token (default: the target's EOS tokens; pass [] to
        disable), which is included in the output. `sampling` overrides the decoder's settings for
        this call only. learn: let the drafter remember this generation for later requests
        (`Drafter.learn`; only suffix decoding keeps anything); the bench passes False and calls
        `learn` itself once per prompt, so repeated timings of one prompt see the same store.
        For many prompts at once use `generate_batch`.
        """
        prompt = torch.as_tensor(prompt_ids, dtype=torch.long).cpu()
        if prompt.dim() == 2 and prompt.shape[0] == 1:
            prompt = prompt[0]
        if prompt.dim() != 1:
            raise ValueError(
                f"prompt_ids must have shape [T] or [1, T], got {tuple(prompt.shape)}; decode several "
                "prompts at once with generate_batch."
            )
        return self.generate_batch([prompt], max_new_tokens, stop_token_ids, sampling, learn).results[0]

    def generate_batch(
        self,
        prompts: Sequence[Tensor | Sequence[int]],
        max_new_tokens: int,
        stop_token_ids: Sequence[int] | None = None,
        sampling: SamplingConfig | None = None,
        learn: bool = True,
    ) -> BatchResult:
        """Generate up to `max_new_tokens` tokens after each of `prompts` (token ids [T_i] each, of
        any lengths) in one batch: one target forward per round scores every live row's newest
        token and draft, each row accepts its own number of tokens and stops on its own stop token
        or budget, and finished rows leave the batch. Returns one `GenerationResult` per prompt,
        in order (each row's stats; its total_s is its latency), and the batch's `BatchStats`.
        With greedy decoding every row is exactly its prompt's `generate` output. Sampled rows
        share one random generator, so they are equal to `generate`'s in distribution only.
        """
        batch = self._check_inputs(prompts, max_new_tokens)  # [T_i] each, on CPU
        if len(batch) > 1 and self.drafter is not None and not type(self.drafter).batched:
            raise ValueError(
                f"{type(self.drafter).__name__} drafts for one sequence at a time (batched = False); "
                "decode its prompts one by one with generate, or choose a drafter that batches."
            )
        stop = set(self.target.eos_token_ids if stop_token_ids is None else stop_token_ids)
        sampling = sampling or self.sampling
        self._measure_costs(sampling, len(batch))  # before the clock starts: not this call's time
        result = self._run(batch, max_new_tokens, stop, sampling, self._policy(sampling, len(batch)))
        if learn:
            for prompt, row in zip(batch, result.results):
                self.learn(prompt, row.token_ids[0])
        return result

    def learn(self, prompt_ids: Tensor | Sequence[int], new_token_ids: Tensor | Sequence[int]) -> dict[str, Any]:
        """Tell the decoder a generation finished: prompt_ids [T] were answered with new_token_ids
        [N]. The prefix cache (if any) keeps the K/V of the last generation as far as it agrees
        with these tokens; returns what the drafter now keeps across requests (`Drafter.learn`;
        {} for most)."""
        prompt = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1).cpu()
        new = torch.as_tensor(new_token_ids, dtype=torch.long).reshape(-1).cpu()
        full = torch.cat([prompt, new])  # [T + N]
        if self.prefix_cache is not None and self._finished is not None:
            self.prefix_cache.add(self._finished.prefix(common_prefix(self._finished.tokens, full)))
            self._finished = None
        if self.drafter is None:
            return {}
        return self.drafter.learn(full, prompt.shape[0])

    # ------------------------------------------------------------------------------- steps
    def _run(
        self, prompts: list[Tensor], max_new_tokens: int, stop: set[int], sampling: SamplingConfig,
        policy: DraftLengthPolicy, remember: bool = True,
    ) -> BatchResult:
        """The decoding loop for checked prompts [T_i] (see the module docstring). Row i's tokens
        live in buf[i, starts[i]:ends[i]]: prompts are left padded to the longest, so a batch of
        equal prompts (and batch size 1) keeps one common end and contexts are views.
        remember: with a prefix cache, restore a shared prefix and copy the finished sequence's
        K/V for `learn` to keep (False for calibration runs: they neither read nor feed it)."""
        needs_hidden = bool(self.drafter is not None and self.drafter.needs_target_hidden)
        layers = tuple(self.drafter.feature_layers) if self.drafter is not None else ()
        if layers and len(prompts) > 1:
            raise ValueError("a drafter that reads the target's layer features drafts for one sequence at a time; "
                             "decode its prompts one by one with generate.")
        device = self.target.device
        gen = sampling.make_generator("cpu")
        stats = [GenerationStats(prompt_tokens=len(p)) for p in prompts]
        batch_stats = BatchStats(batch_size=len(prompts))
        t_start = time.perf_counter()

        width = max(len(p) for p in prompts)
        buf = torch.zeros((len(prompts), width + max_new_tokens), dtype=torch.long, device=device)  # [B, P+N]
        starts = [width - len(p) for p in prompts]
        ends = [width] * len(prompts)
        for i, p in enumerate(prompts):
            buf[i, starts[i] : width] = p.to(device)
        prefixed = self.prefix_cache is not None and len(prompts) == 1 and remember
        reused = 0  # prompt positions whose K/V an earlier generation computed (at least one is prefilled)
        if prefixed:
            assert self.prefix_cache is not None
            reused = self.prefix_cache.restore(self.target, prompts[0], limit=width - 2)
        else:
            self.target.reset()
        if self.drafter is not None:
            self.drafter.reset()
        hidden = features = None
        if width > 1:  # prefill everything but each row's newest token, which opens the first round
            valid = None
            if any(starts):  # ragged prompts: the padding is masked and has no position
                valid = torch.arange(width - 1)[None] >= torch.tensor(starts)[:, None]  # [B, P-1]
            out = self.target.forward(buf[:, reused : width - 1], num_logits=0, valid=valid, features=layers)
            hidden = out.hidden[:, -1] if needs_hidden else None  # [B, H]
            features = out.features  # [1, P-1, F] or None
        batch_stats.prefill_s = time.perf_counter() - t_start
        for row in stats:
            row.prefill_s = batch_stats.prefill_s
            row.cached_prompt_tokens = reused

        live = list(range(len(prompts)))  # the rows still generating, in the target's cache order
        generated = [0] * len(prompts)
        ctx = _context(buf, starts, ends, live, hidden, sampling, gen, features)
        delivered = False  # whether the drafter has seen `features` (a K = 0 round does not show it ctx)
        while live and max_new_tokens > 0:
            b = len(live)
            lengths = ctx.row_lengths()
            t0 = time.perf_counter()
            sources = self._row_sources(ctx)  # each row's draft source, None = the drafter has one
            k_max = policy.choose(max(max_new_tokens - generated[i] for i in live) - 1, batch_size=b, sources=sources)
            delivered = delivered or (self.drafter is not None and k_max > 0)  # propose sees ctx's features
            draft, depth = self._propose(ctx, k_max, device)  # depth: draft steps, what K sizes
            t1 = time.perf_counter()
            k = draft.num_tokens  # the positions the target scores (a tree's nodes)
            inputs = torch.cat([ctx.token_ids[:, -1:], draft.token_ids], dim=1)  # [b, K+1]
            if draft.parents is not None:  # a candidate tree (batch size 1): one forward with the tree mask
                out = tree_score(self.target, inputs, draft, layers)
            elif draft.lengths is None:
                out = self.target.forward(inputs, features=layers)  # logits [b, K+1, V]
            else:  # rows drafted different numbers of tokens: the padding is masked
                real = torch.arange(k + 1, device=device)[None] <= draft.lengths.to(device)[:, None]  # [b, K+1]
                out = self.target.forward(inputs, valid=real, features=layers)
            t2 = time.perf_counter()
            draft_s = t1 - t0

            if draft.parents is None:
                result = self._verify(draft, out.logits, sampling, gen)
            else:  # verify the tree; the cache keeps the accepted path, returned as a chain
                draft, out, result = tree_accept(self.target, draft, out, sampling, gen)
            # One host sync per round: accepted counts, next tokens, drafts (and their lengths).
            parts = [result.num_accepted, result.next_token, draft.token_ids.reshape(-1)]
            if draft.lengths is not None:
                parts.append(draft.lengths.to(device))
            host = torch.cat([t.to(device) for t in parts]).tolist()
            accepted, nxt = host[:b], host[b : 2 * b]
            drafts = [host[2 * b + j * k : 2 * b + (j + 1) * k] for j in range(b)]
            drafted = host[2 * b + b * k :] if draft.lengths is not None else [depth] * b
            finished = []
            for j, i in enumerate(live):
                emitted = drafts[j][: accepted[j]] + [nxt[j]]
                stopped = next((m for m, tok in enumerate(emitted) if tok in stop), None)
                if stopped is not None:
                    emitted = emitted[: stopped + 1]
                emitted = emitted[: max_new_tokens - generated[i]]
                buf[i, ends[i] : ends[i] + len(emitted)] = torch.tensor(emitted, device=device)
                ends[i] += len(emitted)
                generated[i] += len(emitted)
                if stopped is not None or generated[i] >= max_new_tokens:
                    finished.append(j)
                source = sources[j] if sources is not None else 0
                stats[i].record_round(drafted[j], accepted[j], len(emitted), draft_s, t2 - t1, source)
                # never a time: K must not depend on the clock. In a batch a row that drafted fewer than
                # K counts its shortfall as a rejection (specdraft/draft_length.py says what it costs).
                policy.observe(drafted[j], accepted[j], k if b > 1 else None, source)
            # cache: each row's committed prefix + its accepted draft
            self.target.crop(lengths[0] + accepted[0] if b == 1 else [n + a for n, a in zip(lengths, accepted)])
            if needs_hidden:
                hidden = out.hidden[torch.arange(b, device=device), torch.tensor(accepted, device=device)]  # [b, H]
            if layers:  # batch size 1: the newest token's and the accepted drafts' positions [1, a + 1, F],
                kept = out.features[:, : accepted[0] + 1]  # after what the drafter has not seen yet
                features = kept if delivered or features is None else torch.cat([features, kept], dim=1)
                delivered = False
            batch_stats.rounds += 1
            batch_stats.drafted_per_round.append(k)
            batch_stats.live_rows_per_round.append(b)

            if finished:  # finished rows leave the batch: later forwards cost nothing for them
                now = time.perf_counter()
                for j in finished:
                    stats[live[j]].total_s = now - t_start
                keep = [j for j in range(b) if j not in finished]
                if keep:
                    self.target.keep_rows(keep)
                    if self.drafter is not None:
                        self.drafter.keep_rows(keep)
                    hidden = None if hidden is None else hidden[torch.tensor(keep, device=device)]
                live, accepted = [live[j] for j in keep], [accepted[j] for j in keep]
            if not live:
                break
            ctx = _context(buf, starts, ends, live, hidden, sampling, gen, features)
            if self.drafter is not None:
                t3 = time.perf_counter()
                self.drafter.commit(ctx, accepted)
                delivered = True
                stats_s = time.perf_counter() - t3
                for i in live:
                    stats[i].draft_s += stats_s
                    stats[i].draft_s_per_round[-1] += stats_s

        if prefixed:  # this sequence's K/V, kept for later prompts by `learn`
            assert self.prefix_cache is not None  # (the cache may also hold a stopped tail: cut to `ends`)
            self._finished = self.prefix_cache.snapshot(self.target, buf[0, : min(self.target.cache_length, ends[0])])
        batch_stats.total_s = time.perf_counter() - t_start
        results = []
        for i, row in enumerate(stats):
            if not row.total_s:
                row.total_s = batch_stats.total_s
            batch_stats.new_tokens += row.new_tokens
            results.append(GenerationResult(token_ids=buf[i : i + 1, width : ends[i]].cpu(), stats=row))
        return BatchResult(results=results, stats=batch_stats)

    def _measure_costs(self, sampling: SamplingConfig, batch_size: int = 1) -> None:
        """Measure the target's verify-cost curve as far as the K policy and the drafter read it
        (once per process and model; `specdraft.costs.verify_curve` keeps it on the target), for
        "auto" at every batch-size bucket a batch of `batch_size` rows passes through, and the
        drafter's cost per token, so that nothing is measured in the middle of a generation,
        where measuring would clear the KV cache."""
        if self.drafter is None:
            return
        need = self.drafter.verify_curve_tokens
        if self.num_draft_tokens == "auto" and self.verify_curve is None:
            need = max(need, self.max_draft_tokens)
        if need > 0:
            costs.verify_curve(self.target, need)
        if self.num_draft_tokens == "auto" and not self._sizes_own_drafts():
            self.draft_costs_per_token(sampling)
            for bucket in costs.batch_buckets(batch_size)[1:]:
                costs.verify_curve(self.target, self.max_draft_tokens, batch_size=bucket)
                self.draft_costs_per_token(sampling, bucket)

    def _measure_draft_cost(self, sampling: SamplingConfig, batch_size: int = 1) -> list[float]:
        """Time the drafter at K = max_draft_tokens on a synthetic, repetitive prompt (so copying
        drafters find matches; `batch_size` rows of slightly different lengths, a ragged batch),
        relative to the target's verify forwards of the same run: see
        `specdraft.costs.draft_cost_ratios`. A drafter of several sources is also timed on a prompt
        that never repeats (its model drafts there) and each source's cost is the median over the
        rounds its first row drafted from it (over all rounds if it drafted none). One value per
        source. Uses its own seed; leaves no state behind."""
        k = self.max_draft_tokens
        num_sources = max(1, len(self.drafter.draft_sources)) if self.drafter is not None else 1
        if k == 0:
            return [0.0] * num_sources
        length = max(2, min(self.CALIBRATION_PROMPT, self.target.max_context // 2))
        new = max(1, min(self.CALIBRATION_TOKENS, self.target.max_context - length))
        vocab = self.target.vocab_size
        patterns = [((torch.arange(length) % 17) * 7919 + 11) % vocab]  # [T] a period-17 token pattern
        if num_sources > 1:
            patterns.append((torch.arange(length) * 7919 + 11) % vocab)  # [T] no token pair repeats
        sources: list[int] = []
        ratios: list[float | None] = []
        for prompt in patterns:
            prompts = [prompt[i % 3 :] for i in range(batch_size)]
            run = self._run(prompts, new, set(), sampling.with_seed(0), make_draft_length_policy(k), remember=False)
            stats = run.results[0].stats  # a round's draft and verify seconds are the batch's
            self.target.reset()
            self.drafter.reset()  # type: ignore[union-attr]
            scored = run.stats.drafted_per_round  # tokens each round's verify forward scored (a tree's nodes)
            drafted = stats.drafted_per_round if batch_size == 1 else scored  # draft steps (a tree's depth)
            longest = max(scored, default=0)
            if batch_size > 1:
                curve = costs.verify_curve(self.target, longest, batch_size=batch_size)
            else:
                curve = self.verify_curve if self.verify_curve and len(self.verify_curve) > longest \
                    else costs.verify_curve(self.target, longest)
            ratios += costs.draft_cost_ratios(drafted, stats.draft_s_per_round, stats.verify_s_per_round, curve, scored)
            sources += stats.source_per_round
        return costs.draft_costs_by_source(sources, ratios, num_sources)

    def _sizes_own_drafts(self) -> bool:
        return self.drafter is not None and type(self.drafter).sizes_own_drafts

    def _policy(self, sampling: SamplingConfig, batch_size: int = 1) -> DraftLengthPolicy:
        """This call's K policy: fresh, or the one kept across calls (keep_policy=True; made
        afresh when a batch is larger than any the kept one has costs for)."""
        if not self.keep_policy:
            return self.new_policy(sampling, batch_size)
        bucket = costs.batch_bucket(batch_size)
        if self._kept_policy is None or bucket > self._kept_bucket:
            self._kept_policy, self._kept_bucket = self.new_policy(sampling, batch_size), bucket
        return self._kept_policy

    def _row_sources(self, ctx: DraftContext) -> list[int] | None:
        """Each live row's draft source for the next round (`Drafter.source_of`), or None for a
        drafter of one source."""
        if self.drafter is None or len(self.drafter.draft_sources) < 2:
            return None
        sources = list(self.drafter.source_of(ctx))
        if len(sources) != ctx.batch_size or not all(0 <= s < len(self.drafter.draft_sources) for s in sources):
            raise ValueError(
                f"{type(self.drafter).__name__}.source_of returned {sources}; need one index into draft_sources "
                f"{self.drafter.draft_sources} per row ({ctx.batch_size} rows)."
            )
        return sources

    def _propose(self, ctx: DraftContext, k_max: int, device: torch.device) -> tuple[Draft, int]:
        """The drafter's proposal, checked and on `device`, and its depth (a chain's K, a tree's depth)."""
        b = ctx.batch_size
        if self.drafter is None or k_max <= 0:
            return Draft(token_ids=torch.empty((b, 0), dtype=torch.long, device=device)), 0
        draft = self.drafter.propose(ctx, k_max)
        name = type(self.drafter).__name__
        depth = draft.num_tokens if draft.parents is None else tree_depth(draft.parents[0].tolist())
        if depth > k_max or draft.token_ids.shape[0] != b:
            raise ValueError(
                f"{name}.propose returned a draft of shape {tuple(draft.token_ids.shape)} (depth {depth}) but "
                f"[{b}, <= {k_max}] was asked for; a drafter returns one row per sequence and at most "
                "num_tokens tokens (a tree: at most num_tokens deep)."
            )
        if draft.parents is not None and b > 1:
            raise ValueError(f"{name} proposed a candidate tree for {b} rows; trees verify at batch size 1 only.")
        lengths = None
        if draft.lengths is not None:
            lengths = draft.lengths.to(device)
            if lengths.shape != (b,) or bool((lengths < 0).any()) or bool((lengths > draft.num_tokens).any()):
                raise ValueError(f"{name}.propose returned lengths {draft.lengths.tolist()}; need {b} counts in "
                                 f"[0, {draft.num_tokens}].")
            if bool((lengths == draft.num_tokens).all()):
                lengths = None  # every row is whole: no padding to mask
        parents = None if draft.parents is None else draft.parents.to(device)  # a tree (Medusa)
        return Draft(token_ids=draft.token_ids.to(device), probs=draft.probs, parents=parents, lengths=lengths), depth

    def _verify(
        self, draft: Draft, logits: Tensor, sampling: SamplingConfig, gen: torch.Generator
    ) -> VerifyResult:
        if sampling.greedy:
            return greedy_verify(draft.token_ids, logits, draft.lengths)
        target_probs = warp(logits, sampling)  # [B, K+1, V]
        if draft.lengths is None:  # the injectable sampler's plain form
            return self.sampler(draft.token_ids, draft.probs, target_probs, gen)
        return self.sampler(draft.token_ids, draft.probs, target_probs, gen, lengths=draft.lengths)

    def _check_inputs(self, prompts: Sequence[Tensor | Sequence[int]], max_new_tokens: int) -> list[Tensor]:
        """The prompts as CPU int64 [T_i] each, or a ValueError naming what is wrong and the fix."""
        if isinstance(prompts, Tensor):
            if prompts.dim() != 2:
                raise ValueError(f"a tensor of prompts must have shape [B, T], got {tuple(prompts.shape)}.")
            prompts = list(prompts)
        if isinstance(prompts, (str, bytes)) or len(prompts) == 0:
            raise ValueError("generate_batch needs a non-empty list of prompts (token ids each).")
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}.")
        vocab = self.target.vocab_size
        checked = []
        for i, prompt_ids in enumerate(prompts):
            prompt = torch.as_tensor(prompt_ids, dtype=torch.long).cpu().reshape(-1) \
                if not isinstance(prompt_ids, Tensor) or prompt_ids.dim() <= 1 else None
            where = f"prompt {i}" if len(prompts) > 1 else "the prompt"
            if prompt is None:
                raise ValueError(f"{where} must be token ids of shape [T], got a tensor of shape "
                                 f"{tuple(prompt_ids.shape)}.")
            if prompt.numel() == 0:
                raise ValueError(f"{where} is empty; give at least one token (e.g. the BOS token).")
            total = prompt.numel() + max_new_tokens
            if total > self.target.max_context:
                raise ValueError(
                    f"{where} ({prompt.numel()} tokens) + max_new_tokens ({max_new_tokens}) = {total} "
                    f"exceeds the target's context length of {self.target.max_context}; shorten the "
                    "prompt or lower max_new_tokens."
                )
            if int(prompt.min()) < 0 or int(prompt.max()) >= vocab:
                raise ValueError(f"{where}'s token ids must be in [0, {vocab}) for this target.")
            checked.append(prompt)
        return checked


def _context(buf: Tensor, starts: list[int], ends: list[int], live: list[int], hidden: Tensor | None,
             sampling: SamplingConfig, gen: torch.Generator, features: Tensor | None = None) -> DraftContext:
    """The live rows' committed tokens as a `DraftContext`: row i is buf[i, starts[i]:ends[i]]
    ([B, P+N] buffer), left padded to the longest (a view when the rows are one aligned block, as
    at batch size 1); hidden [B, H] and features [1, n, F] as `DraftContext` describes them."""
    lengths = tuple(ends[i] - starts[i] for i in live)
    longest = max(lengths)
    aligned = len(set(ends[i] for i in live)) == 1
    if aligned and live == list(range(live[0], live[0] + len(live))):
        tokens = buf[live[0] : live[-1] + 1, ends[live[0]] - longest : ends[live[0]]]  # [b, T] a view
    else:
        rows = torch.tensor(live, device=buf.device)
        cols = torch.tensor([ends[i] for i in live], device=buf.device)[:, None] - longest \
            + torch.arange(longest, device=buf.device)[None]  # [b, T]
        tokens = buf[rows].gather(1, cols.clamp(min=0))
    return DraftContext(tokens, hidden, sampling, gen, lengths=None if len(set(lengths)) == 1 else lengths,
                        target_features=features)
