"""The emulator's decoder agrees with LLVM on every instruction of the kernels DEV=AMD compiles: with llvm-objdump's
disassembly for gfx942, and for gfx950 (which no installed disassembler knows) with the assembly llvmlite's LLVM prints
for the very module whose object it emits."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from fusegrad import Tensor
from fusegrad.helpers import AMD_SIM
from fusegrad.runtime.support.amd import inproc
from fusegrad.runtime.support.amd.codeobj import compile_ir, parse_code_object
from fusegrad.runtime.support.amd.emu import decode_all
from fusegrad.runtime.support.amd.emu.elf import text

OBJDUMP = next((t for t in ("llvm-objdump-19", "llvm-objdump") if shutil.which(t)), None)
LINE = re.compile(r"^\s+([a-z_0-9]+)\b.*//\s*([0-9A-F]+):")


def _objdump(elf: bytes, tmp_path) -> dict[int, str]:
    path = tmp_path / "k.so"
    path.write_bytes(elf)
    out = subprocess.run([OBJDUMP, "--disassemble", "--mcpu=gfx942", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    found = {}
    for line in out.stdout.splitlines():
        if m := LINE.match(line):
            name = m.group(1)
            for suffix in ("_e32", "_e64", "_sdwa", "_dpp"):
                name = name.removesuffix(suffix)
            found[int(m.group(2), 16)] = name
    return found


def _programs(fn) -> list:
    from fusegrad.runtime.device import Device

    dev = Device["AMD"]
    before = len(dev.built)
    fn()
    return dev.built[before:]


def _op_mix():
    rng = np.random.default_rng(0)
    a = Tensor(rng.standard_normal((9, 13)).astype(np.float32), device="AMD")
    b = Tensor(rng.standard_normal((13, 5)).astype(np.float32), device="AMD")
    h = Tensor(rng.standard_normal(17).astype(np.float16), device="AMD")
    i = Tensor(rng.integers(-50, 50, 23).astype(np.int32), device="AMD")
    d = Tensor(rng.standard_normal(11), device="AMD")
    wide = Tensor(rng.standard_normal((3, 300)).astype(np.float32), device="AMD")  # reductions split over lanes (LDS)
    # matmuls on the matrix cores (v_mfma_*, tiles in LDS)
    t1 = Tensor(rng.standard_normal((32, 64)).astype(np.float32), device="AMD")
    t2 = Tensor(rng.standard_normal((64, 32)).astype(np.float32), device="AMD")
    h1, h2 = t1.cast("float16").realize(), t2.cast("float16").realize()
    g1, g2 = t1.cast("bfloat16").realize(), t2.cast("bfloat16").realize()
    outs = [
        (a @ b).relu(),
        a.exp().log().sin(),
        a.softmax(1),
        a.max(0),
        a.argmax(1),
        (a / (b.sum() + 3)).sqrt(),
        (h * 2 + 1).float(),
        (i // 7 + i % 5) * (i < 3).cast(i.dtype),
        (d / 3 + d.sqrt()).cast("float32"),
        a.cumsum(1),
        (a - 1) ** 2,
        a.cast("uint8").cast("float32"),
        wide.max(1),
        wide.cast("float64").max(1),
        wide.cast("int64").max(1),
        t1 @ t2,
        h1 @ h2,
        g1 @ g2,
    ]
    for o in outs:
        o.numpy()


@pytest.fixture(scope="module")
def kernels():
    if OBJDUMP is None:
        pytest.skip("llvm-objdump is not installed (apt-get install llvm-19)")
    old, AMD_SIM.value = AMD_SIM.value, 1
    try:
        yield _programs(_op_mix)
    finally:
        AMD_SIM.value = old


def test_every_instruction_decodes_to_llvms_mnemonic(kernels, tmp_path):
    """gfx942: each kernel's IR built for gfx942, its .text decoded, against llvm-objdump-19 --mcpu=gfx942."""
    assert len(kernels) >= 12
    checked, names = 0, set()
    from fusegrad.renderer.llvmir_amdgpu import AMDGPURenderer

    for prog in kernels:
        renderer = AMDGPURenderer(prog.device.renderer.capabilities, "gfx942")  # its matrix-core shapes are CDNA3's
        elf = compile_ir(renderer.render(prog.info.name, prog.info.lin, prog.info.packs), "gfx942")
        want = _objdump(elf, tmp_path)
        addr, code = text(elf)
        start = parse_code_object(elf, prog.info.name).entry_offset - addr
        got = {addr + off: inst.name for off, inst in decode_all(code, start)}
        for pc, name in want.items():
            if pc < addr + start:
                continue
            assert got.get(pc) == name, f"{prog.info.name} at {pc:#x}: decoder says {got.get(pc)!r}, llvm {name!r}"
            names.add(name)
            checked += 1
    assert checked > 500 and len(names) > 40, (checked, sorted(names))
    assert {"s_barrier", "ds_write_b32", "ds_write_b64"} <= names  # the split reductions' LDS tree ran through
    assert {"v_mfma_f32_32x32x2_f32", "v_mfma_f32_32x32x8_f16", "v_mfma_f32_32x32x8_bf16"} <= names


ASM = re.compile(r"^\s+([a-z][a-z_0-9]*)\b")


def _asm_mnemonics(asm: str, name: str) -> list[str]:
    """The instructions of kernel `name` in LLVM's assembly output, in order (directives, labels, comments skipped)."""
    body = asm[asm.index(f"\n{name}:") : asm.index(".Lfunc_end")]
    out = []
    for line in body.splitlines()[1:]:
        if (m := ASM.match(line.split(";")[0])) is not None:
            mnemonic = m.group(1)
            for suffix in ("_e32", "_e64", "_sdwa", "_dpp"):
                mnemonic = mnemonic.removesuffix(suffix)
            out.append(mnemonic)
    return out


def test_gfx950_code_decodes_to_the_assembly_llvm_printed(kernels):
    """gfx950: the object's .text decodes, instruction by instruction, to the mnemonics LLVM 22 printed as assembly
    for the same optimized module (a round trip through LLVM's own printer, not a disassembler: no installed
    llvm-objdump knows gfx950)."""
    if not inproc.available() or inproc.llvm_version()[0] < 20:
        pytest.skip("llvmlite with an LLVM that knows gfx950 (20+) is not installed")
    checked, names = 0, set()
    from fusegrad.renderer.llvmir_amdgpu import AMDGPURenderer

    for prog in kernels:
        renderer = AMDGPURenderer(prog.device.renderer.capabilities, "gfx950")
        asm, obj = inproc.assembly_and_object(renderer.render(prog.info.name, prog.info.lin, prog.info.packs), "gfx950")
        elf = inproc.link(obj)
        addr, code = text(elf)
        start = parse_code_object(elf, prog.info.name).entry_offset - addr
        got = [inst.name for _, inst in decode_all(code, start)]
        want = _asm_mnemonics(asm, prog.info.name)
        got = got[: len(want)]  # the code is padded to its section's end with s_code_end-style fill
        assert got == want, f"{prog.info.name}: decoder {got} vs LLVM's assembly {want}"
        checked += len(want)
        names |= set(want)
    assert checked > 500 and len(names) > 40, (checked, sorted(names))
    assert {"v_mfma_f32_32x32x2_f32", "v_mfma_f32_32x32x16_f16", "v_mfma_f32_32x32x16_bf16"} <= names
