"""nn.datasets (docs/api.md) and helpers.fetch, offline: downloads come from file:// URLs of files the tests write, the
cache lives in a temporary directory, and the network case is a refused connection to the loopback address."""

import gzip
import hashlib
import io
import pickle
import shutil
import tarfile

import numpy as np
import pytest
from fusegrad import Context, dtypes
from fusegrad.helpers import fetch
from fusegrad.nn import datasets
from fusegrad.nn.datasets import cifar, digits, mnist, parse_idx


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "fusegrad" / "downloads"


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def idx_bytes(arr: np.ndarray) -> bytes:
    code = {np.uint8: 8, np.int8: 9, np.int16: 11, np.int32: 12, np.float32: 13, np.float64: 14}[arr.dtype.type]
    return (
        bytes([0, 0, code, arr.ndim])
        + np.array(arr.shape, ">u4").tobytes()
        + arr.astype(arr.dtype.newbyteorder(">")).tobytes()
    )


# ------------------------------------------------------------------ fetch


def test_fetch_downloads_checks_and_caches(tmp_path, cache, capsys):
    src = tmp_path / "data.bin.gz"
    src.write_bytes(gzip.compress(bytes(range(256)) * 1000))
    assert fetch(str(tmp_path / "x")) == tmp_path / "x" and str(fetch("./rel/x")) == "rel/x"  # local paths as they are
    p = fetch(src.as_uri(), gunzip=True, sha256=sha(src).upper())
    assert p.parent == cache and p.read_bytes() == bytes(range(256)) * 1000
    err = capsys.readouterr().err
    assert "100%" in err and "[" + "#" * 30 + "]" in err  # the progress bar reached the end
    named = fetch(src.as_uri(), name="copy.gz", subdir="sub")
    assert named == cache / "sub" / "copy.gz" and named.read_bytes() == src.read_bytes()
    src.unlink()  # cached: no download needed any more
    assert fetch(src.as_uri(), name="copy.gz", subdir="sub") == named
    with (
        Context(DISABLE_HTTP_CACHE=1),
        pytest.raises(ConnectionError, match=r"cannot download file:.*data.bin.gz.*put the file at"),
    ):
        fetch(src.as_uri(), name="copy.gz", subdir="sub")
    with pytest.raises(ConnectionError, match="cannot download"):
        fetch(src.as_uri(), name="copy.gz", subdir="sub", allow_caching=False)
    dest = tmp_path / "explicit.bin"
    (tmp_path / "d.bin").write_bytes(b"abc")
    assert fetch((tmp_path / "d.bin").as_uri(), name=dest) == dest and dest.read_bytes() == b"abc"


def test_fetch_rejects_bad_downloads(tmp_path, cache):
    src = tmp_path / "f.bin"
    src.write_bytes(b"payload")
    with pytest.raises(ValueError, match=r"f.bin has sha256 [0-9a-f]{64}, expected 00ff"):
        fetch(src.as_uri(), name="f", sha256="00FF")
    assert not (cache / "f").exists() and list(cache.iterdir()) == []  # nothing unverified or partial is cached
    with pytest.raises(ConnectionError, match=r"cannot download http://127.0.0.1:9/x: .*refused"):
        fetch("http://127.0.0.1:9/x")
    with pytest.raises(ConnectionError, match="Errno"):
        fetch((tmp_path / "missing").as_uri())


def test_fetch_extract(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"inside")
    with tarfile.open(tmp_path / "arc.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "a.txt", arcname="top/a.txt")
    out = fetch((tmp_path / "arc.tar.gz").as_uri(), name="arc.tar.gz", extract=True)
    assert out.is_dir() and (out / "top" / "a.txt").read_bytes() == b"inside"
    assert fetch((tmp_path / "arc.tar.gz").as_uri(), name="arc.tar.gz", extract=True) == out
    with pytest.raises(ValueError, match="neither a tar nor a zip"):
        fetch((tmp_path / "a.txt").as_uri(), name="a.txt", extract=True)


# ------------------------------------------------------------------ IDX and MNIST


@pytest.mark.parametrize("dt", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
def test_parse_idx_types(dt):
    arr = (np.arange(24) - 5).astype(dt).reshape(2, 3, 4)
    out = parse_idx(idx_bytes(arr))
    assert out.dtype == np.dtype(dt) and out.dtype.isnative and out.shape == (2, 3, 4)
    np.testing.assert_array_equal(out, arr)


@pytest.mark.parametrize(
    "data, match",
    [
        (b"\x00\x00\x08", r"f.idx: not an IDX file: magic 000008"),
        (b"\x01\x00\x08\x01" + b"\0" * 8, r"not an IDX file: magic 01000801"),
        (b"\x00\x00\x07\x01" + b"\0" * 8, r"not an IDX file: magic 00000701"),
        (b"\x00\x00\x08\x03\x00\x00", r"truncated IDX header: 6 bytes for rank 3"),
        (b"\x00\x00\x0c\x01\x00\x00\x00\x03" + b"\0" * 8, r"shape \(3,\) and type >i4 needs 20 bytes, has 16"),
    ],
)
def test_parse_idx_bad(data, match):
    with pytest.raises(ValueError, match=match):
        parse_idx(data, "f.idx")


def write_mnist(folder, n_train=5, n_test=3, seed=0):
    """Four small IDX gz files named like MNIST's; returns the arrays and their sha256s."""
    rng = np.random.default_rng(seed)
    arrays = [
        rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        rng.integers(0, 10, n_train, dtype=np.uint8),
        rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        rng.integers(0, 10, n_test, dtype=np.uint8),
    ]
    folder.mkdir(parents=True, exist_ok=True)
    for name, arr in zip(datasets.MNIST_FILES, arrays):
        (folder / name).write_bytes(gzip.compress(idx_bytes(arr)))
    return arrays, tuple(sha(folder / name) for name in datasets.MNIST_FILES)


@pytest.mark.parametrize("fashion", [False, True])
def test_mnist_offline(tmp_path, cache, monkeypatch, fashion):
    arrays, hashes = write_mnist(tmp_path / "src", seed=int(fashion))
    prefix = "FASHION_MNIST" if fashion else "MNIST"
    monkeypatch.setattr(datasets, f"{prefix}_URL", (tmp_path / "src").as_uri() + "/")
    monkeypatch.setattr(datasets, f"{prefix}_SHA256", hashes)
    out = mnist(fashion=fashion)
    for t, arr, shape in zip(out, arrays, [(5, 1, 28, 28), (5,), (3, 1, 28, 28), (3,)]):
        assert t.dtype is dtypes.uint8 and t.shape == shape and t.device == "CPU"
        np.testing.assert_array_equal(t.numpy().reshape(arr.shape), arr)
    assert sorted(p.name for p in (cache / ("fashion-mnist" if fashion else "mnist")).iterdir()) == sorted(
        datasets.MNIST_FILES
    )
    for name in datasets.MNIST_FILES:
        (tmp_path / "src" / name).unlink()
    again = mnist(device="PYTHON", fashion=fashion)  # served from the cache
    assert again[1].device == "PYTHON" and again[1].tolist() == arrays[1].tolist()


def test_mnist_bad_downloads(tmp_path, cache, monkeypatch):
    _, hashes = write_mnist(tmp_path / "src")
    monkeypatch.setattr(datasets, "MNIST_URL", (tmp_path / "src").as_uri() + "/")
    monkeypatch.setattr(datasets, "MNIST_SHA256", ("0" * 64,) + hashes[1:])
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte.gz has sha256 .* expected 0000"):
        mnist()
    # a file that passes its checksum but is not gzip, or whose values are not uint8 images
    (tmp_path / "src" / datasets.MNIST_FILES[0]).write_bytes(b"not gzip at all")
    monkeypatch.setattr(datasets, "MNIST_SHA256", (sha(tmp_path / "src" / datasets.MNIST_FILES[0]),) + hashes[1:])
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte.gz: corrupt gzip file"):
        mnist()
    (cache / "mnist" / datasets.MNIST_FILES[0]).unlink()
    (tmp_path / "src" / datasets.MNIST_FILES[0]).write_bytes(
        gzip.compress(idx_bytes(np.zeros((2, 28, 28), np.float32)))
    )
    monkeypatch.setattr(datasets, "MNIST_SHA256", (sha(tmp_path / "src" / datasets.MNIST_FILES[0]),) + hashes[1:])
    with pytest.raises(ValueError, match=r"expected uint8 values, the file holds float32"):
        mnist()
    shutil.rmtree(cache / "mnist")
    monkeypatch.setattr(datasets, "MNIST_URL", "http://127.0.0.1:9/")
    with pytest.raises(
        ConnectionError, match=r"127.0.0.1:9/train-images.*put the file at .*mnist/train-images-idx3-ubyte.gz"
    ):
        mnist()


def test_published_checksums_are_well_formed():
    for h in (*datasets.MNIST_SHA256, *datasets.FASHION_MNIST_SHA256, datasets.CIFAR_SHA256):
        assert len(h) == 64 and int(h, 16) >= 0
    assert len(set(datasets.MNIST_SHA256 + datasets.FASHION_MNIST_SHA256)) == 8


# ------------------------------------------------------------------ CIFAR-10


def write_cifar(path, per_batch=2, seed=0, corrupt=None):
    rng = np.random.default_rng(seed)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    batches = {
        n: (rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8), rng.integers(0, 10, per_batch).tolist())
        for n in names
    }
    with tarfile.open(path, "w:gz") as tar:
        for n, (data, labels) in batches.items():
            raw = pickle.dumps(
                {b"batch_label": b"x", b"labels": labels, b"data": data, b"filenames": [b"a"] * per_batch}, protocol=2
            )
            if n == corrupt:
                raw = raw[:20]
            info = tarfile.TarInfo(f"cifar-10-batches-py/{n}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return batches


def test_cifar_offline(tmp_path, monkeypatch):
    batches = write_cifar(tmp_path / "c.tar.gz")
    monkeypatch.setattr(datasets, "CIFAR_URL", (tmp_path / "c.tar.gz").as_uri())
    monkeypatch.setattr(datasets, "CIFAR_SHA256", sha(tmp_path / "c.tar.gz"))
    xtr, ytr, xte, yte = cifar()
    assert xtr.shape == (10, 3, 32, 32) and ytr.shape == (10,) and xte.shape == (2, 3, 32, 32) and yte.shape == (2,)
    assert all(t.dtype is dtypes.uint8 for t in (xtr, ytr, xte, yte))
    np.testing.assert_array_equal(xtr.numpy()[2:4].reshape(2, -1), batches["data_batch_2"][0])
    assert ytr.tolist()[8:] == batches["data_batch_5"][1] and yte.tolist() == batches["test_batch"][1]


def test_cifar_bad_archives(tmp_path, cache, monkeypatch):
    write_cifar(tmp_path / "c.tar.gz", corrupt="data_batch_3")
    monkeypatch.setattr(datasets, "CIFAR_URL", (tmp_path / "c.tar.gz").as_uri())
    monkeypatch.setattr(datasets, "CIFAR_SHA256", sha(tmp_path / "c.tar.gz"))
    with pytest.raises(ValueError, match=r"data_batch_3: corrupt CIFAR batch"):
        cifar()
    evil = pickle.dumps({b"data": __import__("os").getcwd}, protocol=2)
    with pytest.raises(ValueError, match=r"b: refusing to load global (posix|os|nt)\.getcwd"):
        datasets._cifar_batch(evil, "b")
    with pytest.raises(ValueError, match=r"b: data of shape \(2, 5\) and 2 labels"):
        datasets._cifar_batch(pickle.dumps({b"data": np.zeros((2, 5), np.uint8), b"labels": [1, 2]}), "b")
    (cache / "cifar" / "cifar-10-python.tar.gz").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="corrupt archive"):
        cifar()


# ------------------------------------------------------------------ digits (scikit-learn's bundled copy)


def test_digits_matches_sklearn():
    from sklearn.datasets import load_digits

    ref = load_digits()
    xtr, ytr, xte, yte = digits()
    assert xtr.shape == (1438, 1, 8, 8) and xte.shape == (359, 1, 8, 8) and ytr.shape == (1438,) and yte.shape == (359,)
    assert all(t.dtype is dtypes.uint8 for t in (xtr, ytr, xte, yte))
    test = np.arange(1797) % 5 == 4
    np.testing.assert_array_equal(xte.numpy()[:, 0], ref.images[test])
    np.testing.assert_array_equal(xtr.numpy()[:, 0], ref.images[~test])
    np.testing.assert_array_equal(ytr.numpy(), ref.target[~test])
    assert sorted(set(yte.tolist())) == list(range(10)) and digits(device="PYTHON")[3].device == "PYTHON"


def test_digits_bad_input(tmp_path, monkeypatch):
    (tmp_path / "d.csv.gz").write_bytes(gzip.compress(b"1,2,3\n4,5,6\n"))
    with pytest.raises(ValueError, match=r"d.csv.gz: expected rows of 64 pixels .* shape \(2, 3\)"):
        digits(path=str(tmp_path / "d.csv.gz"))
    (tmp_path / "e.csv.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=r"e.csv.gz: cannot read the digits table"):
        digits(path=str(tmp_path / "e.csv.gz"))
    row = ",".join(["17"] * 64 + ["3"]) + "\n"
    (tmp_path / "f.csv.gz").write_bytes(gzip.compress(row.encode()))
    with pytest.raises(ValueError, match="pixels in 0..16"):
        digits(path=str(tmp_path / "f.csv.gz"))
    monkeypatch.setattr(datasets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install scikit-learn"):
        digits()
