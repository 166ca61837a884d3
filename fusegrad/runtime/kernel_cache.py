"""Compiled kernels on disk, each binary next to its content hash; shared by every device that compiles."""

from __future__ import annotations
import hashlib
import os
import tempfile
import warnings
from fusegrad.helpers import Hooks, cache_dir


def _sha256_file(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class KernelCache:
    """Binaries under cache_dir()/<subdir>, each `<key><suffix>` next to `<key>.sha256` (its content hash). A file
    whose hash does not match (truncated, zero bytes, garbage) is never loaded: it is deleted and compiled again. When
    the cache directory cannot be written, a temporary directory takes its place for the rest of the process, with one
    warning."""

    def __init__(self, subdir: str = "cpu", suffix: str = ".so"):
        self.subdir, self.suffix = subdir, suffix
        self.fallback: str | None = None

    def home(self) -> str:
        return os.path.join(cache_dir(), self.subdir)

    def dirs(self) -> list[str]:
        return [self.home()] + ([self.fallback] if self.fallback else [])

    def lookup(self, key: str) -> str | None:
        for d in self.dirs():
            path = os.path.join(d, f"{key}{self.suffix}")
            if not os.path.exists(path):
                continue
            try:
                with open(os.path.join(d, f"{key}.sha256")) as f:
                    expected = f.read().strip()
                if _sha256_file(path) == expected:
                    if (hook := Hooks.trace) is not None:
                        hook.cache_lookup(True)
                    return path
            except OSError:
                pass  # no or unreadable checksum: the binary is not trusted
            self.evict(path)
        if (hook := Hooks.trace) is not None:
            hook.cache_lookup(False)
        return None

    def evict(self, path: str) -> None:
        for p in (path, path[: -len(self.suffix)] + ".sha256"):
            try:
                os.unlink(p)
            except OSError:
                pass  # a read-only cache keeps the bad file; lookup then skips it and the fallback holds the good one

    def store(self, key: str, built: str) -> str:
        """Store the file at `built` under `key`; returns the cached path."""
        with open(built, "rb") as f:
            return self.store_bytes(key, f.read())

    def store_bytes(self, key: str, data: bytes) -> str:
        try:
            return self._store_in(self.home(), key, data)
        except OSError as e:
            if self.fallback is None:
                self.fallback = tempfile.mkdtemp(prefix="fusegrad-kernels-")
                warnings.warn(
                    f"kernel cache {self.home()} is not writable ({e.strerror or e}); "
                    f"compiled kernels go to {self.fallback} for this process",
                    stacklevel=3,
                )
            return self._store_in(self.fallback, key, data)

    def store_if_writable(self, key: str, data: bytes) -> bool:
        """Store data under key in the cache directory; False (and no warning, no fallback) when it cannot be written:
        for small records that are only worth keeping, not binaries."""
        try:
            self._store_in(self.home(), key, data)
            return True
        except OSError:
            return False

    def _store_in(self, directory: str, key: str, data: bytes) -> str:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"{key}{self.suffix}")
        # checksum first: whoever sees the new binary also sees its checksum (each file is renamed into place whole)
        _write_atomic(os.path.join(directory, f"{key}.sha256"), hashlib.sha256(data).hexdigest().encode())
        _write_atomic(path, data)
        return path


def _write_atomic(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
