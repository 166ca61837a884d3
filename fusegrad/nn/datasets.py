"""Datasets (docs/api.md): MNIST / Fashion-MNIST and CIFAR-10 downloaded once into the cache and checked by sha256,
and scikit-learn's bundled 8x8 digits, read offline. Images come back as uint8 (N, C, H, W), labels as uint8 (N,)."""

from __future__ import annotations

import gzip
import importlib.util
import io
import os
import pickle
import tarfile

import numpy as np

from fusegrad.helpers import fetch
from fusegrad.nn.safe_pickle import RestrictedUnpickler
from fusegrad.tensor import Tensor

MNIST_URL = "https://storage.googleapis.com/cvdf-datasets/mnist/"
FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
# sha256 of each file as published, in MNIST_FILES order
MNIST_SHA256 = (
    "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
)
FASHION_MNIST_SHA256 = (
    "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
    "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
    "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
    "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
)
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR_SHA256 = "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce"

# IDX element type codes (the third magic byte); values are big-endian
_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.int16, 0x0C: np.int32, 0x0D: np.float32, 0x0E: np.float64}


def parse_idx(data: bytes, name: str = "<idx>") -> np.ndarray:
    """An IDX array (the MNIST file format): magic 0 0 <type> <rank>, rank big-endian uint32 sizes, then the values."""
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] not in _IDX_TYPES:
        raise ValueError(
            f"{name}: not an IDX file: magic {data[:4].hex()}, expected 0000<type><rank> with type in "
            f"{sorted(hex(t) for t in _IDX_TYPES)}"
        )
    rank = data[3]
    if len(data) < 4 + 4 * rank:
        raise ValueError(f"{name}: truncated IDX header: {len(data)} bytes for rank {rank}")
    shape = tuple(int(d) for d in np.frombuffer(data, ">u4", count=rank, offset=4))
    dt = np.dtype(_IDX_TYPES[data[2]]).newbyteorder(">")
    if (need := 4 + 4 * rank + int(np.prod(shape)) * dt.itemsize) != len(data):
        raise ValueError(f"{name}: IDX file of shape {shape} and type {dt} needs {need} bytes, has {len(data)}")
    return np.frombuffer(data, dt, offset=4 + 4 * rank).astype(dt.newbyteorder("="), copy=False).reshape(shape)


def _gunzip(path: os.PathLike) -> bytes:
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except (OSError, EOFError) as e:
        raise ValueError(f"{path}: corrupt gzip file: {e}") from None


def mnist(device: str | None = None, fashion: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(X_train (60000, 1, 28, 28), Y_train (60000,), X_test (10000, 1, 28, 28), Y_test (10000,)), all uint8."""
    base, hashes = (FASHION_MNIST_URL, FASHION_MNIST_SHA256) if fashion else (MNIST_URL, MNIST_SHA256)
    arrays = []
    for fname, sha in zip(MNIST_FILES, hashes):
        path = fetch(base + fname, name=fname, subdir="fashion-mnist" if fashion else "mnist", sha256=sha)
        arr = parse_idx(_gunzip(path), str(path))
        if arr.dtype != np.uint8:
            raise ValueError(f"{path}: expected uint8 values, the file holds {arr.dtype}")
        arrays.append(arr.reshape(-1, 1, 28, 28) if "images" in fname else arr.reshape(-1))
    return tuple(Tensor(a, device=device) for a in arrays)  # type: ignore[return-value]


def _cifar_batch(raw: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    # Python 2 pickles of dicts, lists and numpy arrays: nothing else may be constructed
    try:
        batch = RestrictedUnpickler(io.BytesIO(raw), name, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError) as e:
        raise ValueError(f"{name}: corrupt CIFAR batch: {e}") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise ValueError(f"{name}: a CIFAR batch is a dict with b'data' and b'labels', got {type(batch).__name__}")
    data, labels = np.asarray(batch[b"data"], np.uint8), np.asarray(batch[b"labels"], np.uint8)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(labels) != len(data):
        raise ValueError(
            f"{name}: data of shape {data.shape} and {len(labels)} labels; expected (N, 3072) and N labels"
        )
    return data.reshape(-1, 3, 32, 32), labels


def cifar(device: str | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """CIFAR-10: (X_train (50000, 3, 32, 32), Y_train (50000,), X_test (10000, 3, 32, 32), Y_test (10000,)),
    all uint8."""
    path = fetch(CIFAR_URL, name="cifar-10-python.tar.gz", subdir="cifar", sha256=CIFAR_SHA256)
    names = [f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)] + ["cifar-10-batches-py/test_batch"]
    try:
        with tarfile.open(path, "r:gz") as tar:
            batches = {n: _cifar_batch(tar.extractfile(n).read(), f"{path}:{n}") for n in names}  # type: ignore[union-attr]
    except KeyError as e:
        raise ValueError(f"{path}: archive lacks {e}") from None
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ValueError(f"{path}: corrupt archive: {e}") from None
    train = [batches[n] for n in names[:5]]
    x_train, y_train = np.concatenate([b[0] for b in train]), np.concatenate([b[1] for b in train])
    x_test, y_test = batches[names[5]]
    return tuple(Tensor(a, device=device) for a in (x_train, y_train, x_test, y_test))  # type: ignore[return-value]


def digits_path() -> str:
    """scikit-learn ships the digits as datasets/data/digits.csv.gz; found without importing sklearn (and scipy)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            "the digits dataset is read from scikit-learn's bundled copy: pip install scikit-learn"
        )
    return os.path.join(os.path.dirname(spec.origin), "datasets", "data", "digits.csv.gz")


def digits(device: str | None = None, path: str | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The 1797 8x8 digits (pixel values 0-16) as (X_train (1438, 1, 8, 8), Y_train, X_test (359, 1, 8, 8), Y_test),
    uint8. Every fifth sample is a test sample: a fixed split that spreads both sets over all the writers."""
    path = path or digits_path()
    try:
        with gzip.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",", ndmin=2)
    except (OSError, EOFError, ValueError) as e:
        raise ValueError(f"{path}: cannot read the digits table: {e}") from None
    if table.shape[1] != 65 or not ((0 <= table) & (table <= 16)).all():
        raise ValueError(f"{path}: expected rows of 64 pixels in 0..16 and a label, got a table of shape {table.shape}")
    x, y = table[:, :64].astype(np.uint8).reshape(-1, 1, 8, 8), table[:, 64].astype(np.uint8)
    test = np.arange(len(table)) % 5 == 4
    return tuple(Tensor(a, device=device) for a in (x[~test], y[~test], x[test], y[test]))  # type: ignore[return-value]


__all__ = ["cifar", "digits", "mnist", "parse_idx"]
