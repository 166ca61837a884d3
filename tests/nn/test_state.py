"""nn.state (docs/api.md): state dicts, safetensors, torch checkpoints, tar/zip and GGUF, checked against the files and
values of the safetensors, torch and gguf packages; plus the DISK device that backs lazy loading."""

import collections
import io
import os
import pickle
import struct
import tarfile
import zipfile
from typing import NamedTuple

import gguf
import numpy as np
import pytest
import safetensors.torch
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import GGML_QUANT_SIZES
from fusegrad import GlobalCounters, Tensor, dtypes
from fusegrad.nn import state
from fusegrad.nn.state.blob import raw_bytes
from fusegrad.nn.state import (
    TensorIO,
    get_parameters,
    get_state_dict,
    ggml_data_to_tensor,
    gguf_load,
    load_state_dict,
    safe_load,
    safe_load_metadata,
    safe_save,
    tar_extract,
    torch_load,
    zip_extract,
)
from fusegrad.runtime.ops_disk import DiskBuffer
from fusegrad.schedule import base_buffer, buffer_of

TORCH_DTYPES = {
    dtypes.bool: torch.bool,
    dtypes.int8: torch.int8,
    dtypes.uint8: torch.uint8,
    dtypes.int16: torch.int16,
    dtypes.uint16: torch.uint16,
    dtypes.int32: torch.int32,
    dtypes.uint32: torch.uint32,
    dtypes.int64: torch.int64,
    dtypes.uint64: torch.uint64,
    dtypes.float16: torch.float16,
    dtypes.bfloat16: torch.bfloat16,
    dtypes.float32: torch.float32,
    dtypes.float64: torch.float64,
    dtypes.fp8e4m3: torch.float8_e4m3fn,
    dtypes.fp8e5m2: torch.float8_e5m2,
}


def raw(t: Tensor) -> bytes:
    return raw_bytes(t).tobytes()


def torch_raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def sample(dt, shape=(2, 3), seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dt is torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dt.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dt)
    lo, hi = (0, 200) if dt in (torch.uint8, torch.uint16, torch.uint32, torch.uint64) else (-100, 100)
    return torch.randint(lo, hi, shape, generator=g).to(dt)


# ------------------------------------------------------------------ state dicts


class Pair(NamedTuple):
    a: Tensor
    b: Tensor


class Block:
    def __init__(self):
        self.weight, self.bias = Tensor.ones(2, 3), Tensor.zeros(2)
        self.scale = 2.0  # not a tensor: skipped


class Model:
    def __init__(self):
        self.layers = [Block(), Block()]
        self.heads = {"x": Tensor([1.0, 2.0]), "y": (Tensor([3.0]),)}
        self.pair = Pair(Tensor([4.0]), Tensor([5.0]))
        self.parent = self  # a cycle must not recurse forever
        self.helper = np  # modules and functions are not walked


def test_get_state_dict_keys_and_order():
    m = Model()
    sd = get_state_dict(m)
    assert list(sd) == [
        "layers.0.weight",
        "layers.0.bias",
        "layers.1.weight",
        "layers.1.bias",
        "heads.x",
        "heads.y.0",
        "pair.a",
        "pair.b",
    ]
    assert sd["layers.1.bias"] is m.layers[1].bias and sd["pair.b"] is m.pair.b
    assert list(get_state_dict(m.layers, prefix="enc.")) == ["enc.0.weight", "enc.0.bias", "enc.1.weight", "enc.1.bias"]
    assert get_parameters(m) == list(sd.values())
    t = Tensor([1.0])
    assert (
        get_state_dict(t) == {"": t}
        and get_state_dict(3) == {}
        and get_state_dict(collections.OrderedDict(k=t)) == {"k": t}
    )


def _numpy_sd(m) -> dict:
    return {k: v.numpy() for k, v in get_state_dict(m).items()}


def test_load_state_dict_copies_values_keeps_dtype_and_never_aliases():
    m = Model()
    src = {k: Tensor(np.full(v.shape, i, np.float16)) for i, (k, v) in enumerate(get_state_dict(m).items())}
    src["pair.a"] = Tensor(np.float16(9.0))  # () into (1,) is reconciled
    loaded = load_state_dict(m, src, verbose=False)
    assert loaded == list(get_state_dict(m).values())
    for i, (k, v) in enumerate(get_state_dict(m).items()):
        assert v.dtype is dtypes.float32 and v.device == "CPU"
        np.testing.assert_array_equal(v.numpy(), np.full(v.shape, 9.0 if k == "pair.a" else i, np.float32))
    # a same-dtype value is copied: writing the model afterwards leaves the dict's tensor alone
    m2 = Model()
    w = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    load_state_dict(m2, {**get_state_dict(Model()), "layers.0.weight": w}, verbose=False)
    m2.layers[0].weight.assign(m2.layers[0].weight * 0).realize()
    assert w.numpy().sum() == 15 and m2.layers[0].weight.numpy().sum() == 0


def test_load_state_dict_from_safetensors_file(tmp_path):
    m = Model()
    want = {
        k: np.random.default_rng(1).standard_normal(v.shape).astype(np.float32) for k, v in get_state_dict(m).items()
    }
    safetensors.torch.save_file({k: torch.from_numpy(v) for k, v in want.items()}, tmp_path / "m.safetensors")
    sd = safe_load(tmp_path / "m.safetensors")
    assert all(t.device.startswith("DISK:") for t in sd.values())
    load_state_dict(m, sd, consume=True, verbose=False)
    assert sd == {} and all(t.device == "CPU" for t in get_state_dict(m).values())
    for k, v in get_state_dict(m).items():
        np.testing.assert_array_equal(v.numpy(), want[k])


def test_load_state_dict_errors_leave_model_unchanged(tmp_path, capsys):
    m = Model()
    before = _numpy_sd(m)
    uops = {k: v.uop for k, v in get_state_dict(m).items()}
    good = {k: v.full_like(7.0) for k, v in get_state_dict(m).items()}
    missing = {k: v for k, v in good.items() if k != "heads.x"} | {"extra.w": Tensor([1.0])}
    with pytest.raises(KeyError, match=r"'heads.x'.*'extra.w'"):
        load_state_dict(m, missing, verbose=False)
    with pytest.raises(ValueError, match=r"layers.1.weight: model \(2, 3\), state dict \(3, 2\)"):
        load_state_dict(m, good | {"layers.1.weight": Tensor.ones(3, 2)}, verbose=False)
    with pytest.raises(TypeError, match="'pair.b'.*ndarray"):
        load_state_dict(m, good | {"pair.b": np.ones(1)}, verbose=False)
    # a value that fails only when computed (DISK cannot run kernels) fails before any model tensor is touched
    safe_save({"w": Tensor.ones(2, 3)}, tmp_path / "w.safetensors")
    disk = safe_load(tmp_path / "w.safetensors")["w"] + 1
    with pytest.raises(RuntimeError, match="DISK.*cannot run kernels"):
        load_state_dict(m, good | {"layers.1.weight": disk}, verbose=False)
    assert all(v.uop is uops[k] for k, v in get_state_dict(m).items())
    for k, v in _numpy_sd(m).items():
        np.testing.assert_array_equal(v, before[k])
    # not strict: the missing key is skipped, the rest load, and verbose says what was skipped
    loaded = load_state_dict(m, missing, strict=False)
    assert (
        len(loaded) == len(good) - 1
        and m.heads["x"].numpy().tolist() == [1.0, 2.0]
        and m.pair.a.numpy().tolist() == [7.0]
    )
    assert "heads.x" in capsys.readouterr().out


def test_load_state_dict_lazy_and_python_device():
    t = Tensor([0.0, 0.0, 0.0], device="PYTHON")
    holder = {"w": t}
    load_state_dict(holder, {"w": Tensor([1.0, 2.0, 3.0])}, realize=False, verbose=False)
    assert t.device == "PYTHON" and base_buffer(t.uop) is None and t.numpy().tolist() == [1.0, 2.0, 3.0]


# ------------------------------------------------------------------ safetensors


@pytest.mark.parametrize("dt", list(TORCH_DTYPES))
def test_safetensors_both_ways_all_dtypes(tmp_path, dt):
    ts = {"m": sample(TORCH_DTYPES[dt]), "s": sample(TORCH_DTYPES[dt], ()), "e": sample(TORCH_DTYPES[dt], (0, 4))}
    safetensors.torch.save_file(ts, tmp_path / "theirs.safetensors")
    ours = safe_load(tmp_path / "theirs.safetensors")
    for k, t in ts.items():
        assert ours[k].dtype is dt and ours[k].shape == tuple(t.shape) and raw(ours[k]) == torch_raw(t)
    safe_save(ours, tmp_path / "ours.safetensors")
    back = safetensors.torch.load_file(tmp_path / "ours.safetensors")
    for k, t in ts.items():
        assert back[k].dtype == t.dtype and back[k].shape == t.shape and torch_raw(back[k]) == torch_raw(t)
    # values too: bfloat16 and fp8 come back as float32, the same widening torch's .float() does
    widened = dt in (dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2)
    np.testing.assert_array_equal(ours["m"].numpy(), ts["m"].float().numpy() if widened else ts["m"].numpy())


def test_safe_save_views_metadata_and_header(tmp_path):
    base = Tensor(np.arange(24, dtype=np.float32).reshape(4, 6))
    views = {
        "perm": base.permute(1, 0),
        "slice": base[1:3, ::2],
        "flip": base[::-1, ::-3],
        "lazy": base * 2 + 1,
        "python": Tensor([1, 2, 3], device="PYTHON"),
    }
    safe_save(views, tmp_path / "v.safetensors", metadata={"format": "pt", "who": "fusegrad"})
    with safetensors.safe_open(tmp_path / "v.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt", "who": "fusegrad"}
        for k, v in views.items():
            np.testing.assert_array_equal(f.get_tensor(k).numpy(), v.numpy())
    t, data_start, header = safe_load_metadata(tmp_path / "v.safetensors")
    assert t.dtype is dtypes.uint8 and t.shape == (os.path.getsize(tmp_path / "v.safetensors"),)
    assert data_start % 8 == 0 and header["__metadata__"]["who"] == "fusegrad" and header["perm"]["shape"] == [6, 4]
    with pytest.raises(TypeError, match="metadata"):
        safe_save(views, tmp_path / "x.safetensors", metadata={"a": 1})
    with pytest.raises(TypeError, match="str -> Tensor"):
        safe_save({"a": np.ones(2)}, tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists() and len(os.listdir(tmp_path)) == 1  # no temporary file left behind


def test_safe_load_is_lazy(tmp_path):
    # a 1 GB tensor in a sparse file: loading maps it but reads and allocates nothing until a tensor is used
    fn = tmp_path / "big.safetensors"
    header = (
        b'{"small":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"big":{"dtype":"F32","shape":[268435456],'
        b'"data_offsets":[8,1073741832]}}'
    )
    with open(fn, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + struct.pack("<2f", 1.5, -2.0))
        f.truncate(8 + len(header) + 1073741832)
    mem = GlobalCounters.mem_used
    sd = safe_load(fn)
    assert sd["small"].numpy().tolist() == [1.5, -2.0] and GlobalCounters.mem_used == mem
    assert (
        isinstance(buffer_of[base_buffer(sd["big"].uop)], DiskBuffer)
        and not buffer_of[base_buffer(sd["big"].uop)].is_allocated
    )
    assert buffer_of[base_buffer(sd["small"].uop)].is_allocated


def test_disk_tensors_copy_but_do_not_compute(tmp_path):
    safe_save({"a": Tensor([1.0, 2.0, 3.0])}, tmp_path / "a.safetensors")
    a = safe_load(tmp_path / "a.safetensors")["a"]
    assert (a.to("PYTHON") * 2).numpy().tolist() == [2, 4, 6] and a.to("CPU").sum().item() == 6
    with pytest.raises(RuntimeError, match="cannot run kernels.*to\\('CPU'\\)"):
        (a + 1).realize()
    with pytest.raises(RuntimeError, match="read-only"):
        Tensor([1.0]).to(a.device).realize()
    # rewriting the file: tensors loaded before keep their bytes, a new load sees the new ones
    safe_save({"a": Tensor([7.0, 8.0, 9.0])}, tmp_path / "a.safetensors")
    assert a.numpy().tolist() == [1, 2, 3] and safe_load(tmp_path / "a.safetensors")["a"].numpy().tolist() == [7, 8, 9]
    with pytest.raises(FileNotFoundError, match="nope"):
        safe_load(tmp_path / "nope.safetensors")


def test_disk_slices_are_views_of_the_file(tmp_path):
    data = np.arange(24, dtype=np.uint8)
    (tmp_path / "b.bin").write_bytes(data.tobytes())
    t = Tensor(tmp_path / "b.bin")
    GlobalCounters.reset()
    head = t[2:5].to("CPU").realize()
    assert GlobalCounters.kernel_count == 1 and GlobalCounters.global_mem == 6  # a copy of 3 bytes, no DISK kernel
    np.testing.assert_array_equal(head.numpy(), data[2:5])
    np.testing.assert_array_equal(t[2:5].numpy(), data[2:5])
    assert t[7:7].numpy().shape == (0,)
    sliced = t.reshape(2, 3, 4)[1:2, 1:3].realize()
    assert sliced.device == t.device and isinstance(buffer_of[base_buffer(sliced.uop)], DiskBuffer)
    np.testing.assert_array_equal(sliced.to("CPU").numpy(), data.reshape(2, 3, 4)[1:2, 1:3])
    np.testing.assert_array_equal(t.reshape(4, 6)[2:3, 1:5].numpy(), data.reshape(4, 6)[2:3, 1:5])
    sd = {"w": Tensor(np.arange(20, dtype=np.float32).reshape(5, 4))}
    safe_save(sd, tmp_path / "w.safetensors")
    w = safe_load(tmp_path / "w.safetensors")["w"]
    np.testing.assert_array_equal(w[1:3].numpy(), np.arange(20, dtype=np.float32).reshape(5, 4)[1:3])
    # a strided view is not one range of the file: .to() copies the viewed tensor and takes the view on the target
    np.testing.assert_array_equal(t.reshape(4, 6)[:, 1:3].to("CPU").numpy(), data.reshape(4, 6)[:, 1:3])
    np.testing.assert_array_equal(t[::3].to("PYTHON").numpy(), data[::3])
    np.testing.assert_array_equal(w.T[1:3].to("CPU").numpy(), np.arange(20, dtype=np.float32).reshape(5, 4).T[1:3])
    # ...but DISK itself runs no kernel
    with pytest.raises(RuntimeError, match=r"cannot run kernels .* contiguous slices; move the tensor with .to"):
        t.reshape(4, 6)[:, 1:3].numpy()


def test_safe_load_from_tensors(tmp_path):
    safe_save({"x": Tensor([[1, 2], [3, 4]], dtype=dtypes.int16)}, tmp_path / "x.safetensors")
    data = (tmp_path / "x.safetensors").read_bytes()
    assert safe_load(Tensor(data))["x"].numpy().tolist() == [[1, 2], [3, 4]]  # host bytes
    assert safe_load(Tensor(data, device="PYTHON"))["x"].device == "PYTHON"
    with tarfile.open(tmp_path / "x.tar", "w") as tar:
        tar.add(tmp_path / "x.safetensors", arcname="inner/x.safetensors")
    inner = tar_extract(tmp_path / "x.tar")["inner/x.safetensors"]
    assert inner.device.startswith("DISK:") and safe_load(inner)["x"].device.startswith("DISK:")  # still lazy
    assert safe_load(inner)["x"].numpy().tolist() == [[1, 2], [3, 4]]
    with pytest.raises(TypeError, match="uint8"):
        safe_load(Tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="path or a uint8 Tensor"):
        safe_load(3)


def _bad(tmp_path, data: bytes) -> str:
    (tmp_path / "bad.safetensors").write_bytes(data)
    return str(tmp_path / "bad.safetensors")


def _st(header: str, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header)) + header.encode() + data


@pytest.mark.parametrize(
    "data, match",
    [
        (b"\x01\x02", r"bad.safetensors: not a safetensors file: 2 bytes"),
        (struct.pack("<Q", 1000) + b"{}", r"header length 1000 exceeds the 2 bytes"),
        (_st("{not json"), r"not valid JSON"),
        (_st("[1, 2]"), r"header is a list"),
        (_st('{"w":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}', b"\0"), r"tensor 'w' has unknown dtype 'F4'"),
        (
            _st('{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', b"\0" * 8),
            r"'w' \(F32, shape \(3,\)\) needs 12 bytes but data_offsets \[0, 8\] hold 8",
        ),
        (
            _st('{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', b"\0" * 8),
            r"truncated: tensor 'w' .* needs bytes \[\d+, \d+\) but the file has",
        ),
        (_st('{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', b"\0" * 4), r"'w' has invalid shape \[-1\]"),
        (
            _st('{"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}', b"\0" * 4),
            r"'w' has invalid data_offsets \[4, 0\]",
        ),
        (_st('{"w":{"dtype":"F32"}}'), r"entry 'w' .* needs 'dtype', 'shape' and 'data_offsets'"),
    ],
)
def test_safe_load_bad_files(tmp_path, data, match):
    with pytest.raises(ValueError, match=match):
        safe_load(_bad(tmp_path, data))


def test_safe_save_rejects_unstorable_dtype(tmp_path):
    with pytest.raises(ValueError, match=r"'w' has dtype dtypes.fp8e4m3fnuz"):
        safe_save({"w": Tensor.empty(2, dtype=dtypes.fp8e4m3fnuz)}, tmp_path / "w.safetensors")


# ------------------------------------------------------------------ tar / zip


def test_tar_and_zip_extract(tmp_path):
    files = {"a.bin": bytes(range(10)), "dir/b.txt": b"hello", "empty": b""}
    for name, data in files.items():
        (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / name).write_bytes(data)
    for mode, fn in (("w", "t.tar"), ("w:gz", "t.tgz")):
        with tarfile.open(tmp_path / fn, mode) as tar:
            for name in files:
                tar.add(tmp_path / "src" / name, arcname=name)
    for comp, fn in ((zipfile.ZIP_STORED, "z.zip"), (zipfile.ZIP_DEFLATED, "zd.zip")):
        with zipfile.ZipFile(tmp_path / fn, "w", comp) as zf:
            for name, data in files.items():
                zf.writestr(name, data)
    for fn, lazy in (("t.tar", True), ("t.tgz", False), ("z.zip", True), ("zd.zip", False)):
        out = (tar_extract if "t" in fn[:1] else zip_extract)(tmp_path / fn)
        assert sorted(out) == sorted(files), fn
        for name, data in files.items():
            assert out[name].dtype is dtypes.uint8 and bytes(out[name].numpy()) == data
            assert out[name].device.startswith("DISK:") == lazy, (fn, name)
    # archives given as uint8 tensors, and TensorIO over one
    assert bytes(zip_extract(Tensor((tmp_path / "zd.zip").read_bytes()))["dir/b.txt"].numpy()) == b"hello"
    f = TensorIO(tar_extract(tmp_path / "t.tar")["a.bin"])
    assert f.read(3) == b"\0\1\2" and f.seek(-2, 2) == 8 and f.read() == b"\x08\x09" and f.tell() == 10
    with pytest.raises(ValueError, match="t.tar: not a readable zip"):
        zip_extract(tmp_path / "t.tar")
    with pytest.raises(ValueError, match="z.zip: not a readable tar"):
        tar_extract(tmp_path / "z.zip")


# ------------------------------------------------------------------ torch checkpoints


def _check_same(ours, theirs):
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, Tensor) and ours.shape == tuple(theirs.shape), (ours, theirs.shape)
        assert ours.dtype is next(k for k, v in TORCH_DTYPES.items() if v == theirs.dtype)
        assert raw(ours) == torch_raw(theirs)
    elif isinstance(theirs, dict):
        assert type(ours) is type(theirs) and list(ours) == list(theirs)
        for k in theirs:
            _check_same(ours[k], theirs[k])
    elif isinstance(theirs, (list, tuple)):
        assert type(ours) is type(theirs) and len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            _check_same(a, b)
    else:
        assert ours == theirs


# dtypes that have a typed torch storage class: torch's own pre-zip writer cannot save the others
LEGACY_DTYPES = (
    torch.bool,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
)


def _checkpoint(legacy: bool) -> dict:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    lin, bn = torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)
    return {
        "dtypes": {
            str(v): sample(v, (3, 2), i)
            for i, v in enumerate(TORCH_DTYPES.values())
            if v in LEGACY_DTYPES or not legacy
        },
        "model": collections.OrderedDict(list(lin.state_dict().items()) + list(bn.state_dict().items())),
        "param": torch.nn.Parameter(torch.ones(2)),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 3),
        "views": [
            base[1:3],
            base.T,
            base[:, 1],
            base[1, 2:4].expand(3, 2),
            base.as_strided((2, 2), (1, 1), 3),
            base.unsqueeze(1)[2:, :, 3:],
            base,
        ],
        "meta": {"epoch": 3, "lr": 0.1, "name": "run", "none": None, "t": (1, 2), "raw": b"\x00\x01"},
    }


@pytest.mark.parametrize("zip_format", [True, False])
def test_torch_load_files_torch_writes(tmp_path, zip_format):
    ckpt = _checkpoint(legacy=not zip_format)
    torch.save(ckpt, tmp_path / "c.pt", _use_new_zipfile_serialization=zip_format)
    ours = torch_load(tmp_path / "c.pt")
    _check_same(ours, torch.load(tmp_path / "c.pt"))
    assert ours["model"]["0.weight" if "0.weight" in ours["model"] else "weight"].device.startswith("DISK:")  # lazy
    assert (
        ours["model"]["num_batches_tracked"].shape == () and ours["model"]["num_batches_tracked"].dtype is dtypes.int64
    )
    np.testing.assert_array_equal(ours["views"][3].numpy(), ckpt["views"][3].numpy())  # a broadcast view
    # the same bytes as a uint8 tensor
    _check_same(torch_load(Tensor((tmp_path / "c.pt").read_bytes()))["views"], ckpt["views"])
    on_python = torch_load(Tensor((tmp_path / "c.pt").read_bytes(), device="PYTHON"))["views"]
    assert {t.device for t in on_python} == {"PYTHON"} and on_python[1].numpy().tolist() == ckpt["views"][1].tolist()


def _write_legacy_tar(path, tensors: dict):
    """The pre-zip tar layout: 'storages' (count, then per storage a (key, location, type) pickle, int64 size and raw
    data, then the list of storage views), 'tensors' (count, then per tensor a (key, storage key, type) pickle and its
    int32 rank, 4 pad bytes, int64 sizes, strides, offset), and 'pickle' with tensors as persistent ids."""
    storage_types = {
        torch.float32: torch.FloatStorage,
        torch.int64: torch.LongStorage,
        torch.float16: torch.HalfStorage,
    }
    sbuf, tbuf, pbuf = io.BytesIO(), io.BytesIO(), io.BytesIO()
    pickle.dump(len(tensors), sbuf, protocol=2)
    pickle.dump(len(tensors), tbuf, protocol=2)
    for i, t in enumerate(tensors.values()):
        base = t if t._base is None else t._base
        pickle.dump((i, "cpu", storage_types[t.dtype]), sbuf, protocol=2)
        sbuf.write(struct.pack("<q", base.numel()) + base.contiguous().numpy().tobytes())
        pickle.dump((100 + i, i, torch.FloatTensor), tbuf, protocol=2)
        tbuf.write(struct.pack(f"<i4x{t.ndim}q{t.ndim}qq", t.ndim, *t.shape, *t.stride(), t.storage_offset()))
    pickle.dump([], sbuf, protocol=2)
    names = list(tensors)

    class Ref:
        def __init__(self, name):
            self.name = name

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return str(100 + names.index(obj.name)) if isinstance(obj, Ref) else None

    Pickler(pbuf, protocol=2).dump({k: Ref(k) for k in tensors})
    sys_info = pickle.dumps(
        {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}
    )
    with tarfile.open(path, "w") as tar:
        for name, data in (
            ("sys_info", sys_info),
            ("pickle", pbuf.getvalue()),
            ("storages", sbuf.getvalue()),
            ("tensors", tbuf.getvalue()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_torch_load_legacy_tar(tmp_path):
    tensors = {
        "w": torch.arange(6.0).reshape(2, 3),
        "t": torch.arange(12.0).reshape(3, 4).T,
        "i": torch.tensor([5, 6, 7]),
        "h": torch.arange(10, dtype=torch.float16)[2:5],
    }
    _write_legacy_tar(tmp_path / "old.tar", tensors)
    theirs = torch.load(tmp_path / "old.tar", weights_only=False)  # torch reads our synthetic file: the layout is right
    ours = torch_load(tmp_path / "old.tar")
    _check_same(ours, theirs)
    _check_same(ours, tensors)


def test_torch_load_bad_files(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"\x80\x02K\x07.")  # a pickle, but not torch's magic number
    with pytest.raises(ValueError, match=r"junk.pt: not a PyTorch file \(bad magic"):
        torch_load(tmp_path / "junk.pt")
    (tmp_path / "rand.pt").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ValueError, match="rand.pt"):
        torch_load(tmp_path / "rand.pt")
    with zipfile.ZipFile(tmp_path / "nopkl.pt", "w") as zf:
        zf.writestr("a/other", b"x")
    with pytest.raises(ValueError, match=r"nopkl.pt: zip archive without a data.pkl"):
        torch_load(tmp_path / "nopkl.pt")

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"x": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(ValueError, match=r"evil.pt: refusing to load global (posix|os|nt)\.system"):
        torch_load(tmp_path / "evil.pt")
    torch.save({"w": torch.ones(4)}, tmp_path / "ok.pt")
    with zipfile.ZipFile(tmp_path / "ok.pt") as src, zipfile.ZipFile(tmp_path / "nostorage.pt", "w") as dst:
        for info in src.infolist():
            if "/data/" not in info.filename:
                dst.writestr(info.filename, src.read(info))
    with pytest.raises(ValueError, match=r"nostorage.pt: storage '0' is missing"):
        torch_load(tmp_path / "nostorage.pt")
    data = (tmp_path / "ok.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cut.pt"):
        torch_load(tmp_path / "cut.pt")
    torch.save({"w": torch.ones(4)}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    data = (tmp_path / "old.pt").read_bytes()
    (tmp_path / "oldcut.pt").write_bytes(data[:-4])
    with pytest.raises(ValueError, match=r"oldcut.pt: truncated: storage '\d+' needs bytes"):
        torch_load(tmp_path / "oldcut.pt")


# ------------------------------------------------------------------ GGUF

QUANT = (Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q6_K)
SCALE_OFFSETS = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q8_0: (0,), Q.Q4_K: (0, 2), Q.Q6_K: (208,)}


def quant_blocks(qt, nblocks: int, seed: int = 0) -> np.ndarray:
    """Random blocks of a quantized type, with finite float16 scales where the format keeps them."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(nblocks, GGML_QUANT_SIZES[qt][1]), dtype=np.uint8)
    for o in SCALE_OFFSETS[qt]:
        blocks[:, o : o + 2] = rng.uniform(-2, 2, (nblocks, 1)).astype(np.float16).view(np.uint8)
    return blocks


def write_gguf(path, tensors: dict, kv=lambda w: None, alignment=None):
    w = gguf.GGUFWriter(path, "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    kv(w)
    for name, (arr, qt) in tensors.items():
        if qt is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_shape=arr.shape, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_metadata_and_plain_tensors(tmp_path):
    def kv(w):
        w.add_uint8("u8", 200), w.add_int8("i8", -5), w.add_uint16("u16", 60000), w.add_int16("i16", -300)
        w.add_uint32("u32", 4000000000), w.add_int32("i32", -7), w.add_float32("f32", 0.5), w.add_bool("b", True)
        (
            w.add_uint64("u64", 2**63),
            w.add_int64("i64", -(2**40)),
            w.add_float64("f64", 1e-300),
            w.add_string("s", "héllo"),
        )
        w.add_array("ints", [1, 2, 3]), w.add_array("strs", ["a", "bc", ""]), w.add_array("floats", [0.25, -1.5])

    rng = np.random.default_rng(0)
    plain = {
        "f32": rng.standard_normal((3, 4, 5)).astype(np.float32),
        "f16": rng.standard_normal((7,)).astype(np.float16),
        "i8": np.arange(-4, 4, dtype=np.int8),
        "i16": np.arange(6, dtype=np.int16),
        "i32": np.arange(6, dtype=np.int32),
        "i64": np.arange(6, dtype=np.int64),
        "f64": rng.standard_normal((2, 2)),
    }
    bf16 = torch.randn(2, 8).to(torch.bfloat16)
    write_gguf(
        tmp_path / "m.gguf",
        {**{k: (v, None) for k, v in plain.items()}, "bf16": (bf16.view(torch.uint8).numpy(), Q.BF16)},
        kv,
        alignment=64,
    )
    meta, sd = gguf_load(tmp_path / "m.gguf")
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    assert meta["general.architecture"] == "llama" and meta["general.alignment"] == 64
    assert {
        k: meta[k]
        for k in ("u8", "i8", "u16", "i16", "u32", "i32", "b", "u64", "i64", "f64", "s", "ints", "strs", "floats")
    } == {
        "u8": 200,
        "i8": -5,
        "u16": 60000,
        "i16": -300,
        "u32": 4000000000,
        "i32": -7,
        "b": True,
        "u64": 2**63,
        "i64": -(2**40),
        "f64": 1e-300,
        "s": "héllo",
        "ints": [1, 2, 3],
        "strs": ["a", "bc", ""],
        "floats": [0.25, -1.5],
    }
    assert meta["f32"] == 0.5 and set(meta) == {k for k in reader.fields if not k.startswith("GGUF.")}
    for k, v in plain.items():
        assert sd[k].shape == v.shape and sd[k].device.startswith("DISK:")
        np.testing.assert_array_equal(sd[k].numpy(), v)
    assert sd["bf16"].dtype is dtypes.bfloat16 and sd["bf16"].shape == (2, 8)
    np.testing.assert_array_equal(sd["bf16"].numpy(), bf16.float().numpy())


@pytest.mark.parametrize("qt", QUANT)
def test_gguf_quantized_matches_gguf_dequantize(tmp_path, qt):
    block_elems = GGML_QUANT_SIZES[qt][0]
    blocks = quant_blocks(qt, 6).reshape(2, 3 * GGML_QUANT_SIZES[qt][1])
    write_gguf(tmp_path / "q.gguf", {"w": (blocks, qt)})
    _, sd = gguf_load(tmp_path / "q.gguf")
    want = gguf.quants.dequantize(blocks, qt)
    assert want.shape == (2, 3 * block_elems) and sd["w"].shape == want.shape and sd["w"].dtype is dtypes.float32
    GlobalCounters.reset()
    got = sd["w"].realize()
    assert GlobalCounters.kernel_count == 2  # the copy off DISK, then one fused dequantization kernel
    np.testing.assert_array_equal(got.numpy(), want)


def test_gguf_real_quantization_and_ggml_data_to_tensor():
    values = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
    for qt in (Q.Q8_0, Q.Q4_0):
        packed = gguf.quants.quantize(values, qt)
        ours = ggml_data_to_tensor(Tensor(packed.reshape(-1)), values.size, qt.value)
        np.testing.assert_array_equal(ours.numpy(), gguf.quants.dequantize(packed, qt).reshape(-1))
    # the PYTHON reference backend runs the same dequantization kernel (one 32-value block)
    block = quant_blocks(Q.Q4_0, 1, seed=5)
    ours = ggml_data_to_tensor(Tensor(block.reshape(-1), device="PYTHON"), 32, Q.Q4_0.value)
    assert ours.device == "PYTHON"
    np.testing.assert_array_equal(ours.numpy(), gguf.quants.dequantize(block, Q.Q4_0).reshape(-1))
    np.testing.assert_array_equal(
        ggml_data_to_tensor(Tensor(np.arange(3, dtype=np.float32).view(np.uint8)), 3, 0).numpy(), [0, 1, 2]
    )
    assert state.gguf_load is gguf_load  # nn.state.gguf_load is the compat location
    with pytest.raises(ValueError, match="unknown ggml type 99"):
        ggml_data_to_tensor(Tensor(block.reshape(-1)), 32, 99)
    with pytest.raises(ValueError, match="33 elements of Q4_0"):
        ggml_data_to_tensor(Tensor(block.reshape(-1)), 33, 2)
    with pytest.raises(ValueError, match="64 Q4_0 values need 36"):
        ggml_data_to_tensor(Tensor(block.reshape(-1)), 64, 2)
    with pytest.raises(NotImplementedError, match="Q5_K"):
        ggml_data_to_tensor(Tensor(np.zeros(176, np.uint8)), 256, 13)


def test_gguf_bad_files(tmp_path):
    write_gguf(tmp_path / "ok.gguf", {"w": (np.arange(8, dtype=np.float32), None)}, lambda w: w.add_string("name", "x"))
    data = (tmp_path / "ok.gguf").read_bytes()

    def load(name, content):
        (tmp_path / name).write_bytes(content)
        return gguf_load(tmp_path / name)

    with pytest.raises(ValueError, match=r"magic.gguf: not a GGUF file: magic b'GGML'"):
        load("magic.gguf", b"GGML" + data[4:])
    with pytest.raises(ValueError, match=r"v1.gguf: GGUF version 1 is not supported"):
        load("v1.gguf", data[:4] + struct.pack("<I", 1) + data[8:])
    with pytest.raises(ValueError, match=r"cut.gguf: tensor count 1 and metadata count 2 cannot fit in the 16 bytes"):
        load("cut.gguf", data[:40])
    with pytest.raises(ValueError, match=r"cut2.gguf: truncated: .* needs bytes"):
        load("cut2.gguf", data[:80])
    with pytest.raises(ValueError, match=r"tail.gguf: truncated: tensor 'w' \(dtypes.float32, shape \(8,\)\)"):
        load("tail.gguf", data[:-8])
    # tensor info of 'w': name length u64, b"w", rank u32 (1), the one dim u64, then the ggml type u32
    type_at = data.index(struct.pack("<Q", 1) + b"w" + struct.pack("<I", 1)) + 21
    bad_type = bytearray(data)
    bad_type[type_at : type_at + 4] = struct.pack("<I", 99)
    with pytest.raises(ValueError, match=r"qt.gguf: tensor 'w' has unknown ggml type 99"):
        load("qt.gguf", bytes(bad_type))
    bad_type[type_at : type_at + 4] = struct.pack("<I", 13)
    with pytest.raises(ValueError, match=r"q5k.gguf: tensor 'w' of shape \(8,\) does not fill whole Q5_K blocks"):
        load("q5k.gguf", bytes(bad_type))
    value_type = data.index(b"name") + 4  # the kv's value type follows its key
    bad_kv = data[:value_type] + struct.pack("<I", 42) + data[value_type + 4 :]
    with pytest.raises(ValueError, match=r"kv.gguf: metadata 'name' has unknown value type 42"):
        load("kv.gguf", bad_kv)
    write_gguf(tmp_path / "q5.gguf", {"w": (np.zeros((1, 176), np.uint8), Q.Q5_K)})
    with pytest.raises(NotImplementedError, match=r"q5.gguf: tensor 'w' has ggml type Q5_K"):
        gguf_load(tmp_path / "q5.gguf")
