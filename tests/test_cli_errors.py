"""Every console script answers a user's mistake with one `error:` line on stderr and exit status 2
(no traceback), and prompts that Hydra's grammar would break reach the model as text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
TINY = ["target=tiny_random", "hydra.job.chdir=false"]


def run(args: list[str], tmp_path: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / args[0]), *args[1:], f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                          env=ENV, capture_output=True, text=True, timeout=300, input=stdin)


def assert_one_error_line(out: subprocess.CompletedProcess, *needles: str) -> None:
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    for needle in needles:
        assert needle in out.stderr, out.stderr[-2000:]


def nonempty_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "taken"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


# One bad value per console script, each caught before any model loads ({taken}: a non-empty folder).
CASES = {
    "specdraft-generate": (["sampling.temperature=abc"], "sampling.temperature must be a number"),
    "specdraft-bench": (["bench.repetitions=0"], "bench.repetitions=0 must be an integer >= 1"),
    "specdraft-check": (["num_samples=0"], "num_samples"),
    "specdraft-train-draft": (["out_dir={taken}"], "overwrite=true"),
    "specdraft-train-medusa": (["out_dir={taken}"], "overwrite=true"),
    "specdraft-train-early-exit": (["out_dir={taken}"], "overwrite=true"),
    "specdraft-train-eagle": (["out_dir={taken}"], "overwrite=true"),
    "specdraft-selfgen": (["out_dir={taken}"], "overwrite=true"),
    "specdraft-export": (["out_dir={taken}"], "overwrite=true"),
    "specdraft-suffix-corpus": (["out_dir={taken}"], "overwrite=true"),
}


def test_every_console_script_is_covered() -> None:
    import tomllib

    scripts = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == set(CASES)


@pytest.mark.parametrize("script", sorted(CASES))
def test_a_bad_value_is_one_error_line_and_exit_2(script: str, tmp_path: Path) -> None:
    args, needle = CASES[script]
    taken = nonempty_dir(tmp_path)
    out = run([script, *TINY, *(a.format(taken=taken) for a in args)], tmp_path)
    assert_one_error_line(out, needle)


def test_a_prompt_hydra_cannot_parse_gets_the_quoting_hint(tmp_path: Path) -> None:
    out = run(["specdraft-generate", *TINY, "prompt=Hello, world! What is f(x)=x+1?"], tmp_path)
    assert_one_error_line(out, "prompt_file=PATH", "'prompt=\"Hello, world!\"'")


def test_prompts_from_stdin_and_numbers_are_text(tmp_path: Path) -> None:
    text = "Hello, world! What is f(x)=x+1?"
    out = run(["specdraft-generate", *TINY, "prompt_file=-", "max_new_tokens=4", "sampling=sample",
               "sampling.temperature=1e-40", "output_json=gen.json"], tmp_path, stdin=text)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "tok/s" in out.stderr and "tok/s" not in out.stdout  # stdout holds the generated text only
    numeric = run(["specdraft-generate", *TINY, "prompt=123", "max_new_tokens=2"], tmp_path)
    assert numeric.returncode == 0, numeric.stderr[-2000:]
    missing = run(["specdraft-generate", *TINY, "prompt_file=nope.txt"], tmp_path)
    assert_one_error_line(missing, "prompt_file=nope.txt: no such file")
