"""nn.state against crafted files: pickles that try to reach outside the data, headers that lie, files that shrink after
loading, and fuzzing (truncation at every offset, random byte flips). A crafted file may only ever give a clean
ValueError (or a valid result); it must never change a global, never crash the process. Crash-prone cases run in a
subprocess so that a SIGSEGV or SIGBUS shows up as a failure instead of killing the test run."""

import collections
import copy
import json
import os
import pathlib
import pickle
import struct
import subprocess
import sys
import textwrap
import zipfile

import gguf
import numpy as np
import pytest
import torch

from fusegrad import Tensor, dtypes
from fusegrad.dtype import DType
from fusegrad.nn.state import gguf_load, safe_load, safe_load_metadata, safe_save, torch_load

REPO = pathlib.Path(__file__).resolve().parents[2]


def run_isolated(code: str, *args: str, timeout: int = 120) -> str:
    """Run `code` in a fresh interpreter on this checkout; a signal (SIGSEGV, SIGBUS) or a nonzero exit fails."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 0, (
        f"exit status {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def dtype_snapshot() -> dict:
    return {k: (v.priority, v.bitsize, v.name, v.fmt, v.kind, v.attr, v.itemsize) for k, v in dtypes.fields().items()}


def write_pt(path, pkl: bytes, storages: dict[str, bytes] | None = None) -> str:
    """A zip checkpoint laid out like torch.save's, with a hand-written data.pkl."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", pkl)
        zf.writestr("archive/byteorder", b"little")
        zf.writestr("archive/version", b"3\n")
        for key, data in (storages or {}).items():
            zf.writestr(f"archive/data/{key}", data)
    return str(path)


# ------------------------------------------------------------------ dtype objects cannot be changed


def test_dtype_objects_are_immutable():
    before = dtype_snapshot()
    f32 = dtypes.float32
    with pytest.raises(AttributeError):
        f32.bitsize = 8
    with pytest.raises(AttributeError):
        f32.__dict__  # noqa: B018 - slots: there is no instance dict for pickle's BUILD to update
    with pytest.raises(AttributeError):
        f32.extra = 1
    with pytest.raises(TypeError, match="immutable"):
        f32.__setstate__({"bitsize": 8})
    with pytest.raises(TypeError, match="immutable"):
        f32.__setstate__((None, {"bitsize": 8}))
    # one object per dtype survives pickling and copying, and hashes by identity
    assert pickle.loads(pickle.dumps(f32)) is f32 and copy.deepcopy(f32) is f32 and copy.copy(f32) is f32
    assert {f32: 1}[dtypes.float] == 1 and isinstance(f32, DType) and f32.itemsize == 4
    assert dtype_snapshot() == before


def test_plain_pickle_cannot_build_into_a_dtype():
    # even the unrestricted pickle module cannot BUILD state into a dtype object
    attack = b"\x80\x02cfusegrad.dtype\nto_dtype\nX\x07\x00\x00\x00float32\x85R}X\x07\x00\x00\x00bitsizeK\x08sb."
    before = dtype_snapshot()
    with pytest.raises(TypeError, match="immutable"):
        pickle.loads(attack)
    assert dtype_snapshot() == before and dtypes.float32.bitsize == 32


# ------------------------------------------------------------------ torch_load is at least as strict as weights_only


# each pickle tries to reach outside the data; torch.load(weights_only=True) refuses all of them too
ATTACKS = {
    # BUILD a dict of attributes into the global torch.float32 (fusegrad's dtypes.float32)
    "build_dict_into_dtype": b"\x80\x02ctorch\nfloat32\n}X\x07\x00\x00\x00bitsizeK\x08sb.",
    # BUILD (None, slotstate) into it: pickle would setattr each slot
    "build_slots_into_dtype": b"\x80\x02ctorch\nfloat32\nN}X\x07\x00\x00\x00bitsizeK\x08s\x86b.",
    # BUILD into an allowed global function and class
    "build_into_function": b"\x80\x02c_codecs\nencode\n}X\x0c\x00\x00\x00__defaults__X\x01\x00\x00\x00xsb.",
    "build_into_class": b"\x80\x02ccollections\nOrderedDict\n}X\x03\x00\x00\x00fooK\x01sb.",
    # SETITEM / APPEND into global objects
    "setitem_into_global": b"\x80\x02ctorch\nfloat32\nX\x01\x00\x00\x00aK\x01s.",
    "append_into_global": b"\x80\x02ccollections\nOrderedDict\nK\x01a.",
    # a numpy object array from raw bytes (a planted pointer) and a shared numpy dtype given a new byte order
    "numpy_object_array": pickle.dumps(np.arange(2, dtype=np.int64), protocol=2).replace(
        b"X\x02\x00\x00\x00i8", b"X\x02\x00\x00\x00O8"
    ),
    "numpy_object_scalar": b"\x80\x02cnumpy.core.multiarray\nscalar\ncnumpy\ndtype\nX\x02\x00\x00\x00O8\x89\x88\x87R"
    b"C\x08AAAAAAAA\x86R.",
    "numpy_ndarray_call": b"\x80\x02cnumpy\nndarray\nK\x10\x85R.",
    "os_system": b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00true\x85R.",
    "builtins_eval": b"\x80\x02cbuiltins\neval\nX\x03\x00\x00\x001+1\x85R.",
    "newobj_global": b"\x80\x02cbuiltins\nobject\n)\x81.",
    "inst_opcode": b"(ibuiltins\nobject\n.",
    "ext_registry": b"\x80\x02\x82\x01.",
    "bytearray8_huge": b"\x80\x05\x96" + struct.pack("<Q", 1 << 60) + b".",
    "binbytes8_huge": b"\x80\x04\x8e" + struct.pack("<Q", 1 << 60) + b".",
    "frame_huge": b"\x80\x04\x95" + struct.pack("<Q", 1 << 60) + b"N.",
    "tensor_negative_size": b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage"
    b"ctorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQK\x00J\xfe\xff\xff\xffJ\xfd\xff\xff\xff\x86K\x01K\x01\x86\x89"
    b"ccollections\nOrderedDict\n)RtR.",
}


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch's note on protocols 4 and 5
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_torch_load_refuses_crafted_pickles(tmp_path, name):
    before, f8_order = dtype_snapshot(), np.dtype("f8").byteorder
    path = write_pt(tmp_path / f"{name}.pt", ATTACKS[name], {"0": np.arange(4, dtype=np.float32).tobytes()})
    with pytest.raises(ValueError, match=rf"{name}\.pt: "):
        torch_load(path)
    with pytest.raises((pickle.UnpicklingError, RuntimeError)):  # torch refuses them as well
        torch.load(path, weights_only=True)
    assert dtype_snapshot() == before and np.dtype("f8").byteorder == f8_order


def test_torch_load_keeps_plain_numpy_values_and_state_dict_metadata(tmp_path):
    sd = collections.OrderedDict(w=torch.arange(6.0).reshape(2, 3))
    sd._metadata = {"": {"version": 1}}
    obj = {
        "sd": sd,
        "arr": np.arange(6, dtype=np.int16).reshape(2, 3),
        "big_endian": np.arange(3, dtype=">f4"),
        "bools": np.array([True, False]),
        "scalar": np.float32(2.5),
        "misc": [1, 2.0, "s", b"raw", (3, None), {4, 5}, frozenset({6}), complex(1, 2), slice(1, 2)],
    }
    torch.save(obj, tmp_path / "np.pt")
    theirs = torch.load(tmp_path / "np.pt", weights_only=False)
    ours = torch_load(tmp_path / "np.pt")
    assert type(ours["sd"]) is collections.OrderedDict and ours["sd"]._metadata == theirs["sd"]._metadata
    np.testing.assert_array_equal(ours["sd"]["w"].numpy(), theirs["sd"]["w"].numpy())
    for k in ("arr", "big_endian", "bools"):
        assert ours[k].dtype == theirs[k].dtype and ours[k].shape == theirs[k].shape
        np.testing.assert_array_equal(ours[k], theirs[k])
    assert ours["scalar"] == theirs["scalar"] and ours["scalar"].dtype == np.float32
    assert ours["misc"] == theirs["misc"]
    assert np.dtype("f4").byteorder == "="  # the big-endian dtype was a copy; numpy's shared one is untouched


def test_torch_load_reads_only_the_members_it_needs(tmp_path, monkeypatch):
    torch.save({"w": torch.arange(4.0)}, tmp_path / "ok.pt")
    with zipfile.ZipFile(tmp_path / "ok.pt") as src, zipfile.ZipFile(tmp_path / "bomb.pt", "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        dst.writestr("ok/junk", b"\0" * (64 << 20), compress_type=zipfile.ZIP_DEFLATED)  # 64 MB, ~64 KB deflated
    opened = []
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(
        zipfile.ZipFile, "open", lambda self, name, *a, **k: opened.append(name) or real_open(self, name, *a, **k)
    )
    np.testing.assert_array_equal(torch_load(tmp_path / "bomb.pt")["w"].numpy(), [0, 1, 2, 3])
    assert not any(getattr(n, "filename", n) == "ok/junk" for n in opened)


def test_torch_load_refuses_impossible_compression_ratio(tmp_path):
    pkl = pickle.dumps({"a": 1}, protocol=2)
    with zipfile.ZipFile(tmp_path / "ratio.pt", "w") as zf:
        zf.writestr("archive/data.pkl", pkl, compress_type=zipfile.ZIP_DEFLATED)
    data = bytearray((tmp_path / "ratio.pt").read_bytes())
    central = data.index(b"PK\x01\x02")
    data[central + 24 : central + 28] = struct.pack("<I", 0x7FFFFFFF)  # claims a 2 GB data.pkl
    (tmp_path / "ratio.pt").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"ratio.pt: member 'archive/data.pkl' declares 2147483647 bytes from \d+"):
        torch_load(tmp_path / "ratio.pt")


def test_torch_load_rebuild_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match=r"tensor_negative_size.pt: invalid tensor geometry: size \(-2, -3\)"):
        torch_load(write_pt(tmp_path / "tensor_negative_size.pt", ATTACKS["tensor_negative_size"], {"0": bytes(16)}))
    deep = b"\x80\x02" + b"]" * 100_000 + b"a" * 99_999 + b"."  # 100k nested lists: no recursion while loading
    out = torch_load(write_pt(tmp_path / "deep.pt", deep))
    depth = 0
    while out:
        out, depth = out[0], depth + 1
    assert depth == 99_999


def test_torch_load_strided_views_are_bounded(tmp_path):
    base = torch.arange(12.0)
    views = {
        "gap": base.as_strided((3, 2), (4, 2)),
        "overlap": base.as_strided((4, 3), (1, 1)),
        "broadcast_gap": base.as_strided((5, 3), (0, 3)),
    }
    torch.save(views, tmp_path / "views.pt")
    ours = torch_load(tmp_path / "views.pt")
    for k, v in views.items():
        np.testing.assert_array_equal(ours[k].numpy(), v.numpy())
    # a view that reads 1 M stored floats a thousand times over would materialize 4 GB from a 4 MB file
    torch.save({"w": torch.zeros(2**20 + 2**10).as_strided((2**20, 2**10), (1, 1))}, tmp_path / "huge.pt")
    with pytest.raises(ValueError, match=r"huge.pt: .* repeats its 1049599 stored elements more than 64 times over"):
        torch_load(tmp_path / "huge.pt")


@pytest.mark.slow  # about 4 s of pickling; CI runs it
def test_torch_load_refuses_tuples_nested_deep_enough_to_crash_hashing(tmp_path):
    # hashing ~a million nested tuples (as a dict key, a set item) overflows the C stack: the loader must refuse them
    # before anything hashes them; deep lists and dicts are fine to build and to free
    out = run_isolated(
        """
        import pathlib, sys
        sys.path.insert(0, "tests/nn")
        from test_state_fuzz import write_pt
        from fusegrad.nn.state import torch_load
        d = pathlib.Path(sys.argv[1])
        deep = b"N" + b"\\x85" * 5000
        for name, pkl in {
            "dict_key": b"\\x80\\x02}" + deep + b"K\\x01s.",
            "frozenset": b"\\x80\\x04(" + deep + b"\\x91.",
            "set_call": b"\\x80\\x02c__builtin__\\nset\\n(" + deep + b"\\x85\\x85R.",
            "torch_size": b"\\x80\\x02}ctorch\\nSize\\n" + deep + b"\\x85RK\\x01s.",
        }.items():
            try:
                torch_load(write_pt(d / f"{name}.pt", pkl))
            except ValueError as e:
                assert "tuples nest more than 100 deep" in str(e), e
                print("refused", name)
        shallow = torch_load(write_pt(d / "ok.pt", b"\\x80\\x02}N" + b"\\x85" * 100 + b"K\\x01s."))
        key = next(iter(shallow))
        depth = 0
        while key is not None:
            key, depth = key[0], depth + 1
        print("depth", depth)
        n = 200_000
        lists = torch_load(write_pt(d / "lists.pt", b"\\x80\\x02" + b"]" * n + b"a" * (n - 1) + b"."))
        dicts = torch_load(write_pt(d / "dicts.pt", b"\\x80\\x02" + b"}K\\x01" * n + b"N" + b"s" * n + b"."))
        del lists, dicts
        print("freed")
        """,
        str(tmp_path),
    )
    assert (
        out.split() == "refused dict_key refused frozenset refused set_call refused torch_size depth 100 freed".split()
    )


# ------------------------------------------------------------------ safetensors and GGUF headers that lie


def _st(header, data: bytes = b"") -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def _u8(offsets, shape=None) -> dict:
    return {"dtype": "U8", "shape": shape if shape is not None else [offsets[1] - offsets[0]], "data_offsets": offsets}


SAFETENSORS_LIES = dict(
    [
        (_st({"a": _u8([0, 2]), "b": _u8([1, 3])}, b"123"), r"tensor 'b' at data_offsets \[1, 3\) overlaps tensor 'a'"),
        (_st({"a": _u8([0, 2]), "b": _u8([0, 2])}, b"12"), r"tensor '[ab]' at data_offsets \[0, 2\) overlaps"),
        (
            _st({"a": _u8([0, 2]), "b": _u8([3, 5])}, b"12345"),
            r"tensor 'b' .* leaves a gap of 1 bytes after tensor 'a'",
        ),
        (_st({"a": _u8([0, 2])}, b"123"), r"1 bytes after the last tensor"),
        (
            _st(
                b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
                b"1",
            ),
            r"duplicate keys \['a'\]",
        ),
        (_st(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"), r"header nests 100001 levels deep \(at most 64\)"),
        (_st({"a": _u8([0, 1], [True])}, b"1"), r"'a' has invalid shape \[true\]|'a' has invalid shape \[True\]"),
        (_st({"a": _u8([0, 1], [1.0])}, b"1"), r"'a' has invalid shape \[1.0\]"),
        (_st({"a": _u8([0, 0], [0, 1 << 40, 1 << 40])}), r"'a' has invalid shape"),
        (_st({"a": _u8([0, 0], [1] * 65)}), r"'a' has invalid shape"),
        (_st({"a": _u8([0, 1 << 64])}), r"'a' has invalid shape|invalid data_offsets"),
        (
            _st({"a": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}, bytes(4)),
            r"'a' has unknown dtype \['F32'\]",
        ),
        (_st({"__metadata__": {"k": 1}}), r"__metadata__ must map strings to strings"),
    ]
)


@pytest.mark.parametrize("case", range(len(SAFETENSORS_LIES)))
def test_safe_load_refuses_lying_headers(tmp_path, case):
    data, match = list(SAFETENSORS_LIES.items())[case]
    (tmp_path / "bad.safetensors").write_bytes(data)
    with pytest.raises(ValueError, match=r"bad.safetensors: .*" + match):
        safe_load(tmp_path / "bad.safetensors")
    with pytest.raises(ValueError, match=match):
        safe_load_metadata(tmp_path / "bad.safetensors")


def test_safe_load_refuses_header_over_the_format_limit(tmp_path):
    with open(tmp_path / "huge.safetensors", "wb") as f:  # sparse: nothing is written past the length
        f.write(struct.pack("<Q", 200_000_000))
        f.truncate(200_000_100)
    with pytest.raises(ValueError, match=r"huge.safetensors: header length 200000000 exceeds the format's limit"):
        safe_load(tmp_path / "huge.safetensors")


def _gguf_header(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def _gguf_str(s: str) -> bytes:
    return struct.pack("<Q", len(s.encode())) + s.encode()


def _gguf_tensor(name: str, dims, ggml_type: int, offset: int) -> bytes:
    return (
        _gguf_str(name)
        + struct.pack("<I", len(dims))
        + struct.pack(f"<{len(dims)}Q", *dims)
        + struct.pack("<IQ", ggml_type, offset)
    )


def _gguf_file(kv: bytes, n_kv: int, tensors: list[bytes], data: bytes = b"") -> bytes:
    head = _gguf_header(len(tensors), n_kv) + kv + b"".join(tensors)
    return head + b"\0" * (-len(head) % 32) + data


def _nested_arrays(depth: int) -> bytes:
    # an array of one array of one array ... of zero uint8
    return struct.pack("<I", 9) + (struct.pack("<IQ", 9, 1) * depth) + struct.pack("<IQ", 0, 0)


GGUF_LIES = dict(
    [
        (_gguf_header(1 << 60, 0), r"tensor count 1152921504606846976 and metadata count 0 cannot fit"),
        (_gguf_header(0, 1 << 62), r"tensor count 0 and metadata count 4611686018427387904 cannot fit"),
        (_gguf_file(_gguf_str("k") + _nested_arrays(100_000), 1, []), r"array 'k' nests arrays more than 8 deep"),
        (
            _gguf_file(_gguf_str("k") + struct.pack("<IIQ", 9, 8, 1 << 61), 1, []),
            r"array length of 'k' is 2305843009213693952 but only \d+ bytes follow",
        ),
        (_gguf_file(_gguf_str("k") + struct.pack("<IIQ", 9, 77, 0), 1, []), r"array 'k' has unknown item type 77"),
        (
            _gguf_file(_gguf_str("k") + struct.pack("<IB", 0, 1) + _gguf_str("k") + struct.pack("<IB", 0, 2), 2, []),
            r"metadata key 'k' appears twice",
        ),
        (_gguf_file(b"", 0, [_gguf_tensor("w", [1] * 5, 0, 0)]), r"tensor 'w' has rank 5; ggml allows at most 4"),
        (_gguf_file(b"", 0, [_gguf_tensor("w", [1 << 40, 1 << 40], 0, 0)]), r"tensor 'w' has an absurd shape"),
        (
            _gguf_file(b"", 0, [_gguf_tensor("w", [2], 0, 0), _gguf_tensor("w", [2], 0, 8)], bytes(16)),
            r"tensor names \['w'\] appear more than once",
        ),
        (
            _gguf_file(b"", 0, [_gguf_tensor("a", [4], 0, 0), _gguf_tensor("b", [4], 0, 8)], bytes(24)),
            r"tensor 'b' at data offset 8 overlaps tensor 'a' \(ending at 16\)",
        ),
        (_gguf_file(b"", 0, [_gguf_tensor("w", [4], 0, 1 << 63)], bytes(16)), r"truncated: tensor 'w'"),
        (
            _gguf_file(_gguf_str("general.alignment") + struct.pack("<II", 4, 24), 1, []),
            r"general.alignment 24 is not a power of two",
        ),
    ]
)


@pytest.mark.parametrize("case", range(len(GGUF_LIES)))
def test_gguf_load_refuses_lying_headers(tmp_path, case):
    data, match = list(GGUF_LIES.items())[case]
    (tmp_path / "bad.gguf").write_bytes(data)
    with pytest.raises(ValueError, match=r"bad.gguf: " + match):
        gguf_load(tmp_path / "bad.gguf")


# ------------------------------------------------------------------ files that shrink after loading (SIGBUS)


def test_files_cut_short_after_loading_raise_instead_of_crashing(tmp_path):
    out = run_isolated(
        """
        import os, pathlib, sys, numpy as np, torch
        from fusegrad import Tensor
        from fusegrad.nn.state import safe_load, safe_save, torch_load, gguf_load
        d = pathlib.Path(sys.argv[1])
        big = np.arange(1 << 18, dtype=np.float32)  # 1 MB: many pages past the cut
        safe_save({"w": Tensor(big)}, d / "w.safetensors")
        torch.save({"w": torch.from_numpy(big)}, d / "w.pt")
        (d / "raw.bin").write_bytes(big.tobytes())
        (d / "raw2.bin").write_bytes(big.tobytes())

        def cut_then_read(path, load, read):
            value = load(path)
            os.truncate(path, 4096)
            try:
                read(value)
            except ValueError as e:
                assert str(path) in str(e) and "changed on disk" in str(e), e
                print("refused", path.name)
            else:
                raise AssertionError(f"{path}: read past the end of a cut file")

        cut_then_read(d / "w.safetensors", safe_load, lambda sd: sd["w"].numpy())
        cut_then_read(d / "w.pt", torch_load, lambda sd: sd["w"].to("CPU").realize())
        cut_then_read(d / "raw.bin", Tensor, lambda t: t.numpy())
        cut_then_read(d / "raw2.bin", lambda p: Tensor(p)[-8:], lambda t: t.to("CPU").numpy())
        # a file cut while a loader is still reading its header is refused too
        safe_save({"w": Tensor(big)}, d / "w2.safetensors")
        sd = safe_load(d / "w2.safetensors")
        os.truncate(d / "w2.safetensors", 100)
        try:
            safe_load(d / "w2.safetensors")
        except ValueError as e:
            print("refused reload")
        """,
        str(tmp_path),
    )
    assert out.split("\n")[:5] == [
        "refused w.safetensors",
        "refused w.pt",
        "refused raw.bin",
        "refused raw2.bin",
        "refused reload",
    ]


# ------------------------------------------------------------------ fuzzing (bounded: a few seconds)

FUZZ = """
import collections, os, pathlib, random, sys, zipfile, numpy as np
from fusegrad import Tensor, dtypes
from fusegrad.nn import state
from fusegrad.nn.quantized import GGML_TYPES
from fusegrad.nn.state.safetensors import SAFETENSORS_DTYPES
from fusegrad.nn.state.torch_formats import TORCH_DTYPES
d = pathlib.Path(sys.argv[1])
kind = sys.argv[2]
rng = random.Random(1234)

def snapshot():
    return (
        {k: (v.priority, v.bitsize, v.name, v.fmt, v.kind, v.attr) for k, v in dtypes.fields().items()},
        dict(TORCH_DTYPES), dict(SAFETENSORS_DTYPES), dict(GGML_TYPES),
        [(np.dtype(c).byteorder, np.dtype(c).itemsize, np.dtype(c).kind) for c in "?bBhHiIlLqQefdgFDO"],
    )

BEFORE = snapshot()
counts = collections.Counter()

def use(x, depth=0):
    # realize every tensor in the result: a lazily read tensor must be readable (or refused), never crash
    if depth > 20:
        return
    if isinstance(x, Tensor):
        x.to("CPU").numpy()
    elif isinstance(x, dict):
        for v in list(x.values())[:50]:
            use(v, depth + 1)
    elif isinstance(x, (list, tuple)):
        for v in list(x)[:50]:
            use(v, depth + 1)

def attempt(load, data, label):
    path = d / f"case.{kind}"
    path.write_bytes(data)
    try:
        use(load(path))
        counts["ok"] += 1
    except ValueError:
        counts["ValueError"] += 1
    except NotImplementedError:
        counts["NotImplementedError"] += 1
    except BaseException as e:
        print(f"{label}: {type(e).__name__}: {e}"[:2000])
        raise SystemExit(1)
    if snapshot() != BEFORE:
        print(f"{label}: a global changed")
        raise SystemExit(1)

def flips(data, n, lo=0, hi=None):
    hi = len(data) if hi is None else hi
    for i in range(n):
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(lo, hi)
            b[at] = rng.choice((0, 0xFF, rng.randrange(256), b[at] ^ (1 << rng.randrange(8))))
        yield f"flip#{i}", bytes(b)

def cuts(data, step=1):
    for n in range(0, len(data), step):
        yield f"cut@{n}", data[:n]

load = {"pt": state.torch_load, "safetensors": state.safe_load, "gguf": lambda p: state.gguf_load(p)[1]}[kind]
seed = (d / f"seed.{kind}").read_bytes()
if kind == "pt" and seed[:2] == b"PK":
    # mutate the pickle inside the zip: its opcodes, not the zip's checksums, are what the unpickler sees
    with zipfile.ZipFile(d / f"seed.{kind}") as zf:
        names = zf.namelist()
        members = {n: zf.read(n) for n in names}
    pkl = next(n for n in names if n.endswith("data.pkl"))
    opcodes = b"}](tb.sRNQ\\x81\\x85\\x86\\x87\\x8c\\x93\\x94hqjr" + b"cK"
    def variants():
        for i in range(int(sys.argv[3])):
            b = bytearray(members[pkl])
            for _ in range(rng.randint(1, 3)):
                at = rng.randrange(len(b))
                op = rng.randrange(3)
                if op == 0:
                    b[at] = rng.randrange(256)
                elif op == 1:
                    b[at:at] = bytes([rng.choice(opcodes)])
                else:
                    del b[at : at + rng.randint(1, 4)]
            yield f"pkl#{i}", bytes(b)
    for label, mutated in variants():
        out = d / "tmp.zip"
        with zipfile.ZipFile(out, "w") as zf:
            for n in names:
                zf.writestr(n, mutated if n == pkl else members[n])
        attempt(load, out.read_bytes(), label)
for label, data in cuts(seed, int(sys.argv[4])):
    attempt(load, data, label)
for label, data in flips(seed, int(sys.argv[3])):
    attempt(load, data, label)
print(dict(counts))
"""


def _fuzz_seeds(tmp_path):
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    obj = collections.OrderedDict(
        w=w,
        t=w.t(),
        i=torch.tensor([1, -2], dtype=torch.int64),
        h=torch.ones(2, dtype=torch.float16),
        step=3,
        n=np.arange(3),
    )
    torch.save(obj, tmp_path / "zip" / "seed.pt")
    torch.save(obj, tmp_path / "legacy" / "seed.pt", _use_new_zipfile_serialization=False)
    safe_save(
        {"a": Tensor([[1.0, 2.0]]), "b": Tensor([3, 4], dtype=dtypes.int16)}, tmp_path / "st" / "seed.safetensors"
    )
    writer = gguf.GGUFWriter(tmp_path / "gguf" / "seed.gguf", "llama")
    writer.add_array("ints", [1, 2]), writer.add_string("s", "x"), writer.add_array("strs", ["a", "b"])
    writer.add_tensor("w", np.arange(8, dtype=np.float32))
    writer.add_tensor("q", np.zeros((1, 34), np.uint8), raw_shape=(1, 34), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()


@pytest.mark.parametrize(
    "sub, kind, mutations, cut_step",
    [("zip", "pt", 150, 97), ("legacy", "pt", 150, 3), ("st", "safetensors", 150, 1), ("gguf", "gguf", 150, 1)],
)
def test_fuzz_loaders_never_crash_or_change_globals(tmp_path, sub, kind, mutations, cut_step):
    for s in ("zip", "legacy", "st", "gguf"):
        (tmp_path / s).mkdir()
    _fuzz_seeds(tmp_path)
    out = run_isolated(FUZZ, str(tmp_path / sub), kind, str(mutations), str(cut_step))
    counts = eval(out.strip().splitlines()[-1])  # noqa: S307 - our own subprocess's dict literal
    assert counts.get("ok", 0) >= 1 and counts.get("ValueError", 0) >= 10, counts
