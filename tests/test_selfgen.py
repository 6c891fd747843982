"""The broad self-generated data: duplicates, filters, Magpie prefixes, batched generation and the
sharded, resumable pipeline (with a scripted chat model standing in for the target's `generate`)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from specdraft.models import load_tokenizer, tiny_random_target
from specdraft.suites import chat_prompt_ids
from specdraft.train import selfgen
from specdraft.train.data_quality import (
    diversity_report,
    histogram,
    loop_start,
    prompt_problem,
    repetition,
)
from specdraft.train.dedup import DuplicateIndex, jaccard, shingles
from specdraft.train.magpie import system_messages, user_turn_prefix
from specdraft.train.selfgen import (
    Decoding,
    SelfgenSettings,
    load_selfgen_records,
    run_selfgen,
    screen_answer,
    settings_from,
    Writer,
    shard_conversations,
)

WORDS = [f"w{i}" for i in range(400)]


def test_duplicate_index_finds_exact_and_near_copies_and_never_a_false_one() -> None:
    rng = random.Random(0)
    index = DuplicateIndex(threshold=0.7)
    base = " ".join(rng.choice(WORDS) for _ in range(30))
    assert index.add_if_new("a", base) is None
    assert index.find(base.upper() + " !") == ("exact", "a")  # case and punctuation do not count
    near = base.split()
    near[15] = "changed"  # one word of 30: Jaccard of 3-gram sets 25/31 ~ 0.81
    assert index.find(" ".join(near)) == ("near", "a")
    texts = {f"t{i}": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40))) for i in range(300)}
    for key, text in texts.items():
        dup = index.add_if_new(key, text)
        if dup is not None and dup[0] == "near":  # every reported near copy is one (no false positives)
            assert jaccard(shingles(text), shingles(texts.get(dup[1], base))) >= 0.7
    # brute force: with random texts nothing is similar, so everything was kept
    assert len(index) == 301


def test_duplicate_index_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="threshold"):
        DuplicateIndex(threshold=0)


def test_filters_name_their_reason() -> None:
    assert repetition("a b c a b c a b c a b c") > 0.5 and repetition("one two three four five") == 0
    assert prompt_problem("How do I bake bread at home?", 9, True) is None
    assert prompt_problem("How do I bake", 4, False) == "unfinished"
    assert prompt_problem("Hi", 1, True) == "too_short"
    assert prompt_problem("I'm sorry, but I cannot help with that request.", 12, True) == "refusal"
    assert prompt_problem("Sure! Here is a plan for your trip to Spain.", 12, True) == "not_a_request"
    assert prompt_problem("tell me more " * 10, 30, True) == "repetitive"
    assert histogram([0, 7, 8, 5000]) == {"0-7": 2, "8-15": 1, ">=4096": 1}


def test_loop_start_matches_a_brute_force_search() -> None:
    rng = random.Random(0)
    for _ in range(300):
        span = rng.randint(1, 6)
        ids = [rng.randrange(4) for _ in range(rng.randint(0, 40))]
        brute = next((i for i in range(len(ids) - span + 1)
                      if any(ids[j : j + span] == ids[i : i + span] for j in range(i))), None)
        assert loop_start(ids, span) == brute
    head, unit = list(range(100, 140)), list(range(7, 12))
    assert loop_start(head + unit * 20) == len(head) + len(unit)  # the first copy of the loop stays


@dataclass
class WordTokens:
    """A tokenizer whose token i is the word "w{i}" (enough for the answer filters)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(f"w{i}" for i in ids)


def test_a_looping_answer_keeps_its_text_up_to_the_loop() -> None:
    tok, head = WordTokens(), list(range(100, 140))
    looping = head + list(range(7, 12)) * 40
    ids, text, done, truncated, problem = screen_answer(tok, looping, True, min_loop_prefix=32)
    assert (ids, done, truncated, problem) == (head + list(range(7, 12)), False, True, None)
    assert text == tok.decode(ids)
    short_head = list(range(100, 110)) + list(range(7, 12)) * 40  # too little before the loop: dropped
    assert screen_answer(tok, short_head, True, min_loop_prefix=32)[3:] == (False, "repetitive")
    plain = list(range(200, 260))
    assert screen_answer(tok, plain, True, min_loop_prefix=32) == (plain, tok.decode(plain), True, False, None)


@pytest.mark.slow  # loads the default target's tokenizer (GGUF), ~10 s
def test_magpie_prefix_ends_where_the_user_text_begins() -> None:
    tok = load_tokenizer("smollm2-135m")
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there."},
               {"role": "assistant", "content": "Hello!"}]
    prefix = user_turn_prefix(tok, history)
    full = chat_prompt_ids(tok, [*history, {"role": "user", "content": "What time is it?"}])
    assert full[: len(prefix)] == prefix  # the user's text is what the target samples after the prefix
    assert tok.decode(prefix).endswith("<|im_start|>user\n")
    assert tok.decode(user_turn_prefix(tok)).count("<|im_start|>") == 2  # the template's default system turn


def test_batched_generate_keeps_the_order_and_splits_by_the_token_budget() -> None:
    target = tiny_random_target(vocab_size=64, seed=0, hidden_size=16, num_layers=1)
    prompts = [[1, 2, 3, 4, 5], [4, 5], [6, 7, 8]]
    together = selfgen.batched(target, batch_size=8, batch_tokens=1000)(prompts, Decoding(6), 0)
    one_by_one = selfgen.batched(target, batch_size=1, batch_tokens=1000)(prompts, Decoding(6), 0)
    tight = selfgen.batched(target, batch_size=8, batch_tokens=20)(prompts, Decoding(6), 0)  # 2 rows of <= 10
    assert together == one_by_one == tight and all(len(ids) == 6 and not done for ids, done in together)


# ------------------------------------------------------------------------------ the pipeline
ASK = "<|im_start|>user\n"


@dataclass
class ScriptedChat:
    """Stands in for the target: a user turn (after the template's user prefix) is one of a few
    requests chosen with the call's seed (so exact and near duplicates occur, as with a real model),
    an answer repeats the request's topic; every row ends with the stop token."""

    tokenizer: Any
    stop: int
    topics: int = 30

    def generate(self, prompts: Any, decoding: Decoding, seed: int) -> list[tuple[list[int], bool]]:
        gen = torch.Generator().manual_seed(seed)
        rows = []
        for row in prompts:
            text = self.tokenizer.decode(list(row))
            if text.endswith(ASK):
                n = int(torch.randint(self.topics, (), generator=gen))
                out = f"Could you explain topic {n} to me with an example about item {n} please?"
                if n % 3 == 0:  # a near copy of another topic's request, one word changed
                    out = f"Could you explain topic {n + 1} to me with an example about item {n + 1} please, friend?"
            else:
                last = text.rsplit("topic ", 1)[-1].split()[0] if "topic " in text else "x"
                extra = f" variant {int(torch.randint(1000, (), generator=gen))}" if decoding.temperature > 0 else ""
                out = f"Topic {last} is explained here in a few plain words, with one example{extra}."
            ids = self.tokenizer.encode(out, add_special_tokens=False)[: decoding.max_new_tokens - 1] + [self.stop]
            rows.append((ids, True))
        return rows


@pytest.fixture(scope="module")
def scripted() -> Writer:
    tok = load_tokenizer("smollm2-135m")
    stop = int(tok.convert_tokens_to_ids("<|im_end|>"))
    return Writer(tok, [stop], ScriptedChat(tok, stop).generate)


SMALL = SelfgenSettings(token_budget=400, min_prompts=10, shard_size=8, sources={"magpie": 1.0}, turn_weights=(0.4, 0.6),
                        sample_fraction=0.5, eval_fraction=0.5, max_answer_tokens=32)


@pytest.mark.slow  # loads the default target's tokenizer (GGUF), ~10 s
def test_selfgen_writes_deduplicated_conversations_split_by_conversation(scripted: Writer, tmp_path: Path) -> None:
    out = run_selfgen(writer=scripted, out_dir=tmp_path / "a", settings=SMALL, progress=False)
    records = load_selfgen_records("train", out) + load_selfgen_records("eval", out)
    report = json.loads((out / "report.json").read_text())
    firsts = [r for r in records if r["turn"] == 1 and r["mode"] == "greedy"]
    # prompts come from the template alone: the user's text follows the template's user prefix
    tok = scripted.tokenizer
    for r in firsts:
        prefix = user_turn_prefix(tok, system_messages(r["system"]))  # a varied system prompt, then the user
        assert r["source"] == "magpie" and r["prompt_ids"][: len(prefix)] == prefix
        assert r["prompt_ids"] == chat_prompt_ids(tok, r["messages"])
    # the scripted model repeats itself; no two kept first turns are duplicates of each other
    index = DuplicateIndex()
    assert all(index.add_if_new(r["id"], r["prompt"]) is None for r in firsts)
    assert report["rejected"].get("user_turn_1:duplicate_exact", 0) > 0
    assert report["rejected"].get("user_turn_1:duplicate_near", 0) > 0
    # later turns and samples continue the greedy answer of their own conversation, in its split
    by_conv: dict[str, set[str]] = {}
    for r in records:
        by_conv.setdefault(r["conversation"], set()).add(r["split"])
        if r["turn"] > 1:
            assert r["messages"][-2]["role"] == "assistant" and r["messages"][-3]["role"] == "user"
    assert all(len(s) == 1 for s in by_conv.values()) and {r["split"] for r in records} == {"train", "eval"}
    assert {r["mode"] for r in records} == {"greedy", "sample"} and max(r["turn"] for r in records) == 2
    assert len({r["system"] for r in firsts}) > 1
    assert report["answer_tokens"] == sum(len(r["completion_ids"]) for r in records) >= SMALL.token_budget
    assert {r["writer_dtype"] for r in records} == {scripted.dtype}
    assert len({(r["conversation"], r["turn"]) for r in records}) >= SMALL.min_prompts


@pytest.mark.slow  # loads the default target's tokenizer (GGUF), ~10 s
def test_a_resumed_selfgen_appends_what_one_run_writes(scripted: Writer, tmp_path: Path) -> None:
    whole = run_selfgen(writer=scripted, out_dir=tmp_path / "whole", settings=SMALL, progress=False)
    first = SelfgenSettings(**{**SMALL.__dict__, "token_budget": 1, "min_prompts": 1})  # stops after one shard
    part = run_selfgen(writer=scripted, out_dir=tmp_path / "part", settings=first, progress=False)
    assert len(selfgen.shard_paths(part)) == 1
    with pytest.raises(FileExistsError, match="overwrite=true"):
        run_selfgen(writer=scripted, out_dir=part, settings=SMALL, progress=False)
    run_selfgen(writer=scripted, out_dir=part, settings=SMALL, overwrite=True, progress=False)
    read = [[json.loads(x) for x in selfgen.read_lines(p)] for p in selfgen.shard_paths(part)]
    assert read == [[json.loads(x) for x in selfgen.read_lines(p)] for p in selfgen.shard_paths(whole)]
    assert [p.read_bytes() for p in selfgen.shard_paths(part)] == [p.read_bytes() for p in selfgen.shard_paths(whole)]
    ids = [r["id"] for shard in read for r in shard]
    assert len(ids) == len(set(ids))  # nothing repeated
    assert json.loads((part / "report.json").read_text()) == json.loads((whole / "report.json").read_text())


def test_fixed_sources_are_sliced_per_shard_and_fall_back_to_magpie() -> None:
    s = SelfgenSettings(shard_size=10, sources={"magpie": 0.5, "corpus": 0.5})
    pools = {"corpus": [(f"c{i}", "summarise", f"text {i}") for i in range(7)]}
    shards = [shard_conversations(i, s, pools) for i in range(3)]
    corpus = [c.id for sh in shards for c in sh if c.source == "corpus"]
    assert sorted(corpus, key=lambda k: int(k[1:])) == [f"c{i}" for i in range(7)]  # each item once
    assert {c.id for c in shards[0] if c.source == "corpus"} == {f"c{i}" for i in range(5)}  # in pool order
    assert all(len(sh) == 10 for sh in shards)
    assert [c.id for c in shard_conversations(1, s, pools)] == [c.id for c in shards[1]]  # no state carried


def test_selfgen_yaml_repeats_the_settings_defaults() -> None:
    cfg = OmegaConf.load(Path(__file__).parents[1] / "conf" / "selfgen.yaml")
    for key in ("defaults", "out_dir"):  # the target group; a Hydra run-directory interpolation
        del cfg[key]
    defaults = SelfgenSettings()
    assert settings_from(cfg) == SelfgenSettings(**{**defaults.__dict__, "sources": dict(cfg.sources),
                                                     "turn_weights": list(cfg.turn_weights)})
    assert dict(cfg.sources) == dict(defaults.sources) and list(cfg.turn_weights) == list(defaults.turn_weights)
    cfg.bogus = 1
    with pytest.raises(ValueError, match="bogus"):
        settings_from(cfg)
    with pytest.raises(ValueError, match="sources"):
        SelfgenSettings(sources={"web": 1.0})


def test_diversity_report_counts_prompts_and_rejections() -> None:
    recs = [{"conversation": "c1", "turn": 1, "mode": "greedy", "kind": "magpie", "source": "magpie",
             "split": "train", "prompt": "How do I start running?", "prompt_ids": [1] * 20,
             "completion_ids": [2] * 40},
            {"conversation": "c1", "turn": 1, "mode": "sample", "kind": "magpie", "source": "magpie",
             "split": "train", "prompt": "How do I start running?", "prompt_ids": [1] * 20,
             "completion_ids": [2] * 30, "writer_dtype": "bfloat16"}]
    rep = diversity_report(recs, {"user_turn_1:unfinished": 3})
    # the writer's dtype is reported by answer token; records from before the field were float32 writes
    assert rep["answer_tokens_by_writer_dtype"] == {"float32": 40, "bfloat16": 30}
    assert rep["distinct_prompts"] == 1 and rep["answers"] == 2 and rep["answer_tokens"] == 70
    assert rep["answers_by_mode"] == {"greedy": 1, "sample": 1} and rep["rejected"] == {"user_turn_1:unfinished": 3}
