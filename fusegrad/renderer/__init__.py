"""What every renderer is: a printer of linear UOps for one target, and the Capabilities of that target, which codegen
reads (the heuristics, BEAM, vector packing) instead of asking a device. A device builds its renderer with its own
values (the CPU device from its C compiler's `-march=native`, LLVM from llvmlite's host features)."""

from __future__ import annotations
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING
from fusegrad.dtype import DType
from fusegrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from fusegrad.codegen.opt.packs import Pack


@dataclass(frozen=True)
class Capabilities:
    """What a target can do, as far as choosing and packing opts goes."""

    vector_bytes: int = 16  # width of one vector register: register tiles are planned in vectors this wide
    vector_registers: int = 16  # vector registers a register tile may fill (less the heuristics' spare ones)
    # (unary op, dtype) pairs a packed vector may compute beyond packs.VECTOR_ALU: math with a vector form
    vector_math: frozenset[tuple[Ops, DType]] = frozenset()
    vector_types: bool = False  # the dialect prints vector types: codegen's pack_vectors stage packs upcast lanes
    pack_bytes: int | None = None  # the widest vector type upcast lanes are packed into; None: vector_bytes
    parallel_loops: bool = False  # every global loop runs in parallel work items (lower_to_linear refuses REDUCE_BLOCK)
    # the target's compiler vectorizes loops itself (GCC, clang): pack_vectors leaves it the runs of loads no pack
    # reads as a vector
    loop_vectorizer: bool = False
    group_reduce: bool = False  # a reduce with few outputs is split over a work group's lanes, combined in local memory
    # the kernels' register tiles gain from a big matmul's weight copied into panels first (schedule/panels.py)
    weight_panels: bool = False
    matrix_cores: bool = False  # a plain matmul (codegen/opt/matrix_tile.py) gets no opts: the renderer tiles it itself
    # the target computes float64 exp/log/sin/cos/pow; off: codegen/float_math.py writes them out in float arithmetic
    float64_math: bool = True
    # the target's float32 sin/cos reduce large arguments; off: computed through float_math.py's float64 reduction
    sin_reduction: bool = True
    # the target multiplies 8-bit integers into 32-bit sums in one instruction (x86 VNNI vpdpbusd, Arm sdot), which
    # its compiler finds in a plain sum of 8-bit products: a quantized matvec then quantizes its activations to 8 bits
    int8_dot: bool = False
    # the target multiplies pairs of 16-bit integers into 32-bit sums in one instruction (x86 AVX2 vpmaddwd), which its
    # compiler finds in a plain sum of 8-bit by 16-bit products: without int8_dot, a quantized matvec then quantizes
    # its activations to 8-bit values held in 16 bits
    int16_dot: bool = False
    # the target's kernels are C compiled for x86 AVX2, whose vpmaddubsw multiplies unsigned by signed 8-bit pairs into
    # 16-bit sums: a quantized matvec then runs as a C kernel of AVX2 intrinsics (nn/quantized_avx2.py) that sums
    # each block in lanes and scales it lane-wise, which GCC does not find in the plain sums
    u8s8_pair_dot: bool = False

    def lanes(self, dtype: DType) -> int:
        """Elements of dtype in one vector register (at least 1)."""
        return max(self.vector_bytes // max(dtype.itemsize, 1), 1)

    @property
    def packed_bytes(self) -> int:
        return self.vector_bytes if self.pack_bytes is None else self.pack_bytes

    def replace(self, **changes: object) -> Capabilities:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


class Renderer:
    """The base of every renderer. `capabilities` (class attribute) is the dialect's default; a device passes its
    target's values when it builds the renderer."""

    capabilities: Capabilities = Capabilities()

    def __init__(self, capabilities: Capabilities | None = None):
        if capabilities is not None:
            self.capabilities = capabilities

    def render(self, name: str, lin: tuple[UOp, ...], packs: dict[UOp, tuple[Pack, int]] | None = None) -> str:
        """The source of one kernel: lin's instructions, the lanes of each of `packs` (KernelInfo.packs, from
        codegen's pack_vectors stage) as one vector; none given: every lane scalar."""
        raise NotImplementedError(f"{type(self).__name__} only describes its target; it prints no source")


__all__ = ["Capabilities", "Renderer"]
