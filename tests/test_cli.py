"""Command-line entry points end to end on the tiny target (subprocesses), the audit, the
non-editable install, and a 2-job sweep through Hydra's submitit launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from specdraft.check import Verdict, run_check

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY = ["target=tiny_random", "max_new_tokens=12", "hydra.job.chdir=false"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def test_generate_cli(tmp_path: Path) -> None:
    out_json = tmp_path / "gen.json"
    res = run([str(BIN / "specdraft-generate"), *TINY, "drafter=ngram", "drafter.max_ngram=4",
               "num_draft_tokens=3", "sampling=sample", "sampling.temperature=0.7",
               f"output_json={out_json}", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    rec = json.loads(out_json.read_text())
    assert len(rec["token_ids"]) == 12 and rec["stats"]["new_tokens"] == 12
    assert "tok/s" in res.stderr and "tok/s" not in res.stdout  # stdout is the generated text only


def test_bench_cli(tmp_path: Path) -> None:
    run_dir = tmp_path / "bench"
    res = run([str(BIN / "specdraft-bench"), *TINY, "suite=quick", "bench.limit=1",
               "bench.categories=[code_edit,qa]", "bench.repetitions=1", "bench.warmup=0",
               "bench.peers=[hf_generate,hf_prompt_lookup]", "bench.hf_prompt_lookup_num_tokens=[3]",
               "bench.plain_stack=true", "bench.progress=false", f"hydra.run.dir={run_dir}"], tmp_path)
    result = json.loads((run_dir / "results.json").read_text())
    methods = {r["method"] for r in result["records"]}
    assert methods == {"autoregressive", "ngram", "autoregressive[plain]", "ngram[plain]", "hf_generate",
                       "hf_prompt_lookup[3]"}
    assert {r["prompt"] for r in result["records"]} == {"code_edit-01", "qa-01"}
    assert not result["greedy_mismatches"]
    ngram = next(r for r in result["records"] if r["method"] == "ngram")
    for key in ("speedup", "acceptance_per_position", "verify_s_by_k", "verify_curve", "c", "efficiency"):
        assert key in ngram
    assert ngram["verify_curve"][0] == 1.0 and ngram["hf_counterpart"] == "hf_prompt_lookup"
    assert {(r["method"], r["peer"]) for r in result["peer_ratios"]} == {
        ("ngram", "hf_prompt_lookup[3]"), ("ngram[plain]", "hf_prompt_lookup[3]")}
    for png in ("acceptance_per_position", "speedup_per_category", "measured_vs_predicted"):
        assert (run_dir / f"{png}.png").stat().st_size > 1000
    assert "## overall" in res.stdout and (run_dir / "results.md").is_file()


def test_sampled_runs_report_no_greedy_verdict() -> None:
    """At temperature > 0 outputs differ from AR by design: the table says n/a, not NO."""
    from specdraft.bench import aggregate, render_markdown

    records = [{"category": "qa", "method": m, "speedup": 1.0, "tokens_per_s": 9.0, "greedy_match": g}
               for m, g in (("autoregressive", None), ("ngram", None), ("medusa", False))]
    summary = aggregate(records)
    assert summary["overall"]["ngram"]["greedy_match"] is None
    config = {"target": {"name_or_path": "t"}, "suite": {"name": "quick"}, "num_draft_tokens": 3,
              "max_new_tokens": 8}
    md = render_markdown({"config": config, "summary": summary, "peer_ratios": [], "greedy_mismatches": []})
    assert "| ngram |" in md and "n/a (sampled) |" in md and md.count("| NO |") == 2  # overall + qa


def test_sweep_through_submitit_local(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    run([str(BIN / "specdraft-bench"), "-m", *TINY, "drafter=none,ngram", "suite=quick",
         "bench.limit=1", "bench.categories=[qa]", "bench.repetitions=1", "bench.warmup=0",
         "bench.plots=false", "bench.progress=false", "hydra/launcher=submitit_local",
         "hydra.launcher.timeout_min=10", f"hydra.sweep.dir={sweep}"], tmp_path)
    results = sorted(sweep.glob("*/results.json"))
    assert len(results) == 2
    methods = [{r["method"] for r in json.loads(p.read_text())["records"]} for p in results]
    assert {"autoregressive"} in methods and {"autoregressive", "ngram"} in methods


def _check_cfg(sampler: str):  # noqa: ANN202
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        return compose("check", overrides=[
            "target=tiny_random", "target.vocab_size=16", "target.tokenizer=null",
            "drafter=ngram", "sampling=sample", "prompt_ids=[1,2,3,1,2]",
            "progress=false", f"sampler.path={sampler}",
        ])


def test_check_fails_the_packaged_broken_verifier_at_the_default_n() -> None:
    """The negative control as a user runs it from an installed package (the real verifier's PASS
    and the other broken verifiers: tests/test_check.py)."""
    assert run_check(_check_cfg("specdraft.check.broken.always_accept")) is Verdict.FAIL
    GlobalHydra.instance().clear()


def test_check_refuses_a_k_it_cannot_audit_before_loading_a_model() -> None:
    cfg = _check_cfg("specdraft.verify.rejection_sample")
    cfg.num_draft_tokens = "auto"
    cfg.target._target_ = "no.such.target"  # never reached
    with pytest.raises(ValueError, match="fixed num_draft_tokens >= 1"):
        run_check(cfg)
    GlobalHydra.instance().clear()


@pytest.mark.slow
def test_configs_ship_in_a_non_editable_install(tmp_path: Path) -> None:
    target = tmp_path / "site"
    run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(ROOT)], tmp_path)
    code = (
        "import conf, specdraft; assert 'site' in conf.__file__, conf.__file__\n"
        "from hydra import compose, initialize_config_module\n"
        "with initialize_config_module(config_module='conf', version_base='1.3'):\n"
        "    cfg = compose('bench', overrides=['drafter=ngram'])\n"
        "print(cfg.drafter._target_)\n"
        "from specdraft.suites import load_suite; print(len(load_suite('builtin')))\n"
    )
    env = dict(ENV, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "drafters.ngram.NGramDrafter" in out.stdout
