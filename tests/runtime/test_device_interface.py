"""The device interface (runtime/device.py): buffers copy through allocators, only host devices expose numpy views,
and the front end reaches buffers only through runtime/buffers.py."""

import ast
import pathlib
import re
import numpy as np
import pytest
from fusegrad import Tensor, dtypes
from fusegrad.runtime.buffers import Buffer, buffer_holding, view_buffer
from fusegrad.runtime.device import Allocator, Device, HostAllocator, copy_buffer

ROOT = pathlib.Path(__file__).resolve().parents[2]
FRONT_END = ["fusegrad/tensor.py", "fusegrad/gradient.py"]
FRONT_END += [
    str(p.relative_to(ROOT)) for d in ("tensor_ops", "nn") for p in sorted((ROOT / "fusegrad" / d).rglob("*.py"))
]
# what the front end may import below itself: the buffer interface and the engine's entry points
FRONT_END_MAY_IMPORT = ("fusegrad.runtime.buffers", "fusegrad.engine.")
# the places left that ask the target (the panel layouts of float and quantized weights, attention's kᵀ panels), until
# that layout is decided below the front end: the engine entry point for a panel's width, never codegen or a device
PANEL_QUERY = {"fusegrad.engine.realize.panel_columns"}
# a plain matmul's panels are the scheduler's (schedule/panels.py); these build their own layouts for a hot path
FRONT_END_TARGET_QUERIES = {f"fusegrad/{path}": PANEL_QUERY for path in ("tensor_ops/attention.py", "nn/quantized.py")}


def imported_names(path: str) -> set[str]:
    tree = ast.parse(pathlib.Path(path).read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


@pytest.mark.parametrize("path", FRONT_END)
def test_front_end_imports_no_device_module_and_no_buffer_table(path):
    root = pathlib.Path(__file__).resolve().parents[2]
    names = imported_names(str(root / path))
    assert not [n for n in names if n.startswith("fusegrad.runtime.ops_")], names
    assert not [n for n in names if n.startswith("fusegrad.schedule") and n.endswith(".buffer_of")], names
    assert "fusegrad.runtime.buffers.buffer_of" not in names
    # the copy-on-write decision is the engine's: the front end only says whether old versions are kept
    assert not [n for n in names if n.startswith("fusegrad.schedule") and n.endswith("VersionReaders")], names


def test_front_end_imports_below_it_only_buffers_and_engine_entry_points():
    assert len(FRONT_END) > 20, FRONT_END
    for path in FRONT_END:
        below = {
            n
            for n in imported_names(str(ROOT / path))
            if n.startswith(("fusegrad.schedule", "fusegrad.codegen", "fusegrad.renderer", "fusegrad.runtime"))
            and not n.startswith(FRONT_END_MAY_IMPORT)
        }
        assert not below, f"{path} imports {sorted(below)}"


def test_only_the_panel_layout_asks_the_target_and_through_the_engine():
    for path in FRONT_END:
        text = (ROOT / path).read_text()
        assert not re.search(r"""["'](CPU|LLVM|CL|CUDA|AMD)["'] *[,)]""", text), f"{path} names a device"
        asks = {n for n in imported_names(str(ROOT / path)) if n.endswith((".device_capabilities", ".panel_columns"))}
        assert asks == FRONT_END_TARGET_QUERIES.get(path, set()), f"{path} imports {sorted(asks)}"
    # models/ is on the public API and the engine: no codegen either
    assert not {n for n in imported_names(str(ROOT / "fusegrad/models/weights.py")) if n.startswith("fusegrad.codegen")}


def test_engine_reads_the_buffer_table_from_runtime_buffers():
    root = pathlib.Path(__file__).resolve().parents[2]
    for path in ("fusegrad/engine/realize.py", "fusegrad/engine/copy_on_write.py"):
        names = imported_names(str(root / path))
        assert not [
            n for n in names if n.startswith("fusegrad.schedule") and n.endswith((".buffer_of", ".base_buffer"))
        ]


def test_scheduler_imports_nothing_from_the_engine():
    root = pathlib.Path(__file__).resolve().parents[2]
    for path in (root / "fusegrad/schedule").glob("*.py"):
        assert not [n for n in imported_names(str(path)) if n.startswith("fusegrad.engine")], path


def test_every_device_is_a_compiled_device_with_an_allocator():
    for name in ("CPU", "PYTHON", "NULL"):
        dev = Device[name]
        assert isinstance(dev.allocator, Allocator) and dev.allocator.host and dev.device == name


class BytesAllocator(Allocator):
    """Device memory that is not host-visible: bytearrays behind opaque handles."""

    def __init__(self):
        self.mem: dict[int, bytearray] = {}

    def alloc(self, nbytes):
        handle = len(self.mem) + 1
        self.mem[handle] = bytearray(max(nbytes, 1))
        return handle

    def copyin(self, handle, src):
        self.mem[handle][: src.nbytes] = src.tobytes()

    def copyout(self, dst, handle):
        dst[:] = np.frombuffer(bytes(self.mem[handle][: dst.nbytes]), np.uint8)


def test_copies_between_host_and_an_opaque_device_go_through_the_allocator(monkeypatch):
    opaque = BytesAllocator()
    monkeypatch.setattr(Device["CPU:7"], "allocator", opaque)
    values = np.arange(10, dtype=np.float32) - 3.5
    host, dev, back = (
        Buffer("CPU", 10, dtypes.float32),
        Buffer("CPU:7", 10, dtypes.float32),
        Buffer("CPU", 10, dtypes.float32),
    )
    host.copyin(values)
    copy_buffer(dev, host)
    assert isinstance(dev.handle, int) and not dev.is_host
    with pytest.raises(RuntimeError, match="CPU:7 buffers live in device memory"):
        dev.host_view()
    np.testing.assert_array_equal(dev.numpy(), values)
    copy_buffer(back, dev)
    np.testing.assert_array_equal(back.host_view(), values)
    # opaque -> opaque goes through a host copy
    other = Buffer("CPU:7", 10, dtypes.float32)
    copy_buffer(other, dev)
    np.testing.assert_array_equal(other.numpy(), values)
    with pytest.raises(ValueError, match="different sizes"):
        copy_buffer(Buffer("CPU", 3, dtypes.float32), host)


def test_tensor_to_another_host_device_round_trips_exactly():
    x = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    t = Tensor(x).to("CPU:1").to("PYTHON").to("CPU")
    np.testing.assert_array_equal(t.numpy(), x)
    buf = view_buffer(t.realize().uop)
    assert buf is not None and buf.device == "CPU" and isinstance(buf.allocator, HostAllocator)


def test_a_buffer_built_from_host_data_holds_a_copy_on_host_and_opaque_devices(monkeypatch):
    # host memory gets its copy at once; an opaque device's copy waits for its allocation, and must not see later
    # writes to the caller's array either
    monkeypatch.setattr(Device["CPU:6"], "allocator", BytesAllocator())
    values = np.arange(6, dtype=np.float32) * 1.5
    on_host = buffer_holding("CPU", 6, dtypes.float32, values, owned=False)
    on_opaque = buffer_holding("CPU:6", 6, dtypes.float32, values, owned=False)
    assert on_host.is_allocated and not on_opaque.is_allocated
    expected = values.copy()
    values[:] = -1
    np.testing.assert_array_equal(on_host.numpy(), expected)
    np.testing.assert_array_equal(on_opaque.numpy(), expected)
