"""SpeculativeDecoder: the decoding loop shared by every drafter and by the AR baseline.

One round:
    1. the drafter proposes K tokens continuing the committed sequence,
    2. the target scores [newest token] + draft (K+1 positions) in ONE forward with its KV cache,
    3. the verifier keeps `num_accepted` draft tokens and emits one more (recovered or bonus),
    4. the target's cache is cropped to the accepted prefix and the drafter commits.
The newest committed token is never in the target's cache at the start of a round: it is the first
input of the next forward. The autoregressive baseline is this same loop with K = 0 (`drafter=None`),
so speedups compare like with like.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from specdraft import costs
from specdraft.draft_length import (
    DraftLengthPolicy,
    check_max_draft_tokens,
    check_num_draft_tokens,
    make_draft_length_policy,
)
from specdraft.protocol import Draft, DraftContext, Drafter
from specdraft.sampling import SamplingConfig, warp
from specdraft.stats import GenerationStats
from specdraft.target import TargetModel
from specdraft.tree import tree_accept, tree_score
from specdraft.verify import VerifyResult, greedy_verify, rejection_sample


@dataclass(frozen=True)
class GenerationResult:
    """New tokens (prompt excluded) and what the generation measured."""

    token_ids: Tensor  # [B, N] int64 on CPU
    stats: GenerationStats


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
    ) -> None:
        num_draft_tokens = check_num_draft_tokens(num_draft_tokens)
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
        self._measured_draft_cost: dict[bool, float] = {}  # greedy? -> draft cost, once per decoder
        if drafter is not None:
            drafter.bind(target)

    # ------------------------------------------------------------------------------- public
    def new_policy(self, sampling: SamplingConfig | None = None) -> DraftLengthPolicy:
        """A fresh K policy for this decoder's setting; for "auto" this reads the target's verify
        curve and the drafter's cost under `sampling` (measured here the first time)."""
        if self.num_draft_tokens != "auto":
            return make_draft_length_policy(self.num_draft_tokens)
        if self._sizes_own_drafts():  # its own cost model picks each round's length, up to the cap
            return make_draft_length_policy(self.max_draft_tokens)
        curve = self.verify_curve or costs.verify_curve(self.target, self.max_draft_tokens)
        draft_cost = self.draft_cost_per_token(sampling or self.sampling)
        return make_draft_length_policy("auto", self.max_draft_tokens, curve, draft_cost)

    def draft_cost_per_token(self, sampling: SamplingConfig) -> float:
        """The drafter's seconds per drafted token / seconds of one target step, under `sampling`'s
        mode (greedy or sampled): given, cached, or measured now on a synthetic prompt."""
        if self.draft_cost is not None:
            return self.draft_cost
        greedy = sampling.greedy
        if greedy not in self._measured_draft_cost:
            def measure() -> float:
                return self._measure_draft_cost(sampling)

            if self.cost_key is None or self.max_draft_tokens == 0:
                value = measure()
            else:
                key = (f"draft_cost|{costs.cost_key(self.target)}|{self.cost_key}|"
                       f"{'greedy' if greedy else 'sample'}|k={self.max_draft_tokens}")
                value = costs.cached_value(key, measure, costs.is_draft_cost)
            self._measured_draft_cost[greedy] = float(value)
        return self._measured_draft_cost[greedy]

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
        """
        prompt = self._check_inputs(prompt_ids, max_new_tokens)  # [1, T] on CPU
        stop = set(self.target.eos_token_ids if stop_token_ids is None else stop_token_ids)
        sampling = sampling or self.sampling
        self._measure_costs(sampling)  # before the clock starts: a first measurement is not this call's time
        result = self._run(prompt, max_new_tokens, stop, sampling, self._policy(sampling))
        if learn:
            self.learn(prompt[0], result.token_ids[0])
        return result

    def learn(self, prompt_ids: Tensor | Sequence[int], new_token_ids: Tensor | Sequence[int]) -> dict[str, Any]:
        """Tell the drafter a generation finished: prompt_ids [T] were answered with new_token_ids
        [N]. Returns what the drafter now keeps across requests (`Drafter.learn`; {} for most)."""
        if self.drafter is None:
            return {}
        prompt = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1).cpu()
        new = torch.as_tensor(new_token_ids, dtype=torch.long).reshape(-1).cpu()
        return self.drafter.learn(torch.cat([prompt, new]), prompt.shape[0])  # [T + N]

    # ------------------------------------------------------------------------------- steps
    def _run(
        self, prompt: Tensor, max_new_tokens: int, stop: set[int], sampling: SamplingConfig,
        policy: DraftLengthPolicy,
    ) -> GenerationResult:
        """The decoding loop for a checked prompt [1, T] (see the module docstring)."""
        needs_hidden = bool(self.drafter is not None and self.drafter.needs_target_hidden)
        device = self.target.device
        gen = sampling.make_generator("cpu")
        stats = GenerationStats(prompt_tokens=prompt.shape[1])
        t_start = time.perf_counter()

        # Committed tokens live in one preallocated buffer; contexts are views of it.
        n = prompt.shape[1]
        buf = torch.empty((1, n + max_new_tokens), dtype=torch.long, device=device)  # [1, T+N]
        buf[:, :n] = prompt.to(device)
        self.target.reset()
        if self.drafter is not None:
            self.drafter.reset()
        hidden = None
        if n > 1:  # prefill everything but the newest token, which opens the first round
            out = self.target.forward(buf[:, : n - 1], num_logits=0)
            hidden = out.hidden[:, -1] if needs_hidden else None  # [1, H]
        stats.prefill_s = time.perf_counter() - t_start

        generated, done = 0, max_new_tokens == 0
        while not done:
            ctx = DraftContext(buf[:, :n], hidden, sampling, gen)
            k_max = policy.choose(max_new_tokens - generated - 1)

            t0 = time.perf_counter()
            draft = self._propose(ctx, k_max, device)
            t1 = time.perf_counter()
            k = draft.num_tokens
            inputs = torch.cat([buf[:, n - 1 : n], draft.token_ids], dim=1)  # [1, K+1]
            if draft.parents is None:
                out = self.target.forward(inputs)  # logits [1, K+1, V]
            else:  # a candidate tree: one forward with the tree mask
                out = tree_score(self.target, inputs, draft)
            t2 = time.perf_counter()
            draft_s = t1 - t0

            if draft.parents is None:
                result = self._verify(draft, out.logits, sampling, gen)
            else:  # verify the tree; the cache keeps the accepted path, returned as a chain
                draft, out, result = tree_accept(self.target, draft, out, sampling, gen)
            # One host sync per round: accepted count, draft and next token together.
            host = torch.cat([result.num_accepted, draft.token_ids[0], result.next_token]).tolist()
            num_accepted = host[0]
            emitted = host[1 : 1 + num_accepted] + [host[-1]]
            for i, tok in enumerate(emitted):
                if tok in stop:
                    emitted, done = emitted[: i + 1], True
                    break
            buf[0, n : n + len(emitted)] = torch.tensor(emitted, device=device)
            self.target.crop(n + num_accepted)  # cache: committed prefix + accepted draft
            n += len(emitted)
            generated += len(emitted)
            done = done or generated >= max_new_tokens
            if needs_hidden:
                hidden = out.hidden[:, num_accepted]  # [1, H] produced the new newest token

            if self.drafter is not None and not done:
                t3 = time.perf_counter()
                self.drafter.commit(DraftContext(buf[:, :n], hidden, sampling, gen), num_accepted)
                draft_s += time.perf_counter() - t3
            stats.record_round(k, num_accepted, len(emitted), draft_s, t2 - t1)
            policy.observe(k, num_accepted)  # never a time: K must not depend on the clock

        new_tokens = buf[:, prompt.shape[1] : n].cpu()  # [1, N]
        stats.total_s = time.perf_counter() - t_start
        return GenerationResult(token_ids=new_tokens, stats=stats)

    def _measure_costs(self, sampling: SamplingConfig) -> None:
        """Measure the target's verify-cost curve as far as the K policy and the drafter read it
        (once per process and model; `specdraft.costs.verify_curve` keeps it on the target) and,
        for "auto", the drafter's cost per token, so that neither is measured in the middle of a
        generation, where measuring would clear the KV cache."""
        if self.drafter is None:
            return
        need = type(self.drafter).verify_curve_tokens
        if self.num_draft_tokens == "auto" and self.verify_curve is None:
            need = max(need, self.max_draft_tokens)
        if need > 0:
            costs.verify_curve(self.target, need)
        if self.num_draft_tokens == "auto" and not self._sizes_own_drafts():
            self.draft_cost_per_token(sampling)

    def _measure_draft_cost(self, sampling: SamplingConfig) -> float:
        """Time the drafter at K = max_draft_tokens on a synthetic, repetitive prompt (so copying
        drafters find matches), relative to the target's verify forwards of the same run: see
        `specdraft.costs.draft_cost_from_rounds`. Uses its own seed; leaves no state behind."""
        k = self.max_draft_tokens
        if k == 0:
            return 0.0
        length = max(2, min(self.CALIBRATION_PROMPT, self.target.max_context // 2))
        new = max(1, min(self.CALIBRATION_TOKENS, self.target.max_context - length))
        vocab = self.target.vocab_size
        prompt = ((torch.arange(length) % 17) * 7919 + 11) % vocab  # [T] a period-17 token pattern
        stats = self._run(prompt[None], new, set(), sampling.with_seed(0), make_draft_length_policy(k)).stats
        self.target.reset()
        self.drafter.reset()  # type: ignore[union-attr]
        longest = max(stats.drafted_per_round, default=0)  # a tree drafter may score more nodes
        curve = self.verify_curve if self.verify_curve and len(self.verify_curve) > longest \
            else costs.verify_curve(self.target, longest)
        return costs.draft_cost_from_rounds(
            stats.drafted_per_round, stats.draft_s_per_round, stats.verify_s_per_round, curve
        )

    def _sizes_own_drafts(self) -> bool:
        return self.drafter is not None and type(self.drafter).sizes_own_drafts

    def _policy(self, sampling: SamplingConfig) -> DraftLengthPolicy:
        """This call's K policy: fresh, or the one kept across calls (keep_policy=True)."""
        if not self.keep_policy:
            return self.new_policy(sampling)
        if self._kept_policy is None:
            self._kept_policy = self.new_policy(sampling)
        return self._kept_policy

    def _propose(self, ctx: DraftContext, k_max: int, device: torch.device) -> Draft:
        if self.drafter is None or k_max <= 0:
            return Draft(token_ids=torch.empty((1, 0), dtype=torch.long, device=device))
        draft = self.drafter.propose(ctx, k_max)
        if draft.num_tokens > k_max:
            raise ValueError(
                f"{type(self.drafter).__name__}.propose returned {draft.num_tokens} tokens but "
                f"{k_max} were asked for; a drafter must return at most num_tokens tokens."
            )
        parents = None if draft.parents is None else draft.parents.to(device)  # a tree (Medusa)
        return Draft(token_ids=draft.token_ids.to(device), probs=draft.probs, parents=parents)

    def _verify(
        self, draft: Draft, logits: Tensor, sampling: SamplingConfig, gen: torch.Generator
    ) -> VerifyResult:
        if sampling.greedy:
            return greedy_verify(draft.token_ids, logits)
        target_probs = warp(logits, sampling)  # [1, K+1, V]
        return self.sampler(draft.token_ids, draft.probs, target_probs, gen)

    def _check_inputs(self, prompt_ids: Tensor | Sequence[int], max_new_tokens: int) -> Tensor:
        prompt = torch.as_tensor(prompt_ids, dtype=torch.long).cpu()
        if prompt.dim() == 1:
            prompt = prompt[None]
        if prompt.dim() != 2:
            raise ValueError(f"prompt_ids must have shape [T] or [B, T], got {tuple(prompt.shape)}.")
        if prompt.shape[0] != 1:
            raise NotImplementedError(
                f"batch size {prompt.shape[0]} is not supported yet; generate one prompt at a time."
            )
        if prompt.shape[1] == 0:
            raise ValueError("the prompt is empty; give at least one token (e.g. the BOS token).")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}.")
        total = prompt.shape[1] + max_new_tokens
        if total > self.target.max_context:
            raise ValueError(
                f"prompt ({prompt.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) = {total} "
                f"exceeds the target's context length of {self.target.max_context}; shorten the "
                "prompt or lower max_new_tokens."
            )
        vocab = self.target.vocab_size
        if int(prompt.min()) < 0 or int(prompt.max()) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab}) for this target.")
        return prompt
