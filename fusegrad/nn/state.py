"""State I/O (docs/api.md, State files): state dicts, safetensors, PyTorch checkpoints, tar/zip archives and GGUF files.

Files are read through a memory map (device "DISK:<path>"), so loading reads headers only: a tensor's bytes are read
when it is first used. Every malformed file raises ValueError naming the file, the key and the values involved.
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
import tarfile
import tempfile
import time
import types
import zipfile
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from fusegrad.dtype import DType, dtypes, to_numpy_dtype
from fusegrad.helpers import prod, round_up
from fusegrad.nn.quantized import DEQUANTIZERS, GGML_PLAIN_TYPES, GGML_TYPES, GGMLQuantized
from fusegrad.nn.safe_pickle import MAX_RANK, PickleSource, RestrictedUnpickler
from fusegrad.runtime.buffers import Buffer, DiskBuffer, buffer_uop, check_mapped, host_values, is_contiguous_view
from fusegrad.runtime.buffers import view_buffer
from fusegrad.runtime.device import Device
from fusegrad.schedule.multi import multi_axis
from fusegrad.tensor import Tensor

# ------------------------------------------------------------------ state dicts


def get_state_dict(obj: Any, prefix: str = "", tensor_type: type = Tensor) -> dict[str, Tensor]:
    """Every tensor reachable through attributes, lists, tuples, dicts and namedtuples, keyed by its dotted path."""
    out: dict[str, Tensor] = {}

    def walk(x: Any, key: str, path: frozenset[int]) -> None:
        if isinstance(x, tensor_type):
            out[key.strip(".")] = x
            return
        if id(x) in path:
            return  # a reference cycle (e.g. a child that points to its parent)
        path = path | {id(x)}
        if hasattr(x, "_asdict") and isinstance(x, tuple):
            x = x._asdict()
        if isinstance(x, dict):
            items = x.items()
        elif isinstance(x, (list, tuple)):
            items = enumerate(x)
        elif hasattr(x, "__dict__") and not isinstance(x, (type, types.ModuleType, types.FunctionType)):
            items = vars(x).items()
        else:
            return
        for k, v in items:
            walk(v, f"{key}{k}.", path)

    walk(obj, prefix, frozenset())
    return out


def get_parameters(obj: Any) -> list[Tensor]:
    return list(get_state_dict(obj).values())


def load_state_dict(
    model: Any,
    state_dict: dict[str, Tensor],
    strict: bool = True,
    verbose: bool = True,
    consume: bool = False,
    realize: bool = True,
) -> list[Tensor]:
    """Copy state_dict[k] into the model's tensor k (same device and dtype as the model's). All values are built in new
    buffers first; the model's tensors are swapped to them only once every one of them loaded."""
    st = time.perf_counter()
    model_sd = get_state_dict(model)
    missing = [k for k in model_sd if k not in state_dict]
    unexpected = [k for k in state_dict if k not in model_sd]
    if strict and missing:
        raise KeyError(
            f"load_state_dict: the state dict lacks {len(missing)} of the model's keys: {missing}"
            + (f"; it has keys the model does not: {unexpected}" if unexpected else "")
        )
    if verbose and (missing or unexpected):
        print(f"load_state_dict: not loading {missing}, unused in the state dict: {unexpected}")
    pairs = [(k, v, state_dict[k]) for k, v in model_sd.items() if k in state_dict]
    for k, _, s in pairs:
        if not isinstance(s, Tensor):
            raise TypeError(f"load_state_dict: state dict value for key {k!r} is a {type(s).__name__}, not a Tensor")
    mismatched = [
        f"{k}: model {v.shape}, state dict {s.shape}"
        for k, v, s in pairs
        if v.shape != s.shape and {v.shape, s.shape} != {(), (1,)}
    ]
    if mismatched:
        raise ValueError(f"load_state_dict: shape mismatch for {len(mismatched)} key(s): {'; '.join(mismatched)}")
    new = [_placed_like(s, v) for _, v, s in pairs]
    if realize and new:
        Tensor.realize(*new)
    for (k, v, _), x in zip(pairs, new):
        v.replace(x)
        if consume:
            del state_dict[k]
    if verbose:
        nbytes = sum(v.nbytes() for _, v, _ in pairs)
        print(
            f"load_state_dict: loaded {len(pairs)} tensors, {nbytes / 1e6:.2f} MB"
            f" in {(time.perf_counter() - st) * 1e3:.1f} ms"
        )
    return [v for _, v, _ in pairs]


def _placed_like(s: Tensor, v: Tensor) -> Tensor:
    """s with v's shape and dtype on v's device, or split over v's devices along v's sharded axis whatever the
    placement of s (a state dict may come from a model sharded differently, or from none)."""
    x = s.reshape(v.shape).cast(v.dtype)
    if isinstance(v.device, tuple):
        axis = multi_axis(v.uop)
        if x.device == v.device and multi_axis(x.uop) == axis:
            moved = x
        else:
            moved = (x.to(x.device[0]) if isinstance(x.device, tuple) else x).shard(v.device, axis)
    else:
        moved = x.to(v.device)
    # a value already placed like the model's gets its own buffer, so the model never aliases the dict
    return moved.contiguous() if moved is x and s.dtype == v.dtype else moved


# ------------------------------------------------------------------ where a file's bytes live


class _Blob:
    """A file's bytes: a range of a file on disk read through its memory map (only touched pages are read), or bytes
    in host memory. `device` is "DISK:<path>" for a file; for host bytes, the device their tensors go to."""

    def __init__(self, name: str, mem: memoryview, device: str, mapping: Any = None, offset: int = 0):
        self.name, self.mem, self.device, self.mapping, self.offset = name, mem, device, mapping, offset

    def __len__(self) -> int:
        return len(self.mem)

    def check(self, start: int, n: int, what: str) -> None:
        """Bytes [start, start + n) are inside the blob and, for a file, still on disk (a file cut short after it was
        mapped would kill the process with SIGBUS when the missing pages are read)."""
        if start < 0 or n < 0 or start + n > len(self.mem):
            raise ValueError(
                f"{self.name}: truncated: {what} needs bytes [{start}, {start + n}) but the file has {len(self.mem)}"
            )
        if self.mapping is not None:
            check_mapped(self.mapping, self.offset + start, n, f"{self.name} ({self.device[5:]})", what)

    def read(self, start: int, n: int, what: str) -> bytes:
        self.check(start, n, what)
        return bytes(self.mem[start : start + n])

    def sub(self, start: int, n: int, name: str) -> _Blob:
        self.check(start, n, name)
        return _Blob(name, self.mem[start : start + n], self.device, self.mapping, self.offset + start)

    def tensor(self, start: int, dtype: DType, shape: tuple[int, ...], what: str) -> Tensor:
        """The elements at byte `start`: a lazy DISK tensor for a file, else a copy of the bytes on self.device."""
        n = prod(shape)
        nbytes = n * dtype.itemsize
        if start < 0 or start + nbytes > len(self.mem):
            raise ValueError(
                f"{self.name}: truncated: {what} ({dtype}, shape {shape}) needs bytes [{start}, {start + nbytes}) "
                f"but the file has {len(self.mem)}"
            )
        self.check(start, nbytes, what)
        if self.mapping is not None:
            buf: Buffer = DiskBuffer(self.device, n, dtype, self.mapping, self.offset + start)
        else:
            raw = np.frombuffer(self.mem, np.uint8, count=nbytes, offset=start).view(to_numpy_dtype(dtype)).copy()
            buf = Buffer(self.device, n, dtype, initial=raw)
        return Tensor(buffer_uop(buf), device=self.device).reshape(shape)


def _file_blob(path: str | os.PathLike) -> _Blob:
    full = os.path.abspath(os.fspath(path))
    device = f"DISK:{full}"
    mapping = Device[device].mapping()
    return _Blob(os.fspath(path), memoryview(mapping), device, mapping)


def _blob_of(fn: Any) -> _Blob:
    """A path, or a uint8 Tensor holding a file's bytes (a DISK tensor stays lazy)."""
    if isinstance(fn, (str, os.PathLike)):
        return _file_blob(fn)
    if not isinstance(fn, Tensor):
        raise TypeError(f"expected a path or a uint8 Tensor, got {type(fn).__name__}")
    if fn.dtype is not dtypes.uint8 or fn.ndim != 1:
        raise TypeError(f"expected a 1-D uint8 Tensor of file bytes, got {fn}")
    buf = view_buffer(fn.uop)
    if isinstance(buf, DiskBuffer):
        mem = memoryview(buf.mapping)[buf.offset : buf.offset + buf.nbytes]
        return _Blob(
            f"{buf.device[5:]}[{buf.offset}:{buf.offset + buf.nbytes}]", mem, buf.device, buf.mapping, buf.offset
        )
    return _Blob(f"<uint8 tensor of {fn.numel()} bytes on {fn.device}>", memoryview(fn.numpy()), fn.device)


def _raw_bytes(t: Tensor) -> np.ndarray:
    """The tensor's stored bytes (bfloat16/fp8 bits unchanged), realized in one contiguous buffer."""
    if not is_contiguous_view(t.uop):
        t = t.contiguous()
    t.realize()
    return host_values(t.uop).view(np.uint8)


class _BlobIO(io.RawIOBase):
    """A seekable read-only file over a blob, for tarfile/zipfile/pickle."""

    def __init__(self, blob: _Blob):
        super().__init__()
        self.blob, self.pos = blob, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = max(0, (0, self.pos, len(self.blob))[whence] + offset)
        return self.pos

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), len(self.blob) - self.pos))
        self.blob.check(self.pos, n, "archive data")
        b[:n] = self.blob.mem[self.pos : self.pos + n]
        self.pos += n
        return n


def TensorIO(t: Tensor) -> io.BufferedReader:
    """A read-only, seekable file over a 1-D uint8 Tensor (a DISK tensor is read lazily)."""
    return io.BufferedReader(_BlobIO(_blob_of(t)))


# ------------------------------------------------------------------ safetensors

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


def _unique_keys(blob: _Blob) -> Callable[[list[tuple[str, Any]]], dict]:
    def build(pairs: list[tuple[str, Any]]) -> dict:
        out = dict(pairs)
        if len(out) != len(pairs):
            dups = sorted({k for k, _ in pairs if sum(1 for k2, _ in pairs if k2 == k) > 1})
            raise ValueError(f"{blob.name}: safetensors header has duplicate keys {dups[:8]}")
        return out

    return build


def _safe_header(blob: _Blob) -> tuple[int, dict]:
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


def _safe_entries(blob: _Blob, data_start: int, header: dict) -> list[tuple[str, DType, tuple[int, ...], int]]:
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
    blob = _blob_of(fn)
    data_start, header = _safe_header(blob)
    _safe_entries(blob, data_start, header)
    return blob.tensor(0, dtypes.uint8, (len(blob),), "file"), data_start, header


def safe_load(fn: Any) -> dict[str, Tensor]:
    """Tensors of a .safetensors file (path or uint8 Tensor), lazily backed by the file: nothing is read until used."""
    blob = _blob_of(fn)
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
        data = _raw_bytes(t)
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


# ------------------------------------------------------------------ tar and zip archives


def _tar_members(blob: _Blob) -> dict[str, _Blob]:
    """Each regular file's bytes: a lazy sub-range of an uncompressed archive, host bytes of a gzipped one."""
    compressed = blob.read(0, min(len(blob), 2), "magic") == b"\x1f\x8b"
    try:
        with tarfile.open(fileobj=io.BufferedReader(_BlobIO(blob)), mode="r:gz" if compressed else "r:") as tar:
            if not compressed:
                return {m.name: blob.sub(m.offset_data, m.size, m.name) for m in tar if m.isfile()}
            return {
                m.name: _Blob(m.name, memoryview(tar.extractfile(m).read()), _host_device(blob))
                for m in tar
                if m.isfile()
            }  # type: ignore[union-attr]
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ValueError(f"{blob.name}: not a readable tar archive: {e}") from None


def _host_device(blob: _Blob) -> str:
    """Where bytes decoded from this blob go: its own device, or the default one for a file."""
    return Device.DEFAULT if blob.mapping is not None else blob.device


def tar_extract(fn: Any) -> dict[str, Tensor]:
    """Regular files of a tar archive (path or uint8 Tensor) as uint8 Tensors; an uncompressed archive stays lazy."""
    return {name: b.tensor(0, dtypes.uint8, (len(b),), name) for name, b in _tar_members(_blob_of(fn)).items()}


# deflate emits at most 258 bytes per 2 bits, so a member claiming more than this ratio is corrupt (or a bomb)
_DEFLATE_MAX_RATIO = 1032


class _ZipArchive:
    """A zip archive's members, read only when asked for: a stored member is a lazy sub-range of the archive, a
    compressed one is decompressed on demand, in chunks, never past the size its header declares."""

    def __init__(self, blob: _Blob):
        self.blob = blob
        try:
            self.zf = zipfile.ZipFile(io.BufferedReader(_BlobIO(blob)))
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, struct.error) as e:
            raise ValueError(f"{blob.name}: not a readable zip archive: {e}") from None
        self.infos = {info.filename: info for info in self.zf.infolist() if not info.is_dir()}
        self.names = list(self.infos)

    def __enter__(self) -> _ZipArchive:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.zf.close()

    def member(self, name: str, limit: int | None = None) -> _Blob:
        """The member's bytes; a compressed member larger than `limit` is refused before it is decompressed."""
        info, where = self.infos[name], f"{self.blob.name}: member {name!r}"
        if info.compress_type == zipfile.ZIP_STORED:
            local = self.blob.read(info.header_offset, 30, f"local header of {name!r}")
            if local[:4] != b"PK\x03\x04":
                raise ValueError(f"{where}: bad local header signature")
            name_len, extra_len = struct.unpack("<HH", local[26:30])
            if info.compress_size != info.file_size:
                raise ValueError(f"{where} is stored but has {info.compress_size} bytes for {info.file_size}")
            return self.blob.sub(info.header_offset + 30 + name_len + extra_len, info.file_size, name)
        if limit is not None and info.file_size > limit:
            raise ValueError(f"{where} declares {info.file_size} bytes, more than the {limit} it may have")
        if info.compress_type == zipfile.ZIP_DEFLATED and info.file_size > _DEFLATE_MAX_RATIO * info.compress_size + 64:
            raise ValueError(
                f"{where} declares {info.file_size} bytes from {info.compress_size} deflated ones: impossible ratio"
            )
        out = bytearray()
        try:
            with self.zf.open(info) as f:
                while len(out) < info.file_size and (chunk := f.read(min(1 << 20, info.file_size - len(out)))):
                    out += chunk
                if f.read(1):
                    raise ValueError(f"{where} holds more than the {info.file_size} bytes it declares")
        except (zipfile.BadZipFile, EOFError, OSError, NotImplementedError, RuntimeError, zlib.error) as e:
            raise ValueError(f"{where}: cannot decompress: {e}") from None
        if len(out) != info.file_size:
            raise ValueError(f"{where} holds {len(out)} bytes but declares {info.file_size}")
        return _Blob(name, memoryview(bytes(out)), _host_device(self.blob))


def zip_extract(fn: Any) -> dict[str, Tensor]:
    """Files of a zip archive (path or uint8 Tensor) as uint8 Tensors; stored (uncompressed) members stay lazy."""
    with _ZipArchive(_blob_of(fn)) as archive:
        blobs = {name: archive.member(name) for name in archive.names}
    return {name: b.tensor(0, dtypes.uint8, (len(b),), name) for name, b in blobs.items()}


# ------------------------------------------------------------------ PyTorch checkpoints (no torch import)

_TORCH_DTYPES: dict[str, DType] = {
    "float64": dtypes.float64,
    "double": dtypes.float64,
    "float32": dtypes.float32,
    "float": dtypes.float32,
    "float16": dtypes.float16,
    "half": dtypes.float16,
    "bfloat16": dtypes.bfloat16,
    "int64": dtypes.int64,
    "long": dtypes.int64,
    "int32": dtypes.int32,
    "int": dtypes.int32,
    "int16": dtypes.int16,
    "short": dtypes.int16,
    "int8": dtypes.int8,
    "uint8": dtypes.uint8,
    "uint16": dtypes.uint16,
    "uint32": dtypes.uint32,
    "uint64": dtypes.uint64,
    "bool": dtypes.bool,
    "float8_e4m3fn": dtypes.fp8e4m3,
    "float8_e5m2": dtypes.fp8e5m2,
    "float8_e4m3fnuz": dtypes.fp8e4m3fnuz,
    "float8_e5m2fnuz": dtypes.fp8e5m2fnuz,
}
_TORCH_STORAGES: dict[str, DType] = {
    "DoubleStorage": dtypes.float64,
    "FloatStorage": dtypes.float32,
    "HalfStorage": dtypes.float16,
    "BFloat16Storage": dtypes.bfloat16,
    "LongStorage": dtypes.int64,
    "IntStorage": dtypes.int32,
    "ShortStorage": dtypes.int16,
    "CharStorage": dtypes.int8,
    "ByteStorage": dtypes.uint8,
    "BoolStorage": dtypes.bool,
    "UntypedStorage": dtypes.uint8,
}
_TORCH_MAGIC, _TORCH_PROTOCOL = 0x1950A86A20F9469CFC6C, 1001


class _Storage:
    """A torch storage: `blob` holds its bytes (None while only its dtype is known)."""

    def __init__(self, dtype: DType, blob: _Blob | None):
        self.dtype, self.blob = dtype, blob


class _StorageType:
    def __init__(self, dtype: DType):
        self.dtype = dtype


# a view that reads its stored elements this many times over (overlapping strides) is not a state dict's tensor
_MAX_GATHER_RATIO = 64


def _strided(storage: Any, offset: Any, size: Any, stride: Any, name: str, dtype: DType | None = None) -> Tensor | None:
    """The tensor torch describes as (storage, element offset, size, stride): lazy on DISK when contiguous."""
    if storage is None or not isinstance(storage, _Storage):
        raise ValueError(f"{name}: a tensor is rebuilt from a {type(storage).__name__}, not a storage")
    if storage.blob is None:
        return None
    blob, dt = storage.blob, dtype or storage.dtype
    if (
        not isinstance(size, (tuple, list))
        or not isinstance(stride, (tuple, list))
        or len(size) != len(stride)
        or len(size) > MAX_RANK
        or not all(type(x) is int for x in (offset, *size, *stride))
        or offset < 0
        or min(size, default=0) < 0
        or min(stride, default=0) < 0
        or prod(max(s, 1) for s in size) >= 1 << 62
    ):
        raise ValueError(f"{name}: invalid tensor geometry: size {size!r}, stride {stride!r}, offset {offset!r}")
    size, stride = tuple(size), tuple(stride)
    n = prod(size)
    if n == 0:
        return Tensor.empty(size, dtype=dt, device=_host_device(blob))
    reach = offset + sum((s - 1) * st for s, st in zip(size, stride))
    if (reach + 1) * dt.itemsize > len(blob):
        raise ValueError(
            f"{name}: tensor of shape {size}, strides {stride}, offset {offset} reaches past its storage "
            f"of {len(blob) // dt.itemsize} {dt} elements"
        )
    # dims of size 1 and broadcast (stride 0) dims read no new memory; the rest must tile a dense block, in some order
    real = sorted((i for i, (s, st) in enumerate(zip(size, stride)) if s > 1 and st > 0), key=lambda i: -stride[i])
    if all(stride[i] == prod(size[j] for j in real[k + 1 :]) for k, i in enumerate(real)):
        block = blob.tensor(offset * dt.itemsize, dt, tuple(size[i] for i in real), "tensor")
        if real == sorted(real) and all(st > 0 or s == 1 for s, st in zip(size, stride)):
            return block.reshape(size)
        # a permuted (e.g. transposed) or broadcast view of a dense block: materialized on a compute device
        block = block.to(_host_device(blob)).permute(sorted(range(len(real)), key=lambda k: real[k]))
        return block.reshape(tuple(s if i in real else 1 for i, s in enumerate(size))).expand(size)
    # an overlapping or gapped view: gather the elements on the host (broadcast dims stay lazy)
    gathered = tuple(1 if st == 0 else s for s, st in zip(size, stride))
    if prod(gathered) > _MAX_GATHER_RATIO * (reach - offset + 1):
        raise ValueError(
            f"{name}: tensor of shape {size}, strides {stride} repeats its {reach - offset + 1} stored elements "
            f"more than {_MAX_GATHER_RATIO} times over: refusing to materialize {prod(gathered)} elements"
        )
    blob.check(offset * dt.itemsize, (reach - offset + 1) * dt.itemsize, "tensor")
    span = np.frombuffer(blob.mem, to_numpy_dtype(dt), count=reach - offset + 1, offset=offset * dt.itemsize)
    strided = np.lib.stride_tricks.as_strided(span, gathered, tuple(st * span.itemsize for st in stride))
    device = _host_device(blob)
    host = Buffer(device, prod(gathered), dt, initial=np.ascontiguousarray(strided))
    return Tensor(buffer_uop(host), device=device).reshape(gathered).expand(size)


class _TorchUnpickler(RestrictedUnpickler):
    """The restricted unpickler plus torch's tensor rebuild functions, storage types and dtypes; `storage` turns a
    persistent id into the storage it names."""

    def __init__(self, source: PickleSource, storage: Callable[[Any], Any]):
        name = source.name

        def rebuild(st: Any, offset: Any, size: Any, stride: Any, *_: Any) -> Tensor | None:
            return _strided(st, offset, size, stride, name)

        def rebuild_v3(st, offset, size, stride, requires_grad=False, hooks=None, dtype=None, metadata=None):
            if not isinstance(dtype, DType):
                raise ValueError(f"{name}: _rebuild_tensor_v3 got dtype {dtype!r}, not a torch dtype")
            return _strided(st, offset, size, stride, name, dtype)

        def parameter(data: Any, *_: Any) -> Any:
            if data is not None and not isinstance(data, Tensor):
                raise ValueError(f"{name}: a parameter holds a {type(data).__name__}, not a tensor")
            return data

        torch_globals: dict[tuple[str, str], Any] = {
            ("torch._utils", "_rebuild_tensor_v2"): rebuild,
            ("torch._utils", "_rebuild_tensor"): rebuild,
            ("torch._utils", "_rebuild_tensor_v3"): rebuild_v3,
            ("torch._utils", "_rebuild_parameter"): parameter,
            ("torch._utils", "_rebuild_parameter_with_state"): parameter,
            **{("torch", k): _StorageType(v) for k, v in _TORCH_STORAGES.items()},
            ("torch.storage", "UntypedStorage"): _StorageType(dtypes.uint8),
            **{("torch", k): v for k, v in _TORCH_DTYPES.items()},
        }
        super().__init__(source, name, torch_globals)
        self.storage = storage

    def find_class(self, module: str, name: str) -> Any:
        # legacy tensor type names (torch.FloatTensor, ...) only label records of the tar format
        return name if module == "torch" and name.endswith("Tensor") else super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        return self.storage(pid)


_RestrictedUnpickler = RestrictedUnpickler  # the name nn.datasets imports (CIFAR's Python 2 pickles)


def _storage_dtype(storage_type: Any, blob: _Blob) -> DType:
    if isinstance(storage_type, _StorageType):
        return storage_type.dtype
    raise ValueError(f"{blob.name}: unknown storage type {storage_type!r}")


def _storage_pid(pid: Any, blob: _Blob) -> tuple[DType, str]:
    """(dtype, key) of a ('storage', storage type, key, location, numel[, view]) persistent id."""
    if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage" and isinstance(pid[2], (str, int))):
        raise ValueError(f"{blob.name}: unknown persistent id {pid!r}")
    return _storage_dtype(pid[1], blob), str(pid[2])


def _torch_zip(blob: _Blob) -> Any:
    with _ZipArchive(blob) as archive:
        if odd := [
            n for n, i in archive.infos.items() if i.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
        ]:
            raise ValueError(
                f"{blob.name}: members {odd[:4]} use a compression torch never writes (only stored/deflate)"
            )
        pkl = next((n for n in archive.names if n == "data.pkl" or n.endswith("/data.pkl")), None)
        if pkl is None:
            raise ValueError(
                f"{blob.name}: zip archive without a data.pkl: not a PyTorch checkpoint "
                f"(members {sorted(archive.names)[:8]})"
            )
        prefix = pkl[: -len("data.pkl")]
        if prefix + "byteorder" in archive.names:
            order = archive.member(prefix + "byteorder", limit=16)
            if (order_bytes := order.read(0, min(len(order), 16), "byteorder")) != b"little":
                raise ValueError(f"{blob.name}: byte order {order_bytes!r} is not supported (only little-endian)")
        storages: dict[str, _Storage] = {}

        def storage(pid: Any) -> _Storage:
            dt, key = _storage_pid(pid, blob)
            if key not in storages:
                if (member := f"{prefix}data/{key}") not in archive.names:
                    raise ValueError(f"{blob.name}: storage {key!r} is missing from the archive")
                storages[key] = _Storage(dt, archive.member(member))
            return _Storage(dt, storages[key].blob)

        data = archive.member(pkl)
        return _TorchUnpickler(PickleSource(data, blob.name), storage).load()


def _torch_legacy(blob: _Blob) -> Any:
    """Pre-1.6 format: pickles of magic, protocol, sys_info, the object, the storage keys, then each storage's data."""
    src = PickleSource(blob, blob.name)
    if RestrictedUnpickler(src, blob.name).load() != _TORCH_MAGIC:
        raise ValueError(f"{blob.name}: not a PyTorch file (bad magic number)")
    if (proto := RestrictedUnpickler(src, blob.name).load()) != _TORCH_PROTOCOL:
        raise ValueError(f"{blob.name}: unsupported protocol {proto!r}")
    if not isinstance(sys_info := RestrictedUnpickler(src, blob.name).load(), dict):
        raise ValueError(f"{blob.name}: sys_info is a {type(sys_info).__name__}, not a dict")
    if not sys_info.get("little_endian", True):
        raise ValueError(f"{blob.name}: big-endian files are not supported")
    start, dtypes_of = src.pos, {}

    def record(pid: Any) -> _Storage:  # first pass: learn each storage's dtype, which sizes its data block
        dt, key = _storage_pid(pid, blob)
        dtypes_of[key] = dt
        return _Storage(dt, None)

    _TorchUnpickler(src, record).load()
    keys = RestrictedUnpickler(src, blob.name).load()
    if not isinstance(keys, list):
        raise ValueError(f"{blob.name}: the storage keys are a {type(keys).__name__}, not a list")
    roots, pos = {}, src.pos
    for key in map(str, keys):
        numel = struct.unpack("<q", blob.read(pos, 8, f"size of storage {key!r}"))[0]
        if (dt := dtypes_of.get(key)) is None:
            raise ValueError(f"{blob.name}: storage {key!r} is not used by the pickled object")
        roots[key] = _Storage(dt, blob.sub(pos + 8, numel * dt.itemsize, f"storage {key!r}"))
        pos += 8 + numel * dt.itemsize

    def storage(pid: Any) -> _Storage:
        dt, key = _storage_pid(pid, blob)
        if (root := roots.get(key)) is None or root.blob is None:
            raise ValueError(f"{blob.name}: storage {key!r} has no data")
        if len(pid) > 5 and pid[5] is not None:  # a view: (view key, element offset, element count) of the root storage
            if not (isinstance(pid[5], tuple) and len(pid[5]) == 3):
                raise ValueError(f"{blob.name}: storage view {pid[5]!r} is not (key, offset, count)")
            _, view_offset, view_size = (_checked_int(v, "storage view", blob) for v in pid[5])
            isz = root.dtype.itemsize
            return _Storage(root.dtype, root.blob.sub(view_offset * isz, view_size * isz, f"view of storage {key!r}"))
        return root

    return _TorchUnpickler(PickleSource(blob, blob.name, start), storage).load()


def _checked_int(x: Any, what: str, blob: _Blob, limit: int = 1 << 62) -> int:
    if type(x) is not int or not 0 <= x < limit:
        raise ValueError(f"{blob.name}: {what} has value {x!r}, not an int in [0, {limit})")
    return x


def _torch_tar(blob: _Blob) -> Any:
    """The oldest format: a tar of 'storages' (pickled headers and raw data), 'tensors' (shape records) and 'pickle'."""
    members = _tar_members(blob)
    if missing := {"storages", "tensors", "pickle"} - set(members):
        raise ValueError(f"{blob.name}: tar checkpoint lacks {sorted(missing)}")
    objects: dict[str, Any] = {}
    sblob = members["storages"]
    src = PickleSource(sblob, blob.name)
    for _ in range(_checked_int(RestrictedUnpickler(src, blob.name).load(), "storage count", blob)):
        key, _, storage_type = _TorchUnpickler(src, lambda pid: None).load()
        dt = _storage_dtype(storage_type, blob)
        numel = struct.unpack("<q", sblob.read(src.pos, 8, f"size of storage {key!r}"))[0]
        objects[str(key)] = _Storage(dt, sblob.sub(src.pos + 8, numel * dt.itemsize, f"storage {key!r}"))
        src.pos += 8 + numel * dt.itemsize
    for target, root, offset, numel in RestrictedUnpickler(src, blob.name).load():
        if not isinstance(r := objects.get(str(root)), _Storage) or r.blob is None:
            raise ValueError(f"{blob.name}: storage view {target!r} of unknown storage {root!r}")
        isz = r.dtype.itemsize
        offset, numel = _checked_int(offset, "view offset", blob), _checked_int(numel, "view size", blob)
        objects[str(target)] = _Storage(r.dtype, r.blob.sub(offset * isz, numel * isz, f"view {target!r}"))
    tblob = members["tensors"]
    src = PickleSource(tblob, blob.name)
    for _ in range(_checked_int(RestrictedUnpickler(src, blob.name).load(), "tensor count", blob)):
        key, storage_id, _ = _TorchUnpickler(src, lambda pid: None).load()
        ndim = struct.unpack("<i", tblob.read(src.pos, 4, f"rank of tensor {key!r}"))[0]
        _checked_int(ndim, f"rank of tensor {key!r}", blob, MAX_RANK + 1)
        # the rank is followed by 4 bytes of padding, then sizes, strides and the storage offset as int64
        vals = struct.unpack(
            f"<{2 * ndim + 1}q", tblob.read(src.pos + 8, 8 * (2 * ndim + 1), f"shape of tensor {key!r}")
        )
        if not isinstance(st := objects.get(str(storage_id)), _Storage):
            raise ValueError(f"{blob.name}: tensor {key!r} uses unknown storage {storage_id!r}")
        objects[str(key)] = _strided(st, vals[-1], vals[:ndim], vals[ndim : 2 * ndim], blob.name)
        src.pos += 8 + 8 * (2 * ndim + 1)

    def persistent(pid: Any) -> Any:
        if isinstance(pid, tuple) and pid:
            return pid[0]  # a ('module', source...) record: the object itself
        if str(pid) not in objects:
            raise ValueError(f"{blob.name}: the pickle refers to unknown tensor {pid!r}")
        return objects[str(pid)]

    return _TorchUnpickler(PickleSource(members["pickle"], blob.name), persistent).load()


def torch_load(fn: Any) -> Any:
    """The object in a PyTorch .pt/.pth file (zip, legacy tar or legacy pickle format) with tensors as Tensors, without
    importing torch. Only tensors, plain containers and numpy values of plain numeric dtypes are unpickled (as strict
    as torch's weights_only=True); contiguous tensors stay on DISK. Any malformed file raises ValueError naming it."""
    blob = _blob_of(fn)
    head = blob.read(0, min(len(blob), 512), "header")
    try:
        if head[:4] == b"PK\x03\x04":
            return _torch_zip(blob)
        if len(head) >= 262 and head[257:262] == b"ustar":
            return _torch_tar(blob)
        return _torch_legacy(blob)
    except Exception as e:  # whatever a crafted file makes fail, the caller gets one clean exception type
        if isinstance(e, ValueError) and str(e).startswith(blob.name):
            raise
        if str(e).startswith(blob.name):
            raise ValueError(str(e)) from e
        raise ValueError(f"{blob.name}: corrupt checkpoint ({type(e).__name__}): {e}") from e


# ------------------------------------------------------------------ GGUF (llama.cpp)


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
        return _blob_of(t.reshape(-1)).tensor(0, GGML_PLAIN_TYPES[ggml_type], (n,), name)
    if ggml_type not in DEQUANTIZERS:
        raise NotImplementedError(
            f"ggml type {name} ({ggml_type}) is not supported; supported: "
            f"{sorted(GGML_TYPES[k][0] for k in (*GGML_PLAIN_TYPES, *DEQUANTIZERS))}"
        )
    if t.device.startswith("DISK:"):
        t = t.to(Device.DEFAULT)
    return DEQUANTIZERS[ggml_type](t.reshape(-1)[:nbytes].reshape(n // block, block_bytes)).reshape(n)


class _Reader:
    """Little-endian values at a moving position; reading past the end names the file, the offset and the size."""

    def __init__(self, blob: _Blob):
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
    blob = _blob_of(fn)
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


__all__ = [
    "GGMLQuantized",
    "TensorIO",
    "get_parameters",
    "get_state_dict",
    "ggml_data_to_tensor",
    "gguf_load",
    "load_state_dict",
    "safe_load",
    "safe_load_metadata",
    "safe_save",
    "tar_extract",
    "torch_load",
    "zip_extract",
]
