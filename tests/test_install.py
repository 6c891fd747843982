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
    # Bytecode is written (PYTHONDONTWRITEBYTECODE dropped): see the first --help below.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    run([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile"]
    run([*pip, "torch==2.13.0"], tmp_path, env)  # pinned like the Makefile (the CPU wheel on local disk)
    run([*pip, str(src)], tmp_path, env)

    def start(script: str) -> subprocess.Popen:
        return subprocess.Popen([str(venv / "bin" / script), "--help"], cwd=tmp_path, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
        stdout, stderr = proc.communicate(timeout=600)
        return proc.returncode, stdout, stderr

    # The first script alone writes the bytecode of the modules they all import (pip installed none:
    # compiling every file it installs takes longer); then the rest at once, reading that bytecode.
    first, *rest = SCRIPTS
    results = {first: finish(start(first))}
    procs = {script: start(script) for script in rest}
    results.update({script: finish(proc) for script, proc in procs.items()})
    for script, (code, stdout, stderr) in results.items():
        assert code == 0, f"{script} --help failed:\n{stderr[-3000:]}"
        assert "owered by Hydra" in stdout, (script, stdout[:500])  # one CLI convention
