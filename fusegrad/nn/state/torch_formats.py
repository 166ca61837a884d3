"""PyTorch checkpoints (zip, legacy and tar formats) read without importing torch, through the safe unpickler."""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np

from fusegrad.dtype import DType, dtypes, to_numpy_dtype
from fusegrad.helpers import prod
from fusegrad.nn.safe_pickle import MAX_RANK, PickleSource, RestrictedUnpickler
from fusegrad.runtime.buffers import Buffer, buffer_uop
from fusegrad.tensor import Tensor
from fusegrad.nn.state.archives import ZipArchive, host_device, tar_members
from fusegrad.nn.state.blob import Blob, blob_of

TORCH_DTYPES: dict[str, DType] = {
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

    def __init__(self, dtype: DType, blob: Blob | None):
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
        return Tensor.empty(size, dtype=dt, device=host_device(blob))
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
        block = block.to(host_device(blob)).permute(sorted(range(len(real)), key=lambda k: real[k]))
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
    device = host_device(blob)
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
            **{("torch", k): v for k, v in TORCH_DTYPES.items()},
        }
        super().__init__(source, name, torch_globals)
        self.storage = storage

    def find_class(self, module: str, name: str) -> Any:
        # legacy tensor type names (torch.FloatTensor, ...) only label records of the tar format
        return name if module == "torch" and name.endswith("Tensor") else super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        return self.storage(pid)


def _storage_dtype(storage_type: Any, blob: Blob) -> DType:
    if isinstance(storage_type, _StorageType):
        return storage_type.dtype
    raise ValueError(f"{blob.name}: unknown storage type {storage_type!r}")


def _storage_pid(pid: Any, blob: Blob) -> tuple[DType, str]:
    """(dtype, key) of a ('storage', storage type, key, location, numel[, view]) persistent id."""
    if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage" and isinstance(pid[2], (str, int))):
        raise ValueError(f"{blob.name}: unknown persistent id {pid!r}")
    return _storage_dtype(pid[1], blob), str(pid[2])


def _torch_zip(blob: Blob) -> Any:
    with ZipArchive(blob) as archive:
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


def _torch_legacy(blob: Blob) -> Any:
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


def _checked_int(x: Any, what: str, blob: Blob, limit: int = 1 << 62) -> int:
    if type(x) is not int or not 0 <= x < limit:
        raise ValueError(f"{blob.name}: {what} has value {x!r}, not an int in [0, {limit})")
    return x


def _torch_tar(blob: Blob) -> Any:
    """The oldest format: a tar of 'storages' (pickled headers and raw data), 'tensors' (shape records) and 'pickle'."""
    members = tar_members(blob)
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
    blob = blob_of(fn)
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
