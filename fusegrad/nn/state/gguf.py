"""GGUF files (llama.cpp): typed key-values and tensors, kept quantized or dequantized."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from fusegrad.dtype import dtypes
from fusegrad.helpers import prod, round_up
from fusegrad.nn.quantized import DEQUANTIZERS, GGML_PLAIN_TYPES, GGML_TYPES, GGMLQuantized
from fusegrad.runtime.buffers import default_device
from fusegrad.tensor import Tensor
from fusegrad.nn.state.blob import Blob, blob_of


def ggml_data_to_tensor(t: Tensor, n: int, ggml_type: int) -> Tensor:
    """n values from the raw bytes `t` (uint8) of ggml type `ggml_type`: plain types bitcast, quantized blocks
    dequantized to float32 with tensor ops on the device (a DISK tensor is copied to the default device first)."""
    if ggml_type not in GGML_TYPES:
        raise ValueError(f"unknown ggml type {ggml_type}; known: {sorted(GGML_TYPES)}")
    name, block, block_bytes = GGML_TYPES[ggml_type]
    if n % block:
        raise ValueError(f"{n} elements of {name} do not fill whole blocks of {block}")
    nbytes = n // block * block_bytes
    if t.dtype is not dtypes.uint8 or t.numel() < nbytes:
        raise ValueError(f"{n} {name} values need {nbytes} uint8 bytes, got {t}")
    if ggml_type in GGML_PLAIN_TYPES:
        return blob_of(t.reshape(-1)).tensor(0, GGML_PLAIN_TYPES[ggml_type], (n,), name)
    if ggml_type not in DEQUANTIZERS:
        raise NotImplementedError(
            f"ggml type {name} ({ggml_type}) is not supported; supported: "
            f"{sorted(GGML_TYPES[k][0] for k in (*GGML_PLAIN_TYPES, *DEQUANTIZERS))}"
        )
    if t.device.startswith("DISK:"):
        t = t.to(default_device())
    return DEQUANTIZERS[ggml_type](t.reshape(-1)[:nbytes].reshape(n // block, block_bytes)).reshape(n)


class _Reader:
    """Little-endian values at a moving position; reading past the end names the file, the offset and the size."""

    def __init__(self, blob: Blob):
        self.blob, self.pos = blob, 0

    def take(self, n: int, what: str) -> bytes:
        out = self.blob.read(self.pos, n, what)
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str) -> Any:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        raw = self.take(self.unpack("Q", what), what)
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise ValueError(f"{self.blob.name}: {what} at offset {self.pos - len(raw)} is not UTF-8") from None


_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_MAX_NESTING = 8  # arrays of arrays: real files nest at most 2 deep
_GGML_MAX_DIMS = 4  # ggml tensors have at most 4 dims


def _gguf_value(r: _Reader, vtype: int, key: str, depth: int = 0) -> Any:
    if vtype in _GGUF_SCALARS:
        return r.unpack(_GGUF_SCALARS[vtype], f"value of {key!r}")
    if vtype == 8:
        return r.string(f"value of {key!r}")
    if vtype == 9:
        item_type, count = r.unpack("I", f"array type of {key!r}"), r.unpack("Q", f"array length of {key!r}")
        if item_type in _GGUF_SCALARS:
            fmt = "<" + _GGUF_SCALARS[item_type]
            return np.frombuffer(r.take(count * struct.calcsize(fmt), f"array {key!r}"), fmt).tolist()
        if item_type not in (8, 9):
            raise ValueError(f"{r.blob.name}: array {key!r} has unknown item type {item_type} at offset {r.pos - 12}")
        if item_type == 9 and depth >= _GGUF_MAX_NESTING:
            raise ValueError(f"{r.blob.name}: array {key!r} nests arrays more than {_GGUF_MAX_NESTING} deep")
        # each item takes at least 8 bytes (a string's length, an array's type and length): a count past that is bogus
        if count * 8 > len(r.blob) - r.pos:
            raise ValueError(
                f"{r.blob.name}: array length of {key!r} is {count} but only {len(r.blob) - r.pos} bytes follow"
            )
        return [_gguf_value(r, item_type, key, depth + 1) for _ in range(count)]
    raise ValueError(f"{r.blob.name}: metadata {key!r} has unknown value type {vtype} at offset {r.pos - 4}")


def gguf_load(fn: Any, keep_quantized: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, tensors) of a GGUF file (path or uint8 Tensor). Plain tensors stay lazily on DISK; quantized ones
    (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) are dequantized to float32 on the default device when realized, or with
    keep_quantized are GGMLQuantized values holding their blocks."""
    blob = blob_of(fn)
    r = _Reader(blob)
    if (magic := r.take(4, "magic")) != b"GGUF":
        raise ValueError(f"{blob.name}: not a GGUF file: magic {magic!r}, expected b'GGUF'")
    if (version := r.unpack("I", "version")) not in (2, 3):
        raise ValueError(f"{blob.name}: GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_kv = r.unpack("Q", "tensor count"), r.unpack("Q", "metadata count")
    # a metadata entry takes at least 12 bytes, a tensor info at least 24: larger counts cannot fit in the file
    if n_kv * 12 + n_tensors * 24 > len(blob) - r.pos:
        raise ValueError(
            f"{blob.name}: tensor count {n_tensors} and metadata count {n_kv} cannot fit in the "
            f"{len(blob) - r.pos} bytes that follow"
        )
    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string("metadata key")
        if key in kv:
            raise ValueError(f"{blob.name}: metadata key {key!r} appears twice")
        kv[key] = _gguf_value(r, r.unpack("I", f"value type of {key!r}"), key)
    infos = []
    for _ in range(n_tensors):
        name = r.string("tensor name")
        if (n_dims := r.unpack("I", f"rank of {name!r}")) > _GGML_MAX_DIMS:
            raise ValueError(f"{blob.name}: tensor {name!r} has rank {n_dims}; ggml allows at most {_GGML_MAX_DIMS}")
        dims = [r.unpack("Q", f"shape of {name!r}") for _ in range(n_dims)]
        if prod(max(d, 1) for d in dims) >= 1 << 62:
            raise ValueError(f"{blob.name}: tensor {name!r} has an absurd shape {tuple(reversed(dims))}")
        infos.append(
            (name, tuple(reversed(dims)), r.unpack("I", f"type of {name!r}"), r.unpack("Q", f"offset of {name!r}"))
        )
    if len({info[0] for info in infos}) != len(infos):
        dups = sorted({n for n, *_ in infos if sum(1 for m, *_ in infos if m == n) > 1})
        raise ValueError(f"{blob.name}: tensor names {dups[:8]} appear more than once")
    alignment = kv.get("general.alignment", 32)
    if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"{blob.name}: general.alignment {alignment!r} is not a power of two")
    data_start, state, spans = round_up(r.pos, alignment), {}, []
    for name, shape, ggml_type, offset in infos:
        if ggml_type not in GGML_TYPES:
            raise ValueError(f"{blob.name}: tensor {name!r} has unknown ggml type {ggml_type}")
        tname, block, block_bytes = GGML_TYPES[ggml_type]
        n = prod(shape)
        if n % block:
            raise ValueError(
                f"{blob.name}: tensor {name!r} of shape {shape} does not fill whole {tname} blocks of {block}"
            )
        spans.append((offset, offset + n // block * block_bytes, name))
    end, prev = 0, None
    for start, stop, name in sorted(spans):
        if start < end:
            raise ValueError(
                f"{blob.name}: tensor {name!r} at data offset {start} overlaps tensor {prev!r} (ending at {end})"
            )
        if stop > start:
            end, prev = stop, name
    for name, shape, ggml_type, offset in infos:
        tname, block, block_bytes = GGML_TYPES[ggml_type]
        n = prod(shape)
        if ggml_type in GGML_PLAIN_TYPES:
            state[name] = blob.tensor(data_start + offset, GGML_PLAIN_TYPES[ggml_type], shape, f"tensor {name!r}")
        else:
            if ggml_type not in DEQUANTIZERS:
                raise NotImplementedError(f"{blob.name}: tensor {name!r} has ggml type {tname}, which is not supported")
            raw = blob.tensor(data_start + offset, dtypes.uint8, (n // block * block_bytes,), f"tensor {name!r}")
            if keep_quantized:
                state[name] = GGMLQuantized(name, ggml_type, shape, raw.reshape(n // block, block_bytes))
            else:
                state[name] = ggml_data_to_tensor(raw, n, ggml_type).reshape(shape)
    return kv, state
