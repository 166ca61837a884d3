"""TinyJit's steady lane in C (engine/native_lane.py, engine/steady_lane.c): a repeated call with the same tensors
switches the TinyJit to the C call, which must behave as the Python lane does: the same results, counters and
hand-outs, and every other call (other inputs, settings, keywords, errors) on TinyJit's own path."""

import ctypes
import gc
import pickle
import threading
import weakref

import numpy as np
import pytest

from fusegrad import Context, GlobalCounters, Tensor, TinyJit
from fusegrad.engine import native_lane
from fusegrad.engine.jit_inputs import JitError
from fusegrad.engine.realize import realize_lock
from fusegrad.runtime.device import Device


@pytest.fixture(scope="module")
def native_class():
    try:
        native_lane._Build()
    except RuntimeError as e:  # no C compiler or no Python headers here: the Python lane is all there is
        pytest.skip(f"the C lane cannot build on this machine: {e}")
    cls = native_lane.built_class(TinyJit)
    assert cls is not None, "the C lane did not build although a compiler and Python.h are present"
    return cls


def on_c_lane(jit: TinyJit, *args: Tensor) -> TinyJit:
    """Call jit until its lane forms, then once more with the countdown at one: it switches to the C lane."""
    for _ in range(3):
        jit(*args)
    jit._known.lane.countdown = 1
    jit(*args)
    return jit


def test_a_repeated_call_switches_to_the_c_lane_and_computes_the_same(native_class):
    x = Tensor(np.arange(4, dtype=np.float32)).realize()
    body_runs = []

    def f(a):
        body_runs.append(1)
        return a * 2 + 1

    jit = on_c_lane(TinyJit(f), x)
    assert type(jit) is native_class and isinstance(jit, TinyJit) and type(jit).__name__ == "TinyJit"
    before_cnt = jit.cnt
    for i in range(20):
        x.assign(Tensor(np.full(4, i, np.float32))).realize()  # the same buffer, new values
        kernels = GlobalCounters.kernel_count
        out = jit(x)
        assert GlobalCounters.kernel_count - kernels == len(jit.captured.launches)  # counted as a replay counts
        np.testing.assert_array_equal(out.numpy(), np.full(4, 2 * i + 1, np.float32))
    assert len(body_runs) == 2  # warm-up and capture only
    assert jit.cnt == before_cnt + 20


def test_the_c_lane_hands_back_only_tensors_nobody_holds_or_changed(native_class):
    x = Tensor(np.ones(3, np.float32)).realize()
    jit = on_c_lane(TinyJit(lambda a: a + 1), x)
    jit(x)
    first = jit(x)  # held by this name: the next call may not hand it back
    second = jit(x)
    assert second is not first
    third = jit(x)  # `second` is held too; `first`... as well: a new one
    assert third is not first and third is not second
    del first, second, third
    again = jit(x)
    assert jit(x) is not again  # `again` is held
    changed = jit(x)
    changed.requires_grad = True  # a user's change: never handed out again
    del changed, again
    outs = [jit(x) for _ in range(3)]
    assert all(not o.requires_grad for o in outs)
    np.testing.assert_array_equal(outs[-1].numpy(), np.full(3, 2, np.float32))


def test_other_inputs_settings_and_keywords_take_the_python_path(native_class, capsys):
    x, y = Tensor(np.ones(2, np.float32)).realize(), Tensor(np.full(2, 5, np.float32)).realize()
    runs = []

    def f(a):
        runs.append(1)
        return a + 1

    jit = on_c_lane(TinyJit(f), x)
    np.testing.assert_array_equal(jit(y).numpy(), [6, 6])  # another tensor: checked and replayed by Python
    assert jit._known.uops == (y.uop,)
    for _ in range(4):
        jit(y)
    jit._known.lane.countdown = 1
    jit(y)
    assert jit._known.c_lane[0] is jit._known.lane  # the new lane was handed to C
    np.testing.assert_array_equal(jit(y).numpy(), [6, 6])
    with Context(JIT=0):
        n = len(runs)
        np.testing.assert_array_equal(jit(x).numpy(), [2, 2])
        assert len(runs) == n + 1  # JIT=0 runs the body
    capsys.readouterr()
    with Context(DEBUG=2):
        jit(y)
    assert capsys.readouterr().out  # DEBUG=2: the replay prints its kernels, through TinyJit's own path
    with pytest.raises(JitError, match="args mismatch"):
        jit(a=y)  # keywords: the Python path, which tells them from the positions captured, as before
    jit.reset()
    n = len(runs)
    jit(y)
    assert len(runs) == n + 1  # reset: the C lane sees no known call and warms up again through Python


def test_the_c_lane_goes_with_its_known_call(native_class):
    # other inputs replace the known call: its lane (and the buffers the C lane's tuple names) are not kept alive
    x, y = Tensor(np.ones(2, np.float32)).realize(), Tensor(np.full(2, 3, np.float32)).realize()
    jit = on_c_lane(TinyJit(lambda a: a * 2), x)
    lane = weakref.ref(jit._known.c_lane[0])
    np.testing.assert_array_equal(jit(y).numpy(), [6, 6])
    gc.collect()
    assert lane() is None


def test_a_switched_tinyjit_pickles_and_copies_as_a_plain_one(native_class):
    x = Tensor(np.ones(2, np.float32)).realize()
    jit = on_c_lane(TinyJit(_double), x)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        loaded = pickle.loads(pickle.dumps(jit, protocol=protocol))
        assert type(loaded) is TinyJit
        np.testing.assert_array_equal(loaded(x).numpy(), [2, 2])


def _double(a):
    return a * 2


def test_a_subclass_of_tinyjit_keeps_its_class(native_class):
    class MyJit(TinyJit):
        pass

    x = Tensor(np.ones(2, np.float32)).realize()
    jit = on_c_lane(MyJit(lambda a: a - 1), x)
    assert type(jit) is MyJit
    np.testing.assert_array_equal(jit(x).numpy(), [0, 0])


def test_calls_from_two_threads_on_the_c_lane(native_class):
    x = Tensor(np.arange(8, dtype=np.float32)).realize()
    jit = on_c_lane(TinyJit(lambda a: a * 3), x)
    errors = []

    def work():
        try:
            for _ in range(200):
                np.testing.assert_array_equal(jit(x).numpy(), np.arange(8) * 3)
        except Exception as e:  # reported below: an assert in a thread does not fail the test
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


class _Owner:
    def __init__(self):
        self.calls, self.busy, self.seen = 0, None, []

    def failed(self, err):
        raise RuntimeError(f"MPI error {err} while {self.busy}")


def test_a_watched_c_call_keeps_the_books_and_raises_its_error_with_the_lock_released(native_class):
    # a thunk described as a C function returning an int: 0 is success, anything else goes to `failed`
    lib = Device["CPU"].compiler.load("int fg_test_watched(const int *arg) { return *arg; }", "fg_test_watched")
    code = ctypes.c_int(0)
    x = Tensor(np.ones(2, np.float32)).realize()
    jit = on_c_lane(TinyJit(lambda a: a + 1), x)
    owner, busy = _Owner(), object()
    call = (
        ctypes.cast(lib.fg_test_watched, ctypes.c_void_p).value,
        ctypes.addressof(code),
        owner,
        busy,
        1,
        owner.failed,
    )
    lane = jit._known.c_lane
    jit._known.c_lane = (*lane[:3], (call, *lane[3]), *lane[4:])
    jit(x)
    assert owner.calls == 1 and owner.busy is None
    code.value = 7
    with pytest.raises(RuntimeError, match="MPI error 7 while None"):
        jit(x)
    assert owner.calls == 2 and owner.busy is None
    acquired = []
    t = threading.Thread(target=lambda: acquired.append(realize_lock.acquire(timeout=5) and realize_lock.release()))
    t.start()
    t.join()
    assert acquired == [None], "the realize lock stayed held after the error"


def test_without_the_extension_the_python_lane_goes_on(monkeypatch):
    monkeypatch.setattr(native_lane, "_state", {})

    def no_headers():
        raise RuntimeError("no Python.h (a test)")

    monkeypatch.setattr(native_lane, "_Build", no_headers)
    x = Tensor(np.ones(2, np.float32)).realize()
    jit = on_c_lane(TinyJit(lambda a: a + 2), x)
    assert type(jit) is TinyJit and native_lane._state == {"class": None}
    assert jit._known.lane.countdown == native_lane.NATIVE_AFTER  # asks again later, at no cost
    np.testing.assert_array_equal(jit(x).numpy(), [3, 3])
