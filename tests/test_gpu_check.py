"""benchmarks/gpu_check.py runs end to end on CPU (tiny target), so the GPU script never rots."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_on_cpu(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
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
