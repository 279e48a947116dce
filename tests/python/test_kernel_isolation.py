"""The dispatching binary runs on every x86-64 CPU: AVX and AVX-512 instructions appear only in
the kernels compiled for those targets (the namespaces mfattn::cpu::avx2 / ::avx512,
mfattn::simd::avx2 / ::avx512 and mfattn::kernels::avx2 / ::avx512), never in code every CPU runs, such as an inline library
function whose one kept copy came from a kernel file (see src/kernels/compile_target.hpp).

Checked on the machine code: objdump's disassembly of build/mfattn, function by function.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

FUNCTION = re.compile(r"^[0-9a-f]+ <(.*)>:$")


def _registers_by_function(binary) -> dict[str, set[str]]:
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", str(binary)],
                         check=True, capture_output=True, text=True).stdout
    used: dict[str, set[str]] = {}
    current = None
    for line in out.splitlines():
        match = FUNCTION.match(line)
        if match:
            current = match.group(1)
            continue
        if current is None:
            continue
        for kind in ("%ymm", "%zmm"):
            if kind in line:
                used.setdefault(current, set()).add(kind)
    return used


def _compiled_sets(binary) -> list[str]:
    out = subprocess.run([str(binary), "--version"], check=True, capture_output=True,
                         text=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("cpu kernels:"))
    return line.split("compiled:", 1)[1].split(";", 1)[0].split()


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed")
def test_wide_registers_appear_only_in_their_targets_kernels(mfattn_binary):
    sets = _compiled_sets(mfattn_binary)
    if "avx512" not in sets or "avx2" not in sets:
        pytest.skip(f"not a dispatching build (kernels compiled: {' '.join(sets)})")
    used = _registers_by_function(mfattn_binary)
    outside = sorted(f for f, kinds in used.items() if not re.search(r"::avx(2|512)::", f))
    assert not outside, f"AVX registers outside the AVX kernels: {outside[:10]}"
    zmm_in_avx2 = sorted(f for f, kinds in used.items()
                         if "%zmm" in kinds and "::avx2::" in f and "::avx512::" not in f)
    assert not zmm_in_avx2, f"AVX-512 registers in the AVX2 kernels: {zmm_in_avx2[:10]}"
    # The check can fail: the AVX-512 kernels do use AVX-512 registers, the AVX2 ones ymm.
    assert any("%zmm" in kinds for f, kinds in used.items() if "::avx512::" in f)
    assert any("%ymm" in kinds for f, kinds in used.items() if "::avx2::" in f)
