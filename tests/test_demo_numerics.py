"""demo/numerics.py: the demo pins MKL's code path so its table is the same on every machine of a kind."""
from __future__ import annotations

import subprocess
import sys

import pytest

from memagent.demo.numerics import cpu_flags, cpu_vendor, mkl_branch, pin_mkl_branch


def test_the_widest_branch_the_processor_has():
    assert mkl_branch({"sse2", "avx", "avx2", "avx512f", "avx512bw"}) == "AVX512"
    assert mkl_branch({"sse2", "avx", "avx2"}) == "AVX2"
    assert mkl_branch({"sse2", "avx"}) is None  # older than AVX2: MKL chooses


def test_pin_sets_the_variable_and_leaves_a_users_choice_alone():
    env: dict[str, str] = {}
    assert pin_mkl_branch(env, {"avx2"}) == "AVX2" and env == {"MKL_CBWR": "AVX2"}
    env = {"MKL_CBWR": "COMPATIBLE"}
    assert pin_mkl_branch(env, {"avx512f"}) == "COMPATIBLE" and env == {"MKL_CBWR": "COMPATIBLE"}
    env = {}
    assert pin_mkl_branch(env, set()) is None and env == {}


def test_cpu_flags_reads_the_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: X\nflags\t\t: fpu sse2 avx2 fma\n\n"
                    "processor\t: 1\nflags\t: fpu\n")
    assert cpu_flags(info) == {"fpu", "sse2", "avx2", "fma"}
    assert cpu_flags(tmp_path / "missing") == set()
    assert cpu_vendor(info) == "AuthenticAMD" and cpu_vendor(tmp_path / "missing") is None


def test_the_demo_command_pins_before_it_runs(monkeypatch, tmp_path, capsys):
    import os

    import memagent.cli.train as train_cli
    from memagent.cli import run

    seen = {}
    monkeypatch.delenv("MKL_CBWR", raising=False)
    monkeypatch.setattr(train_cli, "run_demo", lambda cfg: seen.setdefault("cbwr", os.environ.get("MKL_CBWR")))
    assert run(["demo", "--quick", "--out", str(tmp_path / "d")]) == 0
    assert seen["cbwr"] == mkl_branch(cpu_flags())


_SUM = """import torch
torch.manual_seed(0)
a, b = torch.randn(96, 3000), torch.randn(3000, 96)
print(sum(float(x) for x in (a @ b).flatten()[:64]).hex())"""


@pytest.mark.skipif(not {"avx2", "avx512f"} <= cpu_flags() or cpu_vendor() != "GenuineIntel",
                    reason="needs an Intel processor with both AVX2 and AVX-512 (MKL's branches are Intel's: on an "
                           "AMD EPYC with AVX-512 both settings gave the same bits)")
def test_the_branch_decides_the_bits_and_a_pinned_branch_repeats_them():
    """Why the pin matters: the same matrix product in MKL's AVX2 and AVX-512 paths rounds differently."""
    def bits(branch: str) -> str:
        env = {**__import__("os").environ, "MKL_CBWR": branch, "OMP_NUM_THREADS": "1"}
        return subprocess.run([sys.executable, "-c", _SUM], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    avx2, avx512 = bits("AVX2"), bits("AVX512")
    assert avx2 == bits("AVX2") and avx512 == bits("AVX512")
    assert avx2 != avx512
