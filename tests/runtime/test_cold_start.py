"""A cold kernel cache: the CPU graph runner compiles on a background thread while the first kernels launch one by
one, and a schedule's kernels compile on parallel compiler processes before the first one runs."""

import threading

import numpy as np
import pytest

from fusegrad import Tensor
from fusegrad.runtime import cpu_runner, ops_cpu


@pytest.fixture
def cold_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    yield tmp_path


def recorded_compiles(monkeypatch) -> list[tuple[str, str]]:
    """(what, thread name) of every compiler run from now on."""
    calls: list[tuple[str, str]] = []
    real = ops_cpu.run_compiler

    def run(argv, stdin, what):
        calls.append((what, threading.current_thread().name))
        return real(argv, stdin, what)

    monkeypatch.setattr(ops_cpu, "run_compiler", run)
    return calls


def test_runner_builds_in_the_background_while_eager_kernels_launch(cold_cache, monkeypatch):
    monkeypatch.setattr(cpu_runner, "_built", [])
    monkeypatch.setattr(cpu_runner, "_build_started", threading.Event())
    calls = recorded_compiles(monkeypatch)
    assert cpu_runner.runner_built() is False  # not in the new cache: its compile started, nothing waited for it
    x = np.linspace(-2, 3, 4099, dtype=np.float32)
    got = ((Tensor(x) * 1.3125).exp().sum() + Tensor(x).max()).numpy()  # two kernels, launched without the runner
    np.testing.assert_allclose(got, np.exp(x * np.float32(1.3125)).sum() + x.max(), rtol=1e-5)
    lib = cpu_runner.graph_library()  # waits for the background build
    assert lib is not None and cpu_runner.runner_built() is True
    assert ("compiling kernel fg_graph_runner", "fusegrad-runner-build") in calls


def test_a_cold_schedule_compiles_its_kernels_in_one_compiler_run(cold_cache, monkeypatch):
    calls = recorded_compiles(monkeypatch)
    a = np.arange(96, dtype=np.float32).reshape(8, 12) / 7
    x = Tensor(a)
    outs = [(x * 2.5625).sum(axis=0), (x - 0.8125).max(axis=1), (x * x).sum() + 0.4375]
    Tensor.realize(*outs)
    np.testing.assert_allclose(outs[0].numpy(), (a * 2.5625).sum(axis=0), rtol=1e-6)
    np.testing.assert_allclose(outs[1].numpy(), (a - 0.8125).max(axis=1), rtol=1e-6)
    np.testing.assert_allclose(outs[2].numpy(), (a * a).sum() + 0.4375, rtol=1e-6)
    kernels = [thread for what, thread in calls if what.startswith("compiling kernel") and "runner" not in what]
    assert len(kernels) == 1 and kernels[0].startswith("fusegrad-cc"), calls


def fake_infos(names: list[str]) -> list:
    from types import SimpleNamespace

    return [SimpleNamespace(name=n, lin=(), packs={}, nparams=0, outer_size=1, ops_estimate=0) for n in names]


def test_units_hold_at_most_eight_kernels_and_one_function_of_a_name(cold_cache, monkeypatch):
    from fusegrad.runtime.device import Device

    dev = Device["CPU"]
    names = [f"k{i}" for i in range(ops_cpu.KERNELS_PER_UNIT + 2)] + ["k0"]
    infos = fake_infos(names)
    # two kernels named k0 that differ in body: each unit may hold one of them
    bodies = {id(info): f"{i}" for i, info in enumerate(infos)}
    render = lambda name, lin, packs: f"void {name}(int *out) {{ out[0] = {bodies[id(by_lin[id(lin)])]}; }}\n"  # noqa: E731
    by_lin = {}
    for info in infos:
        info.lin = (object(),)
        by_lin[id(info.lin)] = info
    monkeypatch.setattr(dev.renderer, "render_kernel", render)
    monkeypatch.setattr(dev.renderer, "render_prelude", lambda lin, kernel: "")
    calls = recorded_compiles(monkeypatch)
    runs = lambda: [what for what, _ in calls if what.startswith("compiling kernel k")]  # noqa: E731
    dev.compile_ahead(infos)
    assert len(runs()) == 2, calls  # 11 kernels: 8 in one unit, the rest (the second k0 among them) in another
    for i, info in enumerate(infos):
        out = np.zeros(1, dtype=np.int32)
        program = dev.build(info)
        program.fn(out.ctypes.data, 0, 1)
        assert out[0] == i, (info.name, out[0])
    assert len(runs()) == 2, calls  # every build found its kernel compiled  # every build found its kernel compiled


def test_a_kernel_that_fails_to_compile_ahead_raises_from_its_build(cold_cache, monkeypatch):
    from fusegrad.runtime.device import Device

    dev = Device["CPU"]
    infos = fake_infos(["broken_1", "broken_2"])
    broken = lambda name, lin, packs: f"void {name}(void) {{ this is not C; }}\n"  # noqa: E731
    monkeypatch.setattr(dev.renderer, "render_kernel", broken)
    dev.compile_ahead(infos)  # the failures are quiet here...
    with pytest.raises(ops_cpu.CompileError, match="broken_1"):  # ...and reported by the build that needs the kernel
        dev.build(infos[0])
