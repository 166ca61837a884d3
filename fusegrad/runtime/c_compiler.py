"""Which C compiler the CPU device uses (CC, else the first of cc, clang, gcc on PATH): asked by the device registry
to choose the default device, and by the CPU device to compile."""

from __future__ import annotations
import functools
import shutil
from fusegrad.helpers import CC

COMPILER_CANDIDATES = ("cc", "clang", "gcc")


class CompileError(RuntimeError):
    pass


def find_compiler() -> str:
    return _locate_compiler(CC.value)


@functools.cache
def _locate_compiler(requested: str) -> str:
    tried = [requested] if requested else list(COMPILER_CANDIDATES)
    for name in tried:
        if (path := shutil.which(name)) is not None:
            return path
    raise RuntimeError(
        f"no C compiler found for the CPU device (tried {', '.join(tried)} on PATH); install one, "
        "e.g. `apt-get install gcc`, or set CC=/path/to/compiler"
    )
