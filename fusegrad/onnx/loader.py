"""Reading an ONNX file: parse the protobuf, bring external data in (never from outside the model's folder), check
the graph (defined names, no cycles, initializers as long as their shapes) and turn tensors into numpy arrays."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

try:
    import onnx
    from onnx import numpy_helper
    from google.protobuf.message import DecodeError
except ImportError as e:  # the onnx extra is optional for the rest of fusegrad
    raise ImportError("fusegrad.onnx needs the onnx package: pip install onnx") from e

from fusegrad.dtype import DType, dtypes

# ONNX TensorProto.DataType codes fusegrad can hold; the rest (strings, complex, 4-bit, 2-bit) are refused
ONNX_DTYPES: dict[int, DType] = {
    1: dtypes.float32,
    2: dtypes.uint8,
    3: dtypes.int8,
    4: dtypes.uint16,
    5: dtypes.int16,
    6: dtypes.int32,
    7: dtypes.int64,
    9: dtypes.bool,
    10: dtypes.float16,
    11: dtypes.float64,
    12: dtypes.uint32,
    13: dtypes.uint64,
    16: dtypes.bfloat16,
    17: dtypes.fp8e4m3,
    18: dtypes.fp8e4m3fnuz,
    19: dtypes.fp8e5m2,
    20: dtypes.fp8e5m2fnuz,
}


def onnx_dtype(code: int, where: str) -> DType:
    """The fusegrad dtype of an ONNX element type code; NotImplementedError naming it for types fusegrad lacks."""
    if code not in ONNX_DTYPES:
        name = onnx.TensorProto.DataType.Name(code) if code in onnx.TensorProto.DataType.values() else str(code)
        raise NotImplementedError(f"{where}: ONNX element type {name} is not supported by fusegrad")
    return ONNX_DTYPES[code]


def parse_model(model: Any) -> tuple[onnx.ModelProto, str | None]:
    """A ModelProto and the folder its external data is relative to (None for bytes or a proto in memory)."""
    if isinstance(model, onnx.ModelProto):
        return model, None
    if isinstance(model, (bytes, bytearray, memoryview)):
        data, base, what = bytes(model), None, "the model bytes"
    elif isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise ValueError(f"ONNX model file {path!r} does not exist")
        with open(path, "rb") as f:
            data = f.read()
        base, what = os.path.dirname(os.path.abspath(path)), repr(path)
    else:
        raise TypeError(f"OnnxRunner takes a path, bytes or an onnx.ModelProto, not {type(model).__name__}")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ValueError(f"{what} is not a valid ONNX protobuf (truncated or malformed): {e}") from None
    if not proto.HasField("graph") or not proto.graph.output:
        raise ValueError(f"{what} holds no ONNX graph with outputs (truncated or not an ONNX model)")
    return proto, base


def _external_bytes(t: onnx.TensorProto, base: str | None) -> bytes:
    info = {e.key: e.value for e in t.external_data}
    if base is None:
        raise ValueError(f"initializer {t.name!r} keeps its data in an external file; load the model from its path")
    if "location" not in info:
        raise ValueError(f"initializer {t.name!r}: external data without a location")
    root = os.path.realpath(base)
    path = os.path.realpath(os.path.join(root, info["location"]))
    if os.path.commonpath([root, path]) != root:
        raise ValueError(f"initializer {t.name!r}: external data path {info['location']!r} leaves the model folder")
    if not os.path.isfile(path):
        raise ValueError(f"initializer {t.name!r}: external data file {info['location']!r} does not exist")
    offset, size = int(info.get("offset", 0)), os.path.getsize(path)
    length = int(info["length"]) if "length" in info else size - offset
    if offset < 0 or length < 0 or offset + length > size:
        raise ValueError(f"initializer {t.name!r}: bytes {offset}..{offset + length} lie outside {path!r} ({size} B)")
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


def to_numpy(t: onnx.TensorProto, base: str | None = None) -> np.ndarray:
    """The value of a TensorProto (external data read from under `base`); ValueError if its data is short."""
    onnx_dtype(t.data_type, f"tensor {t.name!r}")
    if t.data_location == onnx.TensorProto.EXTERNAL:
        t2 = onnx.TensorProto()
        t2.CopyFrom(t)
        del t2.external_data[:]
        t2.data_location = onnx.TensorProto.DEFAULT
        t2.raw_data = _external_bytes(t, base)
        t = t2
    count = int(np.prod(t.dims, dtype=np.int64)) if len(t.dims) else 1
    if any(d < 0 for d in t.dims):
        raise ValueError(f"tensor {t.name!r} has a negative dimension in {list(t.dims)}")
    if t.HasField("raw_data"):
        need = count * onnx_dtype(t.data_type, t.name).itemsize
        if len(t.raw_data) < need:
            raise ValueError(f"tensor {t.name!r} of shape {list(t.dims)} needs {need} B of data, has {len(t.raw_data)}")
    try:
        arr = numpy_helper.to_array(t)
    except (ValueError, TypeError) as e:
        raise ValueError(f"tensor {t.name!r} of shape {list(t.dims)}: its data does not fill the shape ({e})") from None
    return np.array(arr, copy=True, order="C")


def attr_value(a: onnx.AttributeProto, base: str | None) -> Any:
    """A node attribute as a Python value (ints, floats, lists, numpy arrays, subgraphs kept as GraphProto)."""
    A = onnx.AttributeProto
    if a.type == A.FLOAT:
        return float(a.f)
    if a.type == A.INT:
        return int(a.i)
    if a.type == A.STRING:
        return a.s.decode("utf-8", errors="replace")
    if a.type == A.TENSOR:
        return to_numpy(a.t, base)
    if a.type == A.GRAPH:
        return a.g
    if a.type == A.FLOATS:
        return [float(x) for x in a.floats]
    if a.type == A.INTS:
        return [int(x) for x in a.ints]
    if a.type == A.STRINGS:
        return [s.decode("utf-8", errors="replace") for s in a.strings]
    raise NotImplementedError(f"attribute {a.name!r} of type {A.AttributeType.Name(a.type)} is not supported")


def topo_order(graph: onnx.GraphProto, known: set[str], where: str = "graph") -> list[onnx.NodeProto]:
    """The graph's nodes in an order where each runs after its producers; ValueError on a cycle or undefined name."""
    producers = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    deps = [{producers[x] for x in n.input if x and x not in known and x in producers} for n in graph.node]
    for n in graph.node:
        for x in n.input:
            if x and x not in known and x not in producers:
                raise ValueError(f"{where}: node {n.name or n.op_type!r} ({n.op_type}) reads {x!r}, which is undefined")
    order, state = [], [0] * len(graph.node)  # 0 unvisited, 1 on the stack, 2 done
    for root in range(len(graph.node)):
        stack = [(root, iter(sorted(deps[root])))]
        if state[root]:
            continue
        state[root] = 1
        while stack:
            i, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[i] = 2
                order.append(graph.node[i])
                stack.pop()
            elif state[nxt] == 1:
                n = graph.node[nxt]
                raise ValueError(f"{where}: the graph has a cycle through node {n.name or n.op_type!r} ({n.op_type})")
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(sorted(deps[nxt]))))
    return order


def opset_versions(model: onnx.ModelProto) -> dict[str, int]:
    """Domain → opset version; the default domain is '' (also spelled 'ai.onnx')."""
    out = {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in model.opset_import}
    out.setdefault("", 1 if model.opset_import else onnx.defs.onnx_opset_version())
    return out
