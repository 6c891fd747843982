"""benchmarks/gpu_check.py runs end to end on CPU (tiny target), so the GPU script never rots."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_on_cpu(tmp_path: Path) -> None:
    gpu_check = load_script(ROOT / "benchmarks" / "gpu_check.py")
    rc = gpu_check.main([
        "--device", "cpu", "--target", "tiny_random", "--drafters", "ngram", "quantized",
        "--prompts", "1", "--max-new-tokens", "8", "--max-k", "3", "--context", "32", "--reps", "1",
        "--out", str(tmp_path),
    ])
    report = json.loads((tmp_path / "report.json").read_text())
    assert rc == 0 and report["device"] == "cpu" and report["fast_stack"] is True
    assert report["cuda_graphs"] is False and set(report["verify_cost_s"]) == {"fast", "plain"} and len(report["verify_cost_s"]["fast"]) == 3
    for name in ("ngram", "quantized"):
        assert report["drafters"][name]["greedy_exact"] is True
        assert report["drafters"][name]["speedup_median"] > 0
