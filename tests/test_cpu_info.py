"""The CPU named with every number: model and vector instructions from /proc/cpuinfo text."""

from pathlib import Path

from specdraft.cpu_info import cpu_description, describe_cpu

AVX2_ONLY = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse sse2 avx avx2 fma\n\nprocessor\t: 1\nmodel name\t: AMD EPYC\n"
XEON = ("model name\t: Intel(R) Xeon(R) Platinum\n"
        "flags\t\t: avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile\n")


def test_avx2_machine_is_named_with_its_instructions() -> None:
    assert describe_cpu(AVX2_ONLY) == "AMD EPYC (AVX2)"


def test_avx512_replaces_avx2_and_bf16_vnni_amx_are_named() -> None:
    assert describe_cpu(XEON) == "Intel(R) Xeon(R) Platinum (AMX, AVX-512, BF16, VNNI)"


def test_missing_fields_fall_back_to_what_is_known() -> None:
    assert describe_cpu("") == "unknown CPU"
    assert describe_cpu("model name\t: Some CPU\n") == "Some CPU"


def test_no_cpuinfo_file_still_names_something(tmp_path: Path) -> None:
    assert cpu_description(tmp_path / "missing")
