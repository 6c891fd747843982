"""A plain `pip install .` (no extras) into a fresh virtualenv gives console scripts that all run
`--help`: every runtime import is a runtime dependency (pyproject `dependencies`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
# What a source checkout holds besides the package: never copied into the build.
NOT_SOURCE = (".venv", ".git", "build", "*.egg-info", "outputs", "multirun", "__pycache__", ".pytest_cache")


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> None:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, f"{' '.join(cmd)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"


@pytest.mark.slow
def test_plain_install_gives_console_scripts_that_run(tmp_path: Path) -> None:
    assert SCRIPTS, "pyproject.toml lists no [project.scripts]"
    src = tmp_path / "src"  # build from a copy: an in-tree build would write build/ into the checkout
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    run([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile"]
    run([*pip, "torch==2.13.0"], tmp_path, env)  # pinned like the Makefile (the CPU wheel on local disk)
    run([*pip, str(src)], tmp_path, env)
    helps = {s: subprocess.Popen([str(venv / "bin" / s), "--help"], cwd=tmp_path, env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE) for s in SCRIPTS}
    for script, proc in helps.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{script} --help failed:\n{stderr[-3000:]}"
        assert "owered by Hydra" in stdout, (script, stdout[:500])  # one CLI convention
