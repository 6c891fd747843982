"""Which CPU a number was measured on: its model name and the vector instructions that decide
its speed here (AVX2 vs AVX-512, and whether bfloat16 / VNNI / AMX are native).

A model name alone does not say it: the same "AMD EPYC" string has come with AVX2 only and with
AVX-512, and bfloat16 matmuls are native on one and emulated (several times slower) on the other,
so every printed number names both.
"""

from __future__ import annotations

import platform
from pathlib import Path

# /proc/cpuinfo flag -> the name printed, most capable first within each family
ISA_FLAGS: tuple[tuple[str, str], ...] = (
    ("amx_tile", "AMX"),
    ("avx512f", "AVX-512"),
    ("avx512_bf16", "BF16"),
    ("avx512_vnni", "VNNI"),
    ("avx2", "AVX2"),
)


def describe_cpu(cpuinfo: str) -> str:
    """'<model name> (<instruction sets>)' from the text of /proc/cpuinfo, e.g.
    'AMD EPYC (AVX-512, BF16, VNNI)'; AVX2 is named only when AVX-512 is absent."""
    model, flags = "unknown CPU", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown CPU":
            model = value.strip() or model
        elif key == "flags" and not flags:
            flags = set(value.split())
    names = [name for flag, name in ISA_FLAGS if flag in flags]
    if "AVX-512" in names and "AVX2" in names:
        names.remove("AVX2")
    return f"{model} ({', '.join(names)})" if names else model


def cpu_description(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """`describe_cpu` of this machine; the platform's processor name where there is no /proc/cpuinfo."""
    try:
        return describe_cpu(cpuinfo.read_text())
    except OSError:
        return platform.processor() or "unknown CPU"
