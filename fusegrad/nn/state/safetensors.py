"""safetensors files: a JSON header of names, dtypes, shapes and offsets, then the raw bytes."""

from __future__ import annotations

import json
import os
import re
import struct
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from fusegrad.dtype import DType, dtypes
from fusegrad.helpers import prod, round_up
from fusegrad.nn.safe_pickle import MAX_RANK
from fusegrad.tensor import Tensor
from fusegrad.nn.state.blob import Blob, blob_of, raw_bytes

SAFETENSORS_DTYPES: dict[str, DType] = {
    "BOOL": dtypes.bool,
    "I8": dtypes.int8,
    "U8": dtypes.uint8,
    "I16": dtypes.int16,
    "U16": dtypes.uint16,
    "I32": dtypes.int32,
    "U32": dtypes.uint32,
    "I64": dtypes.int64,
    "U64": dtypes.uint64,
    "F8_E4M3": dtypes.fp8e4m3,
    "F8_E5M2": dtypes.fp8e5m2,
    "F16": dtypes.float16,
    "BF16": dtypes.bfloat16,
    "F32": dtypes.float32,
    "F64": dtypes.float64,
}


_SAFETENSORS_NAMES = {v: k for k, v in SAFETENSORS_DTYPES.items()}


_SAFETENSORS_MAX_HEADER = 100_000_000  # the safetensors package's limit
_MAX_JSON_DEPTH = 64  # a safetensors header nests 3 deep; deeper is crafted (and json's recursion would fail)
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def _json_depth(raw: bytes) -> int:
    """How deeply brackets nest in a JSON text (brackets inside strings do not count), without parsing it."""
    skeleton = np.frombuffer(_JSON_STRING.sub(b'""', raw), np.uint8)
    steps = np.isin(skeleton, np.frombuffer(b"[{", np.uint8)).astype(np.int64)
    steps -= np.isin(skeleton, np.frombuffer(b"]}", np.uint8))
    return int(np.cumsum(steps).max(initial=0))


def _unique_keys(blob: Blob) -> Callable[[list[tuple[str, Any]]], dict]:
    def build(pairs: list[tuple[str, Any]]) -> dict:
        out = dict(pairs)
        if len(out) != len(pairs):
            dups = sorted({k for k, _ in pairs if sum(1 for k2, _ in pairs if k2 == k) > 1})
            raise ValueError(f"{blob.name}: safetensors header has duplicate keys {dups[:8]}")
        return out

    return build


def _safe_header(blob: Blob) -> tuple[int, dict]:
    if len(blob) < 8:
        raise ValueError(
            f"{blob.name}: not a safetensors file: {len(blob)} bytes, shorter than the 8-byte header length"
        )
    n = struct.unpack("<Q", blob.read(0, 8, "header length"))[0]
    if n > len(blob) - 8:
        raise ValueError(
            f"{blob.name}: header length {n} exceeds the {len(blob) - 8} bytes after it"
            " (truncated, or not a safetensors file)"
        )
    if n > _SAFETENSORS_MAX_HEADER:
        raise ValueError(f"{blob.name}: header length {n} exceeds the format's limit of {_SAFETENSORS_MAX_HEADER}")
    raw = blob.read(8, n, "header")
    if (depth := _json_depth(raw)) > _MAX_JSON_DEPTH:
        raise ValueError(f"{blob.name}: safetensors header nests {depth} levels deep (at most {_MAX_JSON_DEPTH})")
    try:
        header = json.loads(raw, object_pairs_hook=_unique_keys(blob))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{blob.name}: safetensors header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{blob.name}: safetensors header is a {type(header).__name__}, not an object")
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError(f"{blob.name}: __metadata__ must map strings to strings, got {meta!r:.200}")
    return 8 + n, header


def _is_count(x: Any, limit: int = 1 << 62) -> bool:
    """A non-negative int (not a bool, not a float) below limit."""
    return type(x) is int and 0 <= x < limit


def _safe_entries(blob: Blob, data_start: int, header: dict) -> list[tuple[str, DType, tuple[int, ...], int]]:
    """(key, dtype, shape, start) of each tensor, checked like the safetensors package checks them: known dtype, sane
    shape, offsets that hold exactly the tensor's bytes, and tensors that tile the data section without overlap."""
    out, spans = [], []
    for key, info in header.items():
        if key == "__metadata__":
            continue
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            raise ValueError(f"{blob.name}: entry {key!r} = {info!r:.200} needs 'dtype', 'shape' and 'data_offsets'")
        dt, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dt, str) or dt not in SAFETENSORS_DTYPES:
            raise ValueError(
                f"{blob.name}: tensor {key!r} has unknown dtype {dt!r:.100}; known: {sorted(SAFETENSORS_DTYPES)}"
            )
        if (
            not isinstance(shape, list)
            or len(shape) > MAX_RANK
            or not all(_is_count(d) for d in shape)
            or not _is_count(prod(max(d, 1) for d in shape))
        ):
            raise ValueError(f"{blob.name}: tensor {key!r} has invalid shape {shape!r:.200}")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(map(_is_count, offsets))
            and offsets[0] <= offsets[1]
        ):
            raise ValueError(f"{blob.name}: tensor {key!r} has invalid data_offsets {offsets!r:.200}")
        dtype = SAFETENSORS_DTYPES[dt]
        if (nbytes := offsets[1] - offsets[0]) != prod(shape) * dtype.itemsize:
            raise ValueError(
                f"{blob.name}: tensor {key!r} ({dt}, shape {tuple(shape)}) needs {prod(shape) * dtype.itemsize} bytes "
                f"but data_offsets {offsets} hold {nbytes}"
            )
        out.append((key, dtype, tuple(shape), data_start + offsets[0]))
        spans.append((offsets[0], offsets[1], key, f"({dtype}, shape {tuple(shape)})"))
    end, prev = 0, None
    for start, stop, key, _ in sorted(spans):
        if start != end:
            what = "overlaps" if start < end else f"leaves a gap of {start - end} bytes after"
            raise ValueError(
                f"{blob.name}: tensor {key!r} at data_offsets [{start}, {stop}) {what} "
                + (f"tensor {prev!r} (ending at {end})" if prev is not None else "the start of the data section")
            )
        end, prev = stop, key
    if data_start + end > len(blob):
        start, stop, key, what = max(spans)
        raise ValueError(
            f"{blob.name}: truncated: tensor {key!r} {what} needs bytes [{data_start + start}, {data_start + stop}) "
            f"but the file has {len(blob)}"
        )
    if data_start + end != len(blob):
        raise ValueError(
            f"{blob.name}: {len(blob) - data_start - end} bytes after the last tensor: the header does not describe "
            "the whole file"
        )
    return out


def safe_load_metadata(fn: Any) -> tuple[Tensor, int, dict]:
    """(the file as a uint8 Tensor, byte offset where tensor data starts, the JSON header)."""
    blob = blob_of(fn)
    data_start, header = _safe_header(blob)
    _safe_entries(blob, data_start, header)
    return blob.tensor(0, dtypes.uint8, (len(blob),), "file"), data_start, header


def safe_load(fn: Any) -> dict[str, Tensor]:
    """Tensors of a .safetensors file (path or uint8 Tensor), lazily backed by the file: nothing is read until used."""
    blob = blob_of(fn)
    data_start, header = _safe_header(blob)
    return {
        key: blob.tensor(start, dtype, shape, f"tensor {key!r}")
        for key, dtype, shape, start in _safe_entries(blob, data_start, header)
    }


def _atomic_write(fn: str | os.PathLike, chunks: list[Any]) -> None:
    """Write to a temporary file beside fn, then rename: readers (and earlier memory maps) never see half a file."""
    fn = os.fspath(fn)
    fd, tmp = tempfile.mkstemp(
        dir=os.path.dirname(os.path.abspath(fn)), prefix=".tmp-", suffix="-" + os.path.basename(fn)
    )
    try:
        with os.fdopen(fd, "wb") as f:
            for c in chunks:
                f.write(c)
        os.replace(tmp, fn)
    except BaseException:
        os.unlink(tmp)
        raise


def safe_save(tensors: dict[str, Tensor], fn: str | os.PathLike, metadata: dict[str, Any] | None = None) -> None:
    """Write tensors (any dtype of SAFETENSORS_DTYPES) as a .safetensors file."""
    header: dict[str, Any] = {}
    if metadata is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError(f"safe_save: metadata must map str to str, got {metadata!r}")
        header["__metadata__"] = metadata
    datas, offset = [], 0
    for k, t in tensors.items():
        if not isinstance(k, str) or not isinstance(t, Tensor):
            raise TypeError(f"safe_save: {k!r} -> {type(t).__name__} is not str -> Tensor")
        if t.dtype not in _SAFETENSORS_NAMES:
            raise ValueError(f"safe_save: tensor {k!r} has dtype {t.dtype}, which safetensors cannot store")
        data = raw_bytes(t)
        header[k] = {
            "dtype": _SAFETENSORS_NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + data.nbytes],
        }
        datas.append(data)
        offset += data.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (round_up(len(raw), 8) - len(raw))  # the data section starts 8-byte aligned
    _atomic_write(fn, [struct.pack("<Q", len(raw)), raw, *datas])
