"""Fixtures: tiny random targets (milliseconds) and the real default target (session-scoped, slow).

Tests that are not marked `slow` run with ONE torch thread: tiny models are dominated by thread
synchronisation, which on a loaded 2-core machine makes them ~50x slower with 2 threads. Under
`make test` (pytest-xdist, a worker per core) every test gets one thread, so workers do not compete.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest
import torch
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from specdraft.models import tiny_random_target
from specdraft.target import TargetModel

# Measured verify-cost curves (specdraft/costs.py) go to a throwaway directory, not the user's cache;
# subprocess CLI tests inherit it.
os.environ.setdefault("SPECDRAFT_CACHE_DIR", tempfile.mkdtemp(prefix="specdraft-test-cache-"))
# `make test` runs a pytest-xdist worker per core: then every test gets one torch thread.
PARALLEL = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1


@pytest.fixture(autouse=True)
def _threads_for_test(request: pytest.FixtureRequest) -> Iterator[None]:
    before = torch.get_num_threads()
    if PARALLEL or request.node.get_closest_marker("slow") is None:
        torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny_target() -> TargetModel:
    """Vocab 16, 2 layers, random weights, no EOS."""
    return tiny_random_target(vocab_size=16, seed=1)


@pytest.fixture(scope="session")
def default_target() -> TargetModel:
    """SmolLM2-135M-Instruct on CPU (loaded once per test session, ~3 s)."""
    from specdraft.models import load_target

    return load_target("smollm2-135m", device="cpu")


@pytest.fixture
def hydra_conf() -> Iterator[None]:
    """Hydra initialised on the shipped `conf` package (as the console scripts see it), cleared after."""
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        yield
    GlobalHydra.instance().clear()
