"""A user's raw kernel source (uop/kernel.py's RawKernel) given the calling convention of fusegrad's own CPU kernels:
a wrapper taking every buffer and the (core_start, core_end) chunk, calling the user's function once."""

from __future__ import annotations
import re


def c_with_wrapper(src: str, entry: str, nparams: int, split: bool = False) -> tuple[str, str]:
    """(C source, wrapper name): the user's C with a wrapper that calls `entry` on the buffers (split: and on the
    chunk [core_start, core_end) of its items)."""
    name = f"fg_raw_{entry}"
    params = ", ".join([f"void* p{i}" for i in range(nparams)] + ["long long core_start", "long long core_end"])
    call = ", ".join([f"p{i}" for i in range(nparams)] + (["core_start", "core_end"] if split else []))
    return f"{src}\nvoid {name}({params}) {{ {entry}({call}); }}\n", name


def llvm_with_wrapper(ir: str, entry: str, nparams: int) -> tuple[str, str]:
    """(LLVM IR, wrapper name): the user's module with a wrapper function that calls `@entry` on the buffers."""
    match = re.search(rf"define\s+[^@]*@{re.escape(entry)}\s*\(([^)]*)\)", ir)
    if match is None:
        raise ValueError(f"raw LLVM IR defines no function @{entry}")
    types = [p.strip().rsplit("%", 1)[0].split()[0] for p in match.group(1).split(",") if p.strip()]
    if len(types) != nparams:
        raise ValueError(f"raw LLVM IR's @{entry} takes {len(types)} arguments, the kernel has {nparams} inputs")
    name = f"fg_raw_{entry}"
    params = ", ".join([f"ptr %p{i}" for i in range(nparams)] + ["i64 %start", "i64 %end"])
    call = ", ".join(f"{t} %p{i}" for i, t in enumerate(types))
    return f"{ir}\ndefine void @{name}({params}) {{\n  call void @{entry}({call})\n  ret void\n}}\n", name
