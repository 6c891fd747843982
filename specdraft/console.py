"""How every console script starts and fails: Hydra for the config, one line for a user's mistake.

A user error (a bad value, a missing file, a config Hydra cannot compose or parse) is printed as
`error: <sentence>` on stderr and the script exits with status 2; an unexpected exception keeps its
whole traceback (that is a bug to report, and the stack is what a maintainer needs). Ctrl-C exits
with status 130 after the task's own cleanup ran (e.g. the bench writes its partial results).

    @hydra_cli("generate")
    def main(cfg: DictConfig) -> None: ...
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import hydra
from hydra.errors import HydraException, InstantiationException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

# Exceptions that mean "the input is wrong", not "specdraft is broken".
USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, FileNotFoundError, FileExistsError, PermissionError, NotADirectoryError,
    IsADirectoryError, HydraException, OmegaConfBaseException,
)
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
QUOTING_HINT = (
    "values with spaces, commas, '=' or brackets must be quoted for Hydra, e.g. "
    "'prompt=\"Hello, world!\"', or put the text in a file and pass prompt_file=PATH (- reads stdin)."
)


def user_message(error: BaseException) -> str:
    """The sentence to show for a user error: the innermost user error's message (Hydra wraps a
    ValueError raised while instantiating a config in its own exception), on one line where the
    original is one line."""
    inner: BaseException = error
    while isinstance(inner, InstantiationException) and isinstance(inner.__cause__, USER_ERRORS):
        inner = inner.__cause__
    text = str(inner).strip() or type(inner).__name__
    if isinstance(inner, OverrideParseException):
        text = f"{text}\n{QUOTING_HINT}"
    return text


def hydra_cli(config_name: str) -> Callable[[Callable[[DictConfig], Any]], Callable[[], None]]:
    """Decorate a task `fn(cfg)` into a console-script `main()` composed from `conf/<config_name>`."""

    def decorate(fn: Callable[[DictConfig], Any]) -> Callable[[], None]:
        @functools.wraps(fn)
        def guarded(cfg: DictConfig) -> None:
            # Inside the job: Hydra would print its own "Error executing job" line first.
            try:
                fn(cfg)
            except USER_ERRORS as error:
                _exit_with(error)

        task = hydra.main(version_base="1.3", config_path="pkg://conf", config_name=config_name)(guarded)

        @functools.wraps(fn)
        def main() -> None:
            # Hydra prints a stripped stack and exits 1 unless HYDRA_FULL_ERROR is set; with it set
            # the exception reaches us, and we decide: one line for users, the stack for bugs.
            previous = os.environ.get("HYDRA_FULL_ERROR")
            os.environ["HYDRA_FULL_ERROR"] = "1"
            quiet_known_logs()
            try:
                task()
            except KeyboardInterrupt:
                print("interrupted", file=sys.stderr)
                raise SystemExit(EXIT_INTERRUPTED) from None
            except USER_ERRORS as error:  # composing or parsing the config failed
                _exit_with(error)
            finally:
                if previous is None:
                    os.environ.pop("HYDRA_FULL_ERROR", None)
                else:
                    os.environ["HYDRA_FULL_ERROR"] = previous

        return main

    return decorate


def _exit_with(error: BaseException) -> None:
    print(f"error: {user_message(error)}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE) from None


def quiet_known_logs() -> None:
    """Process-wide log levels, for the console scripts only (library code never sets them):
    bitsandbytes logs on every int8 matmul that float32 inputs are cast to float16 (expected)."""
    logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
