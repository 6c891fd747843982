"""llama.cpp as a bench peer: where `make llamacpp` put it, one prompt through its tools, and a pure
parser of what they print.

`make llamacpp` builds `llama-completion` (plain decoding) and `llama-lookup` (its n-gram "lookup"
decoding) into `.venv/llamacpp/bin/` and writes the default target as an F32 GGUF (the weights we
run) next to a link to its native Q4_1 file, in `.venv/llamacpp/models/`; SPECDRAFT_LLAMACPP_DIR
points elsewhere. Nothing here is needed unless a bench asks for a llama.cpp peer.

Same prompt tokens as ours: the bench's token ids (chat template applied) are detokenized with the
target's tokenizer and passed as text, which llama.cpp tokenizes with special tokens parsed, no BOS
of its own (the GGUF says add_bos_token=false), no conversation mode and no escape processing; the
prompt token count it reports is checked against ours. Time: llama.cpp's own timers, so process
start and model load never count.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ENV_DIR = "SPECDRAFT_LLAMACPP_DIR"
DEFAULT_DIR = Path(__file__).resolve().parents[1] / ".venv" / "llamacpp"
PLAIN_TOOL = "llama-completion"
LOOKUP_TOOL = "llama-lookup"
MODELS = {"f32": "smollm2-135m-f32.gguf", "q4_1": "smollm2-135m-q4_1.gguf"}
# llama.cpp's default sampler chain differs from ours; sampled runs use ours: temperature, top-k, top-p.
SAMPLER_ORDER = "temperature;top_k;top_p"
NOT_BUILT = "llama.cpp is not built: run `make llamacpp`"


def install_dir() -> Path:
    """The folder `make llamacpp` fills ($SPECDRAFT_LLAMACPP_DIR, else .venv/llamacpp of this checkout)."""
    env = os.environ.get(ENV_DIR)
    return Path(env) if env else DEFAULT_DIR


def model_path(model: str, root: Path | None = None) -> Path:
    """The GGUF file of a model key of MODELS ("f32" or "q4_1")."""
    if model not in MODELS:
        raise ValueError(f"unknown llama.cpp model {model!r}; choose from {', '.join(MODELS)}.")
    return (root or install_dir()) / "models" / MODELS[model]


def available(root: Path | None = None) -> str | None:
    """None when the tools and models are in place, else why not (a sentence ending in the fix)."""
    root = root or install_dir()
    needed = [root / "bin" / PLAIN_TOOL, root / "bin" / LOOKUP_TOOL] + [model_path(m, root) for m in MODELS]
    missing = [p for p in needed if not p.is_file()]
    if missing:
        return f"{NOT_BUILT} ({missing[0]} is missing)"
    if not os.access(needed[0], os.X_OK):
        return f"{needed[0]} is not executable; {NOT_BUILT} again"
    return None


# ----------------------------------------------------------------------------- one prompt
@dataclass(frozen=True)
class Request:
    """One generation: the prompt as text, the same budget, sampling, threads and context as ours.

    temperature 0 = greedy; draft_max None = plain decoding, else lookup decoding drafting up to
    that many tokens per round."""

    prompt: str
    max_new_tokens: int
    threads: int
    context: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    draft_max: int | None = None


def command(request: Request, model: Path, root: Path | None = None) -> list[str]:
    """The argv that runs `request` on `model` (flags from common/arg.cpp of the built sources)."""
    root = root or install_dir()
    tool = PLAIN_TOOL if request.draft_max is None else LOOKUP_TOOL
    argv = [
        str(root / "bin" / tool), "-m", str(model), "-p", request.prompt, "--no-escape",
        "-n", str(request.max_new_tokens), "-c", str(request.context),
        "-b", str(request.context),  # the whole prompt in one batch: its tokens count as "prompt eval"
        "-t", str(request.threads), "--color", "off",
        "--temp", format(request.temperature, "g"), "--top-k", str(request.top_k),
        "--top-p", format(request.top_p, "g"), "--samplers", SAMPLER_ORDER, "-s", str(request.seed),
    ]
    if request.draft_max is None:
        argv += ["-no-cnv", "--no-display-prompt", "--simple-io"]
    else:
        argv += ["--spec-draft-n-max", str(request.draft_max)]
    return argv


# ----------------------------------------------------------------------------- parsing (pure)
@dataclass(frozen=True)
class Timings:
    """llama.cpp's perf lines: the prompt's tokens and milliseconds, the single-token decode runs
    and milliseconds, and the sampling milliseconds (not part of either)."""

    prompt_tokens: int
    prompt_ms: float
    eval_runs: int
    eval_ms: float
    sampling_ms: float | None


@dataclass(frozen=True)
class LookupStats:
    """llama-lookup's summary: drafting limit, tokens generated, drafted and accepted, and its own
    wall clock for encoding the prompt and for the decoding loop (drafting and sampling included)."""

    n_draft: int
    n_predict: int
    n_drafted: int
    n_accept: int
    accept_percent: float | None  # None when nothing was drafted (llama.cpp prints nan)
    encoded_tokens: int
    encode_s: float
    decoded_tokens: int
    decode_s: float

    @property
    def acceptance_rate(self) -> float | None:
        return self.n_accept / self.n_drafted if self.n_drafted else None


_NUM = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+|nan|inf))"
_PROMPT_EVAL = re.compile(rf"prompt eval time =\s*{_NUM} ms /\s*(\d+) tokens")
_EVAL = re.compile(rf"(?<!prompt )eval time =\s*{_NUM} ms /\s*(\d+) runs")
_SAMPLING = re.compile(rf"sampling time =\s*{_NUM} ms")
_CODED = re.compile(rf"(encoded|decoded)\s+(\d+) tokens in\s+{_NUM} seconds")
_LOOKUP_FIELD = re.compile(rf"\b(n_draft|n_predict|n_drafted|n_accept|accept)\s+=\s*{_NUM}")


def _last(pattern: re.Pattern[str], log: str, what: str) -> re.Match[str]:
    found = list(pattern.finditer(log))
    if not found:
        raise ValueError(f"no {what!r} line in llama.cpp's output; is this the output of a finished "
                         "llama-completion / llama-lookup run (see its stderr above)?")
    return found[-1]


def parse_timings(log: str) -> Timings:
    """The perf lines of a run's stderr (the last ones, should a tool print them twice)."""
    prompt = _last(_PROMPT_EVAL, log, "prompt eval time")
    evals = _last(_EVAL, log, "eval time")
    sampling = list(_SAMPLING.finditer(log))
    return Timings(prompt_tokens=int(prompt.group(2)), prompt_ms=float(prompt.group(1)),
                   eval_runs=int(evals.group(2)), eval_ms=float(evals.group(1)),
                   sampling_ms=float(sampling[-1].group(1)) if sampling else None)


def parse_lookup(log: str) -> LookupStats:
    """llama-lookup's summary lines (`encoded`/`decoded`, n_draft, n_predict, n_drafted, n_accept,
    accept) from its stderr."""
    coded = {m.group(1): (int(m.group(2)), float(m.group(3))) for m in _CODED.finditer(log)}
    encoded = list(_CODED.finditer(log))
    summary = log[encoded[-1].start():] if encoded else ""  # other lines say "n_predict = ..." too
    fields = {m.group(1): m.group(2) for m in _LOOKUP_FIELD.finditer(summary)}
    missing = [k for k in ("encoded", "decoded") if k not in coded]
    missing += [k for k in ("n_draft", "n_predict", "n_drafted", "n_accept", "accept") if k not in fields]
    if missing:
        raise ValueError(f"llama-lookup's output lacks {', '.join(missing)}; is it the output of a "
                         "finished llama-lookup run (see its stderr)?")
    accept = float(fields["accept"])
    return LookupStats(
        n_draft=int(fields["n_draft"]), n_predict=int(fields["n_predict"]),
        n_drafted=int(fields["n_drafted"]), n_accept=int(fields["n_accept"]),
        accept_percent=accept if math.isfinite(accept) else None,
        encoded_tokens=coded["encoded"][0], encode_s=coded["encoded"][1],
        decoded_tokens=coded["decoded"][0], decode_s=coded["decoded"][1],
    )


_END_OF_TEXT = " [end of text]\n"


def generated_text(stdout: str, prompt: str, lookup: bool) -> str:
    """The generated text in a tool's stdout: llama-completion (--no-display-prompt) prints it,
    then " [end of text]" when it stopped at an end-of-generation token, then a blank line;
    llama-lookup prints a blank line, the prompt, the generation and a blank line."""
    text = stdout.removesuffix("\n\n")
    if lookup:
        text = text.removeprefix("\n\n").removeprefix(prompt)
    return text.removesuffix(_END_OF_TEXT)


# ----------------------------------------------------------------------------- running
@dataclass(frozen=True)
class Output:
    """One finished run: the generated text, the seconds that count, and how they split."""

    text: str
    prompt_tokens: int
    new_tokens: int
    seconds: float  # prefill included, like our GenerationStats.total_s; process start and load excluded
    decode_seconds: float  # after the prompt: what the decode-rate and the roofline fraction use
    decode_tokens: int  # tokens produced in decode_seconds
    timings: Timings
    lookup: LookupStats | None = None


def output_of(stdout: str, stderr: str, request: Request) -> Output:
    """What a run printed, as an Output. Plain: seconds = prompt eval + eval (llama.cpp's compute
    timers; new tokens = eval runs + 1, the prompt's logits give the first). Lookup: its own
    encode + decode wall clock (multi-token verify batches are filed under "prompt eval" by the
    perf counters, so the split there means nothing); new tokens = its n_predict, which may pass
    max_new_tokens by up to draft_max + 1 (it stops only after a round)."""
    timings = parse_timings(stderr)
    lookup = request.draft_max is not None
    text = generated_text(stdout, request.prompt, lookup)
    if not lookup:
        return Output(text=text, prompt_tokens=timings.prompt_tokens, new_tokens=timings.eval_runs + 1,
                      seconds=(timings.prompt_ms + timings.eval_ms) / 1e3, decode_seconds=timings.eval_ms / 1e3,
                      decode_tokens=timings.eval_runs, timings=timings)
    stats = parse_lookup(stderr)
    return Output(text=text, prompt_tokens=stats.encoded_tokens, new_tokens=stats.n_predict,
                  seconds=stats.encode_s + stats.decode_s, decode_seconds=stats.decode_s,
                  decode_tokens=stats.n_predict, timings=timings, lookup=stats)


def check_prompt_tokens(got: int, want: int) -> None:
    """llama.cpp must run exactly our prompt tokens; ValueError saying which way it differs."""
    if got == want:
        return
    way = "more" if got > want else "fewer"
    raise ValueError(
        f"llama.cpp tokenized the prompt to {got} tokens, {abs(got - want)} {way} than our {want}: the "
        "text round trip (our tokenizer's decode, llama.cpp's tokenizer with special tokens) does not give "
        "the same ids; use a target whose tokenizer is the GGUF's (the default target) or drop the llama.cpp peers."
    )


def run(request: Request, model: Path, prompt_tokens: int, root: Path | None = None) -> Output:
    """Run one request; ValueError when llama.cpp is missing, fails, or saw another prompt length."""
    reason = available(root)
    if reason is not None:
        raise ValueError(reason)
    argv = command(request, model, root)
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          errors="replace")
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise ValueError(f"{Path(argv[0]).name} exited with {proc.returncode}; the end of its stderr:\n{tail}")
    out = output_of(proc.stdout, proc.stderr, request)
    check_prompt_tokens(out.prompt_tokens, prompt_tokens)
    return out
