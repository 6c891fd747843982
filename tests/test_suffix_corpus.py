"""The suffix drafter's static corpus: the suffix array against brute force on random token arrays,
the budget, the file round trip and its target check, and the drafter reading a corpus (greedy
exactness, losslessness at temperature 1 with a negative control, a corpus changes nothing but
speed)."""

from __future__ import annotations

import random

import pytest
import torch

from drafters import suffix_corpus
from drafters.suffix import SuffixDrafter
from drafters.suffix_corpus import CorpusIndex, find_corpus, load_corpus, save_corpus, suffix_order
from specdraft.check.broken import always_accept
from specdraft.decode import SpeculativeDecoder
from specdraft.formats.target_info import RECORD_KEY, target_info
from specdraft.models import tiny_random_target
from specdraft.sampling import SamplingConfig
from specdraft.target import TargetModel
from tests.helpers import exact_two_token_distribution, plain_greedy, pooled_chisquare, sample_two_tokens
from tests.test_suffix import brute_match, flat_costs, random_seqs


def joined_to_local(seqs: list[list[int]], end: int) -> tuple[int, int]:
    """(sequence id, position) of position `end` of the joined corpus (a separator after each sequence)."""
    start = 0
    for sid, seq in enumerate(seqs):
        if end < start + len(seq):
            return sid, end - start
        start += len(seq) + 1
    raise AssertionError(f"position {end} is past the corpus")


@pytest.mark.parametrize("seed", range(3))
def test_suffix_order_sorts_every_suffix(seed: int) -> None:
    import numpy as np

    rng = random.Random(seed)
    symbols = [rng.randrange(1 + seed) for _ in range(200)]
    order = suffix_order(np.array(symbols), depth=8).tolist()
    keys = [symbols[p : p + 8] for p in order]
    assert keys == sorted(keys) and sorted(order) == list(range(200))


@pytest.mark.parametrize("vectorised", [512, 0], ids=["vectorised", "bisected"])
@pytest.mark.parametrize("seed", range(6))
def test_match_equals_brute_force(seed: int, vectorised: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways of narrowing a sorted range (one numpy pass; a scalar bisection for wide ranges)."""
    monkeypatch.setattr(suffix_corpus, "NARROW_VECTORISED", vectorised)
    rng = random.Random(seed)
    vocab, max_match = 2 + seed % 3, 3 + 2 * seed
    seqs = [s for s in random_seqs(rng, 5, vocab) if s]
    index = CorpusIndex(seqs)
    for _ in range(60):
        context = [rng.randrange(vocab) for _ in range(rng.randrange(1, 24))]
        got = index.match(context, max_match, max_occurrences=10_000)
        want = brute_match(seqs, context, max_match)
        if want is None:
            assert got is None, context
            continue
        assert got is not None and got.length == want.length, context
        assert sorted(joined_to_local(seqs, e) for _, e in got.occurrences) == sorted(want.occurrences)
        for window, (sid, end) in zip(index.continuations(got, 3),
                                      (joined_to_local(seqs, e) for _, e in got.occurrences)):
            assert window == seqs[sid][end + 1 : end + 4]


def test_occurrences_are_a_spread_sample() -> None:
    seqs = [[1, 2, i] for i in range(3, 103)]  # [1, 2] occurs 100 times, each followed by another token
    got = CorpusIndex(seqs).match([1, 2], 8, max_occurrences=10)
    assert got is not None and got.length == 2 and 5 <= len(got.occurrences) <= 10
    followers = {w[0] for w in CorpusIndex(seqs).continuations(got, 1)}
    assert len(followers) == len(got.occurrences)  # distinct occurrences, not one repeated
    assert max(followers) - min(followers) > 50  # spread over the range, not its first few


def test_budget_keeps_the_newest_sequences() -> None:
    seqs = [[i] * 10 for i in range(1, 11)]
    index = CorpusIndex(seqs, max_tokens=35)
    assert index.num_tokens == 30 and index.sequences() == seqs[-3:]
    assert index.memory_bytes() > 0
    assert index.match([1, 1], 4, 4) is None and index.match([10, 10], 4, 4) is not None
    with pytest.raises(ValueError, match="max_tokens"):
        CorpusIndex(seqs, max_tokens=0)


def corpus_dir(tmp_path, target: TargetModel, seqs: list[list[int]]):  # noqa: ANN001, ANN201
    return save_corpus(seqs, tmp_path / "corpus", {RECORD_KEY: target_info(target)})


def test_file_round_trip_and_target_check(tmp_path) -> None:  # noqa: ANN001
    target = tiny_random_target(vocab_size=16, seed=2)
    seqs = random_seqs(random.Random(3), 8, 16, lo=1)
    path = corpus_dir(tmp_path, target, seqs)
    loaded = load_corpus(path)
    assert loaded.sequences() == seqs
    assert load_corpus(path, max_tokens=len(seqs[-1])).sequences() == seqs[-1:]
    assert find_corpus(str(path), target) == path
    assert find_corpus(None, target) is None
    assert find_corpus("auto", target) is None  # no shipped corpus for a 16-token vocabulary
    with pytest.raises(ValueError, match="was written by a target with vocab 16.*this target has vocab 32"):
        find_corpus(str(path), tiny_random_target(vocab_size=32, seed=2))
    with pytest.raises(ValueError, match="specdraft-suffix-corpus"):
        SuffixDrafter(corpus=str(path)).bind(tiny_random_target(vocab_size=32, seed=2))
    (path / "corpus.json").write_text("{}")
    with pytest.raises(ValueError, match="not a specdraft-suffix-corpus record"):
        load_corpus(path)
    with pytest.raises(ValueError, match="neither a directory nor a shipped artifact"):
        find_corpus(str(tmp_path / "missing"), target)


def teacher_corpus(target: TargetModel, prompts: list[list[int]], n: int = 40) -> list[list[int]]:
    """Sampled continuations of the prompts (what the target wrote before), as corpus sequences."""
    dec = SpeculativeDecoder(target, None, num_draft_tokens=0, sampling=SamplingConfig(temperature=1.0))
    out = []
    for i in range(n):
        prompt = prompts[i % len(prompts)]
        new = dec.generate(prompt, 6, stop_token_ids=[], sampling=SamplingConfig(temperature=1.0, seed=i))
        out.append(prompt[-2:] + new.token_ids[0].tolist())
    return out


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_with_a_corpus_equals_plain_greedy(tmp_path, seed: int, tree: bool) -> None:  # noqa: ANN001
    target = flat_costs(tiny_random_target(vocab_size=16, seed=40 + seed))
    prompts = [[1, 5, 3, 7, 1, 5], [2, 4, 6, 2, 4], [3, 3, 3, 3]]
    path = corpus_dir(tmp_path, target, teacher_corpus(target, prompts))
    runs = {}
    for name, corpus in (("corpus", str(path)), ("none", None)):
        drafter = SuffixDrafter(tree=tree, anchor=2, min_prob=0.0, store_tokens=0, corpus=corpus, corpus_min_match=1)
        dec = SpeculativeDecoder(target, drafter, num_draft_tokens=8, verify_curve=[1.0] * 9)
        runs[name] = [dec.generate(p, 30, stop_token_ids=[]) for p in prompts]
        assert (drafter.store_stats()["corpus_tokens"] > 0) == (corpus is not None)
    for p, with_corpus, without in zip(prompts, runs["corpus"], runs["none"]):
        assert with_corpus.token_ids[0].tolist() == without.token_ids[0].tolist() == plain_greedy(target, p, 30)
    assert sum(r.stats.drafted for r in runs["corpus"]) > sum(r.stats.drafted for r in runs["none"])
    assert sum(r.stats.accepted for r in runs["corpus"]) > 0


def corpus_pvalue(target: TargetModel, tmp_path, sampler=None, n: int = 1200, tree: bool = False) -> float:  # noqa: ANN001
    sampling = SamplingConfig(temperature=1.0)
    flat_costs(target)
    prompt = [2, 9]  # no repeat inside and no store: every draft comes from the corpus
    path = corpus_dir(tmp_path, target, teacher_corpus(target, [prompt], n=60))
    drafter = SuffixDrafter(tree=tree, anchor=2, min_prob=0.0, store_tokens=0, corpus=str(path), corpus_min_match=1)
    kwargs = {} if sampler is None else {"sampler": sampler}
    dec = SpeculativeDecoder(target, drafter, num_draft_tokens=6, sampling=sampling, verify_curve=[1.0] * 9, **kwargs)
    counts = sample_two_tokens(dec, prompt, n=n, vocab=target.vocab_size)
    return pooled_chisquare(counts, exact_two_token_distribution(target, prompt, sampling))


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_corpus_drafts_are_lossless_at_temperature_one(tiny_target: TargetModel, tmp_path, tree: bool) -> None:  # noqa: ANN001
    assert corpus_pvalue(tiny_target, tmp_path, tree=tree) > 1e-4


def test_the_corpus_test_catches_a_verifier_that_accepts_everything(tiny_target: TargetModel, tmp_path) -> None:  # noqa: ANN001
    assert corpus_pvalue(tiny_target, tmp_path, sampler=always_accept) < 1e-6


def test_prior_discounts_a_rare_match() -> None:
    from drafters.suffix_index import best_chain

    assert [c.prob for c in best_chain([[4, 5]], 0.0)] == [1.0, 1.0]
    assert [c.prob for c in best_chain([[4, 5]], 0.0, prior=2.0)] == pytest.approx([1 / 3, 1 / 3])
    assert best_chain([[4, 5]], 0.5, prior=2.0) == []  # 1/3 is below min_prob


def test_the_command_writes_a_corpus_of_answers_only(tmp_path, hydra_conf) -> None:  # noqa: ANN001
    import json

    from hydra import compose

    from specdraft.train.suffix_corpus import build

    selfgen = tmp_path / "selfgen.jsonl"
    records = [{"split": "train", "prompt_ids": [1, 2], "completion_ids": [3, 4, 5]},
               {"split": "eval", "prompt_ids": [1, 2], "completion_ids": [6, 7]},
               {"split": "train", "prompt_ids": [9], "completion_ids": [8, 8]}]
    selfgen.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "corpus"
    cfg = compose("suffix_corpus", overrides=["target=tiny_random", f"selfgen=[{selfgen}]", f"out_dir={out}"])
    build(cfg)
    assert load_corpus(out).sequences() == [[3, 4, 5], [8, 8]]  # the train answers, no prompt, no eval
    record = json.loads((out / "corpus.json").read_text())
    assert record["tokens"] == 5 and record[RECORD_KEY]["vocab_size"] == 49152 and record["sources"]["split"] == "train"
    with pytest.raises(FileExistsError, match="not empty"):
        build(cfg)
    with pytest.raises(ValueError, match="no sources"):
        build(compose("suffix_corpus", overrides=["target=tiny_random", "selfgen=[]", f"out_dir={tmp_path / 'x'}"]))


@pytest.mark.slow
def test_the_shipped_corpus_is_found_for_the_default_target(default_target: TargetModel) -> None:
    path = find_corpus("auto", default_target)
    assert path is not None and path.name == "suffix_corpus"
    index = load_corpus(path)
    assert index.num_tokens > 1_000_000 and index.memory_bytes() < 16 * index.num_tokens
    tok = default_target.tokenizer
    ids = tok("I'd be happy to help", add_special_tokens=False)["input_ids"]
    assert index.match(ids, 32, 32) is not None  # the target's common phrasing is in it


def test_batch_with_a_corpus_equals_one_by_one(tmp_path) -> None:  # noqa: ANN001
    """Every row of a batch reads the shared corpus beside its own context."""
    from tests.test_ngram import BATCH_PROMPTS, check_batches, flat_verify_costs

    target = flat_verify_costs(tiny_random_target(vocab_size=16, seed=9))
    path = corpus_dir(tmp_path, target, teacher_corpus(target, BATCH_PROMPTS))
    drafter = SuffixDrafter(anchor=2, min_prob=0.0, store_tokens=0, corpus=str(path), corpus_min_match=1)
    check_batches(SpeculativeDecoder(target, drafter, num_draft_tokens=4))
    assert drafter.corpus is not None and drafter.store_stats()["corpus_tokens"] > 0
