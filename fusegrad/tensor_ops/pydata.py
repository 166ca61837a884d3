"""Python data -> numpy for the Tensor constructor and full(): element checks, dtype inference, range checks."""

from __future__ import annotations

import math
from typing import Any

from fusegrad.lazy_numpy import np

from fusegrad.dtype import DType, dtypes, to_numpy_dtype, truncate

PyScalar = int | float | bool
INT64_MIN, INT64_MAX, UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1


def py_scalar(x: Any) -> PyScalar:
    """x as a Python bool/int/float; numpy scalars count as Python numbers of their kind; anything else is refused."""
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        return x
    if isinstance(x, (np.bool_, np.integer, np.floating)) or isinstance(x, np.ndarray) and x.ndim == 0:
        return py_scalar(x.item())
    if type(x).__name__ == "Tensor":
        raise TypeError("cannot build a Tensor from a list of Tensors; use Tensor.stack(...) or Tensor.cat(...)")
    kind = type(x).__name__
    raise TypeError(f"cannot build a Tensor from a {kind} element {x!r}: elements must be bool, int or float")


def flatten_py_data(data: Any) -> tuple[tuple[int, ...], list[PyScalar]]:
    """Shape and row-major leaves of nested lists/tuples/ranges/numpy arrays; ragged nesting is a ValueError."""
    if isinstance(data, np.ndarray) and data.ndim > 0:
        data = data.tolist()
    if not isinstance(data, (list, tuple, range)):
        return (), [py_scalar(data)]
    parts = [flatten_py_data(x) for x in data]
    shapes = {shape for shape, _ in parts}
    if len(shapes) > 1:
        raise ValueError(f"ragged nested sequence: sub-shapes {sorted(shapes)}")
    inner = parts[0][0] if parts else ()
    return (len(data),) + inner, [x for _, leaves in parts for x in leaves]


def _int_range_error(values: list[int], low: int, high: int, what: str) -> OverflowError:
    bad = next(x for x in values if not low <= x <= high)
    return OverflowError(f"Python int {bad} does not fit {what}")


def infer_py_dtype(values: list[PyScalar]) -> DType:
    """Any float -> default_float; else ints -> default_int, int64 when one does not fit it; else bool (empty: float).

    Ints beyond int64 are refused (OverflowError) like torch: no default dtype holds them.
    """
    if not values:
        return dtypes.default_float
    if any(isinstance(x, float) for x in values):
        return dtypes.default_float
    ints = [x for x in values if not isinstance(x, bool)]
    if not ints:
        return dtypes.bool
    low, high = min(ints), max(ints)
    if dtypes.default_int.min <= low and high <= dtypes.default_int.max:
        return dtypes.default_int
    if INT64_MIN <= low and high <= INT64_MAX:
        return dtypes.int64
    raise _int_range_error(ints, INT64_MIN, INT64_MAX, "int64 (pass dtype=dtypes.uint64 for values up to 2**64-1)")


def _accepted_int_range(dt: DType) -> tuple[int, int]:
    """Values torch accepts for an int dtype: its range, plus negatives (wrapping) for unsigned types below 64 bits."""
    if dt is dtypes.uint64:
        return 0, UINT64_MAX
    if dtypes.is_unsigned(dt):
        return INT64_MIN, int(dt.max)
    return int(dt.min), int(dt.max)


def check_py_values(values: list[PyScalar], dt: DType) -> list[PyScalar]:
    """Values converted for an explicit dtype; a value the dtype cannot hold raises as torch does: OverflowError
    where no 64-bit integer holds it for that dtype (past int64, or past uint64/negative for uint64), else
    RuntimeError. Floats into ints truncate toward zero; floats overflow to inf in float dtypes; anything goes
    into bool."""
    if dt is dtypes.bool:
        return values
    if not dtypes.is_int(dt):
        too_big = next((x for x in values if isinstance(x, int) and abs(x) >= 2**1024), None)
        if too_big is not None:  # float() itself would fail without naming the value
            raise OverflowError(f"Python int {too_big} is too large for any float dtype ({dt})")
        return values
    low, high = _accepted_int_range(dt)
    reach = (0, UINT64_MAX) if dt is dtypes.uint64 else (INT64_MIN, INT64_MAX)
    out = []
    for x in values:
        as_int = int(x) if not isinstance(x, float) or math.isfinite(x) else None
        if as_int is None or not low <= as_int <= high:
            beyond = isinstance(x, int) and not reach[0] <= x <= reach[1]
            raise (OverflowError if beyond else RuntimeError)(
                f"value {x!r} cannot be converted to {dt} without overflow"
            )
        out.append(as_int)
    return out


def py_data_to_numpy(data: Any, dt: DType | None) -> tuple[np.ndarray, DType]:
    """Nested Python data as a numpy array ready to store in dt (inferred when None), and that dtype."""
    shape, values = flatten_py_data(data)
    dt = dt or infer_py_dtype(values)
    values = check_py_values(values, dt)
    if dt is dtypes.bfloat16 or dtypes.is_float(dt) and dt.fmt is None:
        # float64 keeps Python floats exact until the one rounding to the narrow dtype
        return np.array(values, dtype=np.float64).reshape(shape), dt
    if dtypes.is_float(dt):
        with np.errstate(over="ignore"):  # values past the dtype's range become inf, as torch
            return np.array(values, dtype=np.float64).astype(to_numpy_dtype(dt)).reshape(shape), dt
    if dt is dtypes.bool:
        return np.array([bool(x) for x in values], dtype=np.bool_).reshape(shape), dt
    return np.array([truncate(x, dt) for x in values], dtype=to_numpy_dtype(dt)).reshape(shape), dt


def py_scalar_const(value: Any, dt: DType | None) -> tuple[PyScalar, DType]:
    """A Python scalar checked like one list element: its dtype (inferred when None) and the value to store."""
    value = py_scalar(value)
    dt = dt or infer_py_dtype([value])
    return check_py_values([value], dt)[0], dt
