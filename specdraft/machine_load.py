"""Was the bench alone on the machine? The CPU time other processes used while it ran (and the
load average before and after), and the warnings its report carries when other processes (or its
own surplus threads) competed for the cores.

Timings on a busy machine are slower and noisier, and OpenMP threads that outnumber the cores
slow each other down far more than proportionally, so a bench report must say when either
happened. Where the kernel reports the machine's CPU time (Linux /proc/stat), the other
processes' share is measured: the machine's busy CPU seconds during the run (stolen time
included: another guest held the cores) minus the bench's own (its threads and waited-for
children, e.g. llama.cpp), per second of the run. Elsewhere it is estimated from the 1-minute
load average, which counts runnable threads machine-wide but decays over minutes, so it still
holds the bench's own earlier work (a sweep after the per-prompt runs would blame others for it).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specdraft.cpu_info import cpu_description

BUSY_LOAD = 0.5  # other processes' 1-minute load below this is noise (shells, monitors)


@dataclass(frozen=True)
class CpuClock:
    """One reading of the clocks `others_cores` compares: wall seconds, the machine's busy CPU
    seconds (None where unknown) and this process's own CPU seconds (threads + waited-for children)."""

    wall_s: float
    machine_busy_s: float | None
    own_s: float

    @classmethod
    def now(cls) -> CpuClock:
        t = os.times()
        return cls(time.monotonic(), machine_busy_seconds(), t.user + t.system + t.children_user + t.children_system)


def machine_busy_seconds(stat: Path = Path("/proc/stat")) -> float | None:
    """CPU seconds all cores have spent busy since boot (user, nice, system, irq, softirq and steal of
    /proc/stat's first line), or None where there is no such file."""
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
        ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
        return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def others_cores(start: CpuClock, end: CpuClock) -> float | None:
    """Cores other processes kept busy on average between two readings: (machine busy seconds -
    this process's CPU seconds) / wall seconds, clamped at 0 (the two clocks tick at different
    granularities); None where the machine's busy time is unknown or no time passed."""
    wall = end.wall_s - start.wall_s
    if start.machine_busy_s is None or end.machine_busy_s is None or wall <= 0:
        return None
    return max(0.0, (end.machine_busy_s - start.machine_busy_s) - (end.own_s - start.own_s)) / wall


@dataclass(frozen=True)
class MachineLoad:
    """What the bench saw of the machine: its cores, its torch threads, the 1/5/15-minute load
    averages before and after the run (None where the platform has no load average), the cores
    other processes kept busy while it ran (`others_cores`; None where not measurable) and the CPU
    (`specdraft.cpu_info.cpu_description`: model and vector instructions)."""

    cpu_count: int | None
    threads: int
    load_before: tuple[float, float, float] | None
    load_after: tuple[float, float, float] | None
    others_during: float | None = None
    cpu: str = "unknown CPU"

    @classmethod
    def since(cls, start: CpuClock, load_before: tuple[float, float, float] | None, threads: int) -> MachineLoad:
        """The machine from `start` (with the load average read then) until now."""
        return cls(os.cpu_count(), threads, load_before, load_average(), others_cores(start, CpuClock.now()),
                   cpu_description())

    def warnings(self) -> list[str]:
        """`load_warnings` of the measured share of other processes, else of the 1-minute averages."""
        return load_warnings(
            self.threads, self.cpu_count,
            None if self.load_before is None else self.load_before[0],
            None if self.load_after is None else self.load_after[0],
            self.others_during,
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
    threads: int, cpu_count: int | None, load_before: float | None, load_after: float | None,
    others_during: float | None = None,
) -> list[str]:
    """Warnings for a bench report (empty when the machine was the bench's alone).

    threads: the bench's torch threads; cpu_count: the machine's cores (None = unknown);
    load_before / load_after: 1-minute load averages before any generation and after the run;
    others_during: the cores other processes kept busy during the run, measured (`others_cores`).
    Without that measurement the other processes' load is estimated as the larger of
    `load_before` and `load_after - threads`. They competed when their load is at least BUSY_LOAD
    and, added to the bench's threads, needed more cores than the machine has.
    """
    out = []
    if cpu_count is not None and threads > cpu_count:
        out.append(
            f"torch runs {threads} threads on {cpu_count} cores: the bench's own threads competed for "
            f"the cores (oversubscription slows every forward); set bench.threads={cpu_count} or fewer."
        )
    if others_during is not None:
        others = others_during
        seen = "measured: the machine's busy CPU time during the run minus the bench's own"
    else:
        known = [x for x in (load_before, None if load_after is None else load_after - threads) if x is not None]
        others = max(known, default=0.0)
        seen = "1-minute load average " + ", ".join(
            f"{name} {x:.2f}" for name, x in (("before", load_before), ("after", load_after)) if x is not None)
    if cpu_count is not None and others >= BUSY_LOAD and threads + others > cpu_count:
        plural = "s" if threads != 1 else ""
        out.append(
            f"other processes competed for the cores: their load was about {others:.1f} ({seen}) while "
            f"the bench ran {threads} thread{plural} on {cpu_count} cores, so these timings are slower and "
            "noisier than on an idle machine; rerun when it is idle or lower bench.threads."
        )
    return out
