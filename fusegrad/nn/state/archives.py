"""tar and zip archives read member by member, without extracting them."""

from __future__ import annotations

import io
import struct
import tarfile
import zipfile
import zlib
from typing import Any

from fusegrad.dtype import dtypes
from fusegrad.runtime.buffers import default_device
from fusegrad.tensor import Tensor
from fusegrad.nn.state.blob import Blob, BlobIO, blob_of


def tar_members(blob: Blob) -> dict[str, Blob]:
    """Each regular file's bytes: a lazy sub-range of an uncompressed archive, host bytes of a gzipped one."""
    compressed = blob.read(0, min(len(blob), 2), "magic") == b"\x1f\x8b"
    try:
        with tarfile.open(fileobj=io.BufferedReader(BlobIO(blob)), mode="r:gz" if compressed else "r:") as tar:
            if not compressed:
                return {m.name: blob.sub(m.offset_data, m.size, m.name) for m in tar if m.isfile()}
            return {
                m.name: Blob(m.name, memoryview(tar.extractfile(m).read()), host_device(blob))
                for m in tar
                if m.isfile()
            }  # type: ignore[union-attr]
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ValueError(f"{blob.name}: not a readable tar archive: {e}") from None


def host_device(blob: Blob) -> str:
    """Where bytes decoded from this blob go: its own device, or the default one for a file."""
    return default_device() if blob.mapping is not None else blob.device


def tar_extract(fn: Any) -> dict[str, Tensor]:
    """Regular files of a tar archive (path or uint8 Tensor) as uint8 Tensors; an uncompressed archive stays lazy."""
    return {name: b.tensor(0, dtypes.uint8, (len(b),), name) for name, b in tar_members(blob_of(fn)).items()}


# deflate emits at most 258 bytes per 2 bits, so a member claiming more than this ratio is corrupt (or a bomb)
_DEFLATE_MAX_RATIO = 1032


class ZipArchive:
    """A zip archive's members, read only when asked for: a stored member is a lazy sub-range of the archive, a
    compressed one is decompressed on demand, in chunks, never past the size its header declares."""

    def __init__(self, blob: Blob):
        self.blob = blob
        try:
            self.zf = zipfile.ZipFile(io.BufferedReader(BlobIO(blob)))
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, struct.error) as e:
            raise ValueError(f"{blob.name}: not a readable zip archive: {e}") from None
        self.infos = {info.filename: info for info in self.zf.infolist() if not info.is_dir()}
        self.names = list(self.infos)

    def __enter__(self) -> ZipArchive:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.zf.close()

    def member(self, name: str, limit: int | None = None) -> Blob:
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
        return Blob(name, memoryview(bytes(out)), host_device(self.blob))


def zip_extract(fn: Any) -> dict[str, Tensor]:
    """Files of a zip archive (path or uint8 Tensor) as uint8 Tensors; stored (uncompressed) members stay lazy."""
    with ZipArchive(blob_of(fn)) as archive:
        blobs = {name: archive.member(name) for name in archive.names}
    return {name: b.tensor(0, dtypes.uint8, (len(b),), name) for name, b in blobs.items()}
