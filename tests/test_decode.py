"""The decoding loop on tiny random targets: greedy exactness, stop tokens, max_new_tokens,
bad input, K choices independent of earlier calls. Reference = Hugging Face greedy `generate` (tests/helpers.plain_greedy)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import pytest
import torch

from drafters.ngram import NGramDrafter
from specdraft import decode as decode_module
from specdraft.decode import SpeculativeDecoder
from specdraft.models import tiny_random_llama, tiny_random_target
from specdraft.protocol import Draft, DraftContext, Drafter
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel
from tests.helpers import RecomputeDrafter, plain_greedy

PROMPT = [1, 2, 3, 4, 5, 1, 2, 3, 6, 7, 1, 2]


class OracleDrafter:
    """Proposes the reference continuation (so whole blocks are accepted), optionally corrupted
    at every absolute position divisible by `corrupt_every`."""

    needs_target_hidden: ClassVar[bool] = False
    feature_layers: tuple[int, ...] = ()
    draft_sources: tuple[str, ...] = ()
    hf_counterpart: ClassVar[str | None] = None
    verify_curve_tokens: int = 0
    sizes_own_drafts: ClassVar[bool] = False
    batched: ClassVar[bool] = False  # drafts for one sequence

    def __init__(self, full_sequence: list[int], corrupt_every: int = 0, vocab: int = 16) -> None:
        self.seq = full_sequence
        self.corrupt_every = corrupt_every
        self.vocab = vocab

    def bind(self, target: TargetModel) -> None: ...
    def reset(self) -> None: ...
    def commit(self, ctx: DraftContext, num_accepted: Sequence[int]) -> None: ...
    def keep_rows(self, rows: Sequence[int]) -> None: ...
    def learn(self, token_ids: torch.Tensor, prompt_len: int) -> dict: return {}

    def source_of(self, ctx: DraftContext) -> list[int]:
        """One source."""
        return [0] * ctx.batch_size

    def propose(self, ctx: DraftContext, num_tokens: int) -> Draft:
        t = ctx.token_ids.shape[1]
        toks = self.seq[t : t + num_tokens]
        if self.corrupt_every:
            toks = [
                (x + 1) % self.vocab if (t + i) % self.corrupt_every == 0 else x
                for i, x in enumerate(toks)
            ]
        return Draft(token_ids=torch.tensor([toks], dtype=torch.long).reshape(1, len(toks)))


def test_oracle_satisfies_protocol() -> None:
    assert isinstance(OracleDrafter([]), Drafter)
    assert isinstance(NGramDrafter(), Drafter)


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("seed", [1, 2])
def test_greedy_exact_with_ngram(k: int, seed: int) -> None:
    target = tiny_random_target(vocab_size=16, seed=seed)
    ref = plain_greedy(target, PROMPT, 48)
    out = SpeculativeDecoder(target, NGramDrafter(1, 3), k).generate(PROMPT, 48)
    assert out.token_ids[0].tolist() == ref
    assert out.stats.new_tokens == 48


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_exact_with_a_model_drafter(tiny_target: TargetModel, k: int) -> None:
    ref = plain_greedy(tiny_target, PROMPT, 30)
    drafter = RecomputeDrafter(tiny_random_llama(vocab_size=16, seed=5))
    out = SpeculativeDecoder(tiny_target, drafter, k).generate(PROMPT, 30)
    assert out.token_ids[0].tolist() == ref


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_exact_with_partially_right_drafter(tiny_target: TargetModel, k: int) -> None:
    ref = plain_greedy(tiny_target, PROMPT, 40)
    drafter = OracleDrafter(PROMPT + ref, corrupt_every=3)
    out = SpeculativeDecoder(tiny_target, drafter, k).generate(PROMPT, 40)
    assert out.token_ids[0].tolist() == ref
    assert 0 < out.stats.acceptance_rate < 1


def test_stop_token_inside_an_accepted_block(tiny_target: TargetModel) -> None:
    ref = plain_greedy(tiny_target, PROMPT, 40)
    stop = ref[5]
    first = ref.index(stop)
    out = SpeculativeDecoder(tiny_target, OracleDrafter(PROMPT + ref), 8).generate(
        PROMPT, 40, stop_token_ids=[stop]
    )
    assert out.token_ids[0].tolist() == ref[: first + 1]
    assert out.stats.rounds == 1 if first < 8 else out.stats.rounds >= 1


@pytest.mark.parametrize("max_new", [0, 1, 5, 13])
def test_max_new_tokens_lands_mid_block(tiny_target: TargetModel, max_new: int) -> None:
    ref = plain_greedy(tiny_target, PROMPT, 40)
    out = SpeculativeDecoder(tiny_target, OracleDrafter(PROMPT + ref), 8).generate(
        PROMPT, max_new, stop_token_ids=[]
    )
    assert out.token_ids[0].tolist() == ref[:max_new]
    assert out.stats.new_tokens == max_new


def test_autoregressive_baseline_is_k_zero(tiny_target: TargetModel) -> None:
    ref = plain_greedy(tiny_target, PROMPT, 20)
    out = SpeculativeDecoder(tiny_target, None).generate(PROMPT, 20)
    assert out.token_ids[0].tolist() == ref
    assert out.stats.rounds == 20 and out.stats.drafted == 0


def test_one_token_prompt(tiny_target: TargetModel) -> None:
    ref = plain_greedy(tiny_target, [3], 10)
    out = SpeculativeDecoder(tiny_target, NGramDrafter(), 4).generate([3], 10)
    assert out.token_ids[0].tolist() == ref


def test_stats_are_consistent(tiny_target: TargetModel) -> None:
    out = SpeculativeDecoder(tiny_target, NGramDrafter(), 4).generate(PROMPT, 40)
    s = out.stats
    assert s.new_tokens == 40 == s.accepted + s.rounds
    assert s.drafted == sum(s.drafted_per_position)
    assert s.accepted == sum(s.accepted_per_position)
    # position i is reached only if i-1 was accepted; position 0 is reached whenever drafted
    assert all(r <= a for r, a in zip(s.reached_per_position[1:], s.accepted_per_position[:-1]))
    assert all(a <= r <= d for a, r, d in zip(
        s.accepted_per_position, s.reached_per_position, s.drafted_per_position))
    assert s.reached_per_position[0] == s.drafted_per_position[0]
    assert s.mean_accepted_length == pytest.approx(40 / s.rounds)
    assert s.total_s >= s.draft_s + s.verify_s
    d = s.as_dict()
    assert d["acceptance_rate"] == s.acceptance_rate and "verify_s_by_k" in d


# ------------------------------------------------------------------------------ bad input
def test_bad_inputs_raise_clear_errors(tiny_target: TargetModel) -> None:
    with pytest.raises(ValueError, match="num_draft_tokens"):
        SpeculativeDecoder(tiny_target, NGramDrafter(), -1)
    dec = SpeculativeDecoder(tiny_target, NGramDrafter(), 2)
    with pytest.raises(ValueError, match="empty"):
        dec.generate([], 5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        dec.generate([1, 2], -1)
    with pytest.raises(ValueError, match="context length"):
        dec.generate([1, 2], tiny_target.max_context)
    with pytest.raises(ValueError, match="token ids"):
        dec.generate([1, 99], 3)
    with pytest.raises(ValueError, match="generate_batch"):
        dec.generate([[1, 2], [3, 4]], 3)
    with pytest.raises(ValueError, match="min_ngram"):
        NGramDrafter(min_ngram=3, max_ngram=2)


def test_drafter_vocabulary_mismatch_is_refused(tiny_target: TargetModel) -> None:
    with pytest.raises(ValueError, match="vocabulary"):
        SpeculativeDecoder(tiny_target, RecomputeDrafter(tiny_random_llama(vocab_size=20)), 2)


# ------------------------------------------------------------------------------ no hidden state
class SimulatedClock:
    """A deterministic stand-in for `time.perf_counter`: each read advances 1 ms (drafting and
    bookkeeping), each target forward 20 ms + 1 ms per position, so timings depend only on what the
    generation did."""

    def __init__(self, target: TargetModel) -> None:
        self.now = 0.0
        self._forward = target.forward

    def read(self) -> float:
        self.now += 0.001
        return self.now

    def forward(self, input_ids: torch.Tensor, *args: object, **kwargs: object) -> object:
        self.now += 0.020 + 0.001 * input_ids.shape[1]
        return self._forward(input_ids, *args, **kwargs)


PROMPTS = [PROMPT, [3, 9, 4, 11, 5, 2, 8], [1, 2, 1, 2, 1, 2, 1, 2, 3], [7, 7, 6, 5, 4, 3, 2, 1, 7, 7]]


def k_sequences(
    monkeypatch: pytest.MonkeyPatch, order: list[int], keep_policy: bool = False
) -> dict[int, list[int]]:
    """The draft length of every round, per prompt, for the prompts generated in `order`."""
    target = tiny_random_target(vocab_size=16, seed=2)
    clock = SimulatedClock(target)
    monkeypatch.setattr(decode_module.time, "perf_counter", clock.read)
    monkeypatch.setattr(target, "forward", clock.forward)
    curve = [1.0 + 0.05 * k for k in range(9)]
    dec = SpeculativeDecoder(target, NGramDrafter(), "auto", verify_curve=curve, keep_policy=keep_policy)
    return {i: dec.generate(PROMPTS[i], 40, stop_token_ids=[]).stats.drafted_per_round for i in order}


def test_k_choices_do_not_depend_on_earlier_prompts(monkeypatch: pytest.MonkeyPatch) -> None:
    forward = k_sequences(monkeypatch, [0, 1, 2, 3])
    backward = k_sequences(monkeypatch, [3, 2, 1, 0])
    assert forward == backward
    assert len({k for seq in forward.values() for k in seq}) > 2  # the policy really chose
    # Negative control: a policy kept across calls (a server's opt-in) does carry over.
    kept = k_sequences(monkeypatch, [0, 1, 2, 3], keep_policy=True)
    kept_backward = k_sequences(monkeypatch, [3, 2, 1, 0], keep_policy=True)
    assert kept != kept_backward


def test_sampling_passed_per_call_leaves_the_decoder_unchanged(tiny_target: TargetModel) -> None:
    dec = SpeculativeDecoder(tiny_target, NGramDrafter(), 3)
    hot = SamplingConfig(temperature=1.0, seed=4)
    sampled = dec.generate(PROMPT, 20, stop_token_ids=[], sampling=hot).token_ids
    assert dec.sampling == SamplingConfig()  # still greedy
    assert dec.generate(PROMPT, 20).token_ids[0].tolist() == plain_greedy(tiny_target, PROMPT, 20)
    again = SpeculativeDecoder(tiny_target, NGramDrafter(), 3, hot).generate(PROMPT, 20, stop_token_ids=[])
    assert torch.equal(sampled, again.token_ids)
