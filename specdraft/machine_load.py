"""Was the bench alone on the machine? The load average before and after a run, and the warnings
its report carries when other processes (or its own surplus threads) competed for the cores.

Timings on a busy machine are slower and noisier, and OpenMP threads that outnumber the cores
slow each other down far more than proportionally, so a bench report must say when either
happened. The 1-minute load average counts runnable threads machine-wide: before the bench
generates anything it is the other processes' load; after a run it is the bench's own threads
plus the others'.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

BUSY_LOAD = 0.5  # other processes' 1-minute load below this is noise (shells, monitors)


@dataclass(frozen=True)
class MachineLoad:
    """What the bench saw of the machine: its cores, its torch threads and the 1/5/15-minute load
    averages before and after the run (None where the platform has no load average)."""

    cpu_count: int | None
    threads: int
    load_before: tuple[float, float, float] | None
    load_after: tuple[float, float, float] | None

    def warnings(self) -> list[str]:
        """`load_warnings` of the 1-minute averages."""
        return load_warnings(
            self.threads, self.cpu_count,
            None if self.load_before is None else self.load_before[0],
            None if self.load_after is None else self.load_after[0],
        )

    def to_json(self) -> dict[str, Any]:
        """The record results.json keeps, warnings included."""
        return {**asdict(self), "warnings": self.warnings()}


def load_average() -> tuple[float, float, float] | None:
    """os.getloadavg(), or None where the platform has none (Windows) or it cannot be read."""
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return None


def load_warnings(
    threads: int, cpu_count: int | None, load_before: float | None, load_after: float | None
) -> list[str]:
    """Warnings for a bench report (empty when the machine was the bench's alone).

    threads: the bench's torch threads; cpu_count: the machine's cores (None = unknown);
    load_before / load_after: 1-minute load averages before any generation and after the run.
    The other processes' load is estimated as the larger of `load_before` and `load_after -
    threads`; they competed when that load is at least BUSY_LOAD and, added to the bench's
    threads, needed more cores than the machine has.
    """
    out = []
    if cpu_count is not None and threads > cpu_count:
        out.append(
            f"torch runs {threads} threads on {cpu_count} cores: the bench's own threads competed for "
            f"the cores (oversubscription slows every forward); set bench.threads={cpu_count} or fewer."
        )
    known = [x for x in (load_before, None if load_after is None else load_after - threads) if x is not None]
    others = max(known, default=0.0)
    if cpu_count is not None and others >= BUSY_LOAD and threads + others > cpu_count:
        seen = ", ".join(f"{name} {x:.2f}" for name, x in (("before", load_before), ("after", load_after))
                         if x is not None)
        plural = "s" if threads != 1 else ""
        out.append(
            f"other processes competed for the cores: their load was about {others:.1f} (1-minute load "
            f"average {seen}) while the bench ran {threads} thread{plural} on {cpu_count} cores, so these "
            "timings are slower and noisier than on an idle machine; rerun when it is idle or lower "
            "bench.threads."
        )
    return out
