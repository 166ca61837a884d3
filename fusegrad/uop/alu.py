"""Python semantics of every ALU op, matching what the C renderer emits (C truncating division, IEEE floats)."""

from __future__ import annotations
import math
import struct
from typing import Any, Callable
from fusegrad.dtype import DType, dtypes, truncate, float_to_bf16, bf16_to_float, float_to_fp8, fp8_to_float
from fusegrad.uop.ops import Ops


def _fdiv(a: float, b: float) -> float:
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _idiv(a: int, b: int) -> int:
    if b == 0:
        return 0  # defined as 0 by the renderer too: C would trap
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _mod(a: int, b: int) -> int:
    return 0 if b == 0 else a - b * _idiv(a, b)


def _max(a: Any, b: Any) -> Any:
    if isinstance(a, float) and math.isnan(a):
        return a
    if isinstance(b, float) and math.isnan(b):
        return b
    return a if a > b else b


def _safe(fn: Callable[[float], float], edge: Callable[[float], float]) -> Callable[[float], float]:
    def wrapped(x: float) -> float:
        try:
            return fn(x)
        except (ValueError, OverflowError):
            return edge(x)

    return wrapped


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _log(x: float) -> float:
    if math.isnan(x) or x < 0:
        return math.nan
    return -math.inf if x == 0 else math.log(x)


def _pow(a: float, b: float) -> float:
    try:
        return math.pow(a, b)
    except OverflowError:
        return math.inf if a > 0 or float(b).is_integer() and int(b) % 2 == 0 else -math.inf
    except (ValueError, ZeroDivisionError):
        if a != 0:
            return math.nan
        odd = float(b).is_integer() and int(b) % 2 == 1
        return math.copysign(math.inf, a) if odd else math.inf  # C pow: (+-0) ** negative odd keeps the zero's sign


def _trig(fn: Callable[[float], float]) -> Callable[[float], float]:
    return _safe(fn, lambda x: math.nan)


def _shift_left(a: int, b: int) -> int:
    return a << b if 0 <= b < 64 else 0


def _shift_right(a: int, b: int) -> int:
    return a >> b if 0 <= b < 64 else (-1 if a < 0 else 0)


python_alu: dict[Ops, Callable[..., Any]] = {
    Ops.NEG: lambda x: (not x) if isinstance(x, bool) else -x,
    Ops.RECIPROCAL: lambda x: _fdiv(1.0, x),
    Ops.SQRT: lambda x: math.sqrt(x) if x >= 0 else (x if x != x else math.nan),
    Ops.EXP: _exp,
    Ops.LOG: _log,
    Ops.EXP2: lambda x: _exp(x * math.log(2)),
    Ops.LOG2: lambda x: _log(x) / math.log(2),
    Ops.SIN: _trig(math.sin),
    Ops.COS: _trig(math.cos),
    Ops.TRUNC: lambda x: float(math.trunc(x)) if math.isfinite(x) else x,
    Ops.ADD: lambda a, b: a + b,
    Ops.MUL: lambda a, b: a * b,
    Ops.FDIV: _fdiv,
    Ops.IDIV: _idiv,
    Ops.MOD: _mod,
    Ops.MAX: _max,
    Ops.POW: _pow,
    Ops.CMPLT: lambda a, b: a < b,
    Ops.CMPNE: lambda a, b: a != b,
    Ops.CMPEQ: lambda a, b: a == b,
    Ops.AND: lambda a, b: a & b,
    Ops.OR: lambda a, b: a | b,
    Ops.XOR: lambda a, b: a ^ b,
    Ops.SHL: _shift_left,
    Ops.SHR: _shift_right,
    Ops.WHERE: lambda c, a, b: a if c else b,
}


def exec_alu(op: Ops, dtype: DType, operands: list[Any]) -> Any:
    """Evaluate one ALU op on Python values and store the result as `dtype` would (ints wrap, floats round)."""
    if dtypes.is_float(dtype) and op not in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.WHERE):
        operands = [float(x) for x in operands]
    if op in (Ops.LOG2, Ops.LOG) and operands[0] == 0:
        return -math.inf
    return truncate(python_alu[op](*operands), dtype)


def cast_value(x: Any, dtype: DType) -> Any:
    """Value conversion (CAST): float -> int truncates toward zero, anything -> bool is != 0."""
    if dtype is dtypes.bool:
        return bool(x)
    if dtypes.is_int(dtype) and isinstance(x, float):
        return 0 if not math.isfinite(x) else truncate(math.trunc(x), dtype)
    return truncate(x, dtype)


_STRUCT = {dtypes.float16: "e", dtypes.float32: "f", dtypes.float64: "d", dtypes.bool: "?"}


def bitcast_value(x: Any, src: DType, dst: DType) -> Any:
    """Reinterpret the bits of one value of equal item size."""
    if src is dtypes.bfloat16:
        raw = float_to_bf16(x).to_bytes(2, "little")
    elif src in dtypes.fp8s:
        raw = float_to_fp8(x, src).to_bytes(1, "little")
    else:
        raw = struct.pack("<" + (_STRUCT.get(src) or src.fmt or "B"), x)
    if dst is dtypes.bfloat16:
        return bf16_to_float(int.from_bytes(raw, "little"))
    if dst in dtypes.fp8s:
        return fp8_to_float(raw[0], dst)
    return struct.unpack("<" + (_STRUCT.get(dst) or dst.fmt or "B"), raw)[0]
