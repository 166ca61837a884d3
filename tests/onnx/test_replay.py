"""OnnxRunner's replay of repeated calls (fusegrad/onnx/replay.py): values against numpy on every call, outputs that a
later call does not overwrite, a plain run for models that read data into Python, and ONNX_REPLAY=0."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from fusegrad import GlobalCounters, Tensor, TinyJit
from fusegrad.helpers import Context
from fusegrad.onnx import OnnxRunner
from fusegrad.onnx.replay import PLAIN


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


W = (np.arange(12, dtype=np.float32).reshape(3, 4) - 5) / 7


def _dense():
    """y = relu(x @ W) and z = sum(x) over a symbolic batch."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Relu", ["xw"], ["y"]),
        helper.make_node("ReduceSum", ["x"], ["z"], keepdims=0),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [])
    return _model(nodes, [x], [y, z], [numpy_helper.from_array(W, "w")])


def _check(outs, x):
    np.testing.assert_allclose(outs["y"].numpy(), np.maximum(x @ W, 0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(outs["z"].numpy(), x.sum(), rtol=1e-5)


def test_every_call_is_right_and_keeps_its_outputs():
    runner = OnnxRunner(_dense())
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((5, 3)).astype(np.float32) for _ in range(6)]
    kept = []
    for x in xs:
        outs = runner({"x": x})
        _check(outs, x)
        kept.append(outs)
    for outs, x in zip(kept, xs):  # a replay writes new buffers: the earlier calls' outputs are unchanged
        _check(outs, x)
    assert len(runner._replays.kept) == 1


def test_a_replay_builds_no_graph(monkeypatch):
    runner = OnnxRunner(_dense())
    runs = []
    plain_run = runner.run_graph
    monkeypatch.setattr(runner, "run_graph", lambda *a: runs.append(1) or plain_run(*a))
    x = np.ones((2, 3), np.float32)
    for _ in range(3):  # plain, then the TinyJit's run and its capture
        runner({"x": x})
    assert len(runs) == 3
    GlobalCounters.reset()
    _check(runner({"x": x + 1}), x + 1)
    assert len(runs) == 3 and GlobalCounters.kernel_count > 0


def test_a_new_signature_runs_and_replays_on_its_own():
    runner = OnnxRunner(_dense())
    rng = np.random.default_rng(1)
    for _ in range(4):
        for batch in (1, 7):
            x = rng.standard_normal((batch, 3)).astype(np.float32)
            _check(runner({"x": x}), x)
    assert len(runner._replays.kept) == 2
    x = rng.standard_normal((7, 3)).astype(np.float64)
    with pytest.raises(ValueError, match="dtype"):  # bad input still fails with the runner's own error
        runner({"x": x})


def test_tensor_inputs_replay_too():
    runner = OnnxRunner(_dense())
    for i in range(4):
        x = np.full((3, 3), i - 1.5, np.float32)
        _check(runner({"x": Tensor(x)}), x)


def _nonzero():
    """y = NonZero(x): its output shape depends on x's values, so no replay can repeat it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [1, None])
    return _model([helper.make_node("NonZero", ["x"], ["y"])], [x], [y])


def test_a_data_dependent_model_runs_plainly():
    runner = OnnxRunner(_nonzero())
    rng = np.random.default_rng(2)
    for _ in range(5):
        x = (rng.random(6) > 0.5).astype(np.float32)
        np.testing.assert_array_equal(runner({"x": x})["y"].numpy(), np.stack(np.nonzero(x)))
    assert list(runner._replays.kept.values()) == [PLAIN]


def _reshape_by_input():
    """y = Reshape(x, shape) with the target shape a graph input: a replay must not keep the first call's value."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])
    s = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])
    return _model([helper.make_node("Reshape", ["x", "shape"], ["y"])], [x, s], [y])


def test_an_input_that_decides_a_shape_is_read_every_call():
    runner = OnnxRunner(_reshape_by_input())
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    for shape in [(3, 4), (4, 3), (6, 2), (12, 1), (1, 12), (2, 6)]:
        out = runner({"x": x, "shape": np.array(shape, np.int64)})["y"]
        np.testing.assert_array_equal(out.numpy(), x.reshape(shape))


def _if_model():
    """y = x * 2 if c else x - 1, with c a graph input."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    c = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    two = helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.float32(2)))
    one = helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.float32(1)))
    then = helper.make_graph([two, helper.make_node("Mul", ["x", "two"], ["t"])], "then", [], [_vi("t")])
    other = helper.make_graph([one, helper.make_node("Sub", ["x", "one"], ["e"])], "else", [], [_vi("e")])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    return _model([node], [x, c], [y])


def _vi(name):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [3])


def test_an_if_condition_is_read_every_call():
    runner = OnnxRunner(_if_model())
    x = np.array([1, 2, 3], np.float32)
    for c in [True, True, True, False, True, False, False]:
        out = runner({"x": x, "c": np.array(c)})["y"].numpy()
        np.testing.assert_array_equal(out, x * 2 if c else x - 1)


def test_onnx_replay_0_runs_every_call_plainly():
    runner = OnnxRunner(_dense())
    with Context(ONNX_REPLAY=0):
        for i in range(3):
            x = np.full((2, 3), float(i), np.float32)
            _check(runner({"x": x}), x)
    assert not runner._replays.kept


def test_inside_a_users_tinyjit():
    runner = OnnxRunner(_dense())
    x0 = np.ones((2, 3), np.float32)
    for _ in range(3):  # the runner's own replay is ready before the user's TinyJit calls it
        runner({"x": x0})
    step = TinyJit(lambda x: runner({"x": x})["y"].realize())
    for i in range(5):
        x = np.full((2, 3), i - 2.0, np.float32)
        np.testing.assert_allclose(step(Tensor(x)).numpy(), np.maximum(x @ W, 0), rtol=1e-6)


def _random(seed):
    """y = x + RandomUniformLike(x), seeded or not."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    attrs = {} if seed is None else {"seed": float(seed)}
    nodes = [helper.make_node("RandomUniformLike", ["x"], ["r"], **attrs), helper.make_node("Add", ["x", "r"], ["y"])]
    return _model(nodes, [x], [y])


def test_random_ops_draw_as_a_plain_call_does():
    seeded = OnnxRunner(_random(3))
    x = np.zeros(4, np.float32)
    first = seeded({"x": x})["y"].numpy()
    for _ in range(4):  # a seeded draw gives the same numbers on every call
        np.testing.assert_array_equal(seeded({"x": x})["y"].numpy(), first)
    fresh = OnnxRunner(_random(None))
    draws = [fresh({"x": x})["y"].numpy() for _ in range(4)]
    assert len({d.tobytes() for d in draws}) == 4
    assert not seeded._replays.kept and not fresh._replays.kept


def test_writing_an_input_array_after_the_call_changes_no_output():
    runner = OnnxRunner(_dense())
    for _ in range(4):  # plain, then through the replay's TinyJit
        x = np.linspace(-1, 2, 15, dtype=np.float32).reshape(5, 3)
        outs, ref = runner({"x": x}), x.copy()
        x[:] = 100  # the outputs are still lazy in the plain call
        _check(outs, ref)


def test_a_replay_copies_its_outputs_without_a_kernel():
    runner = OnnxRunner(_dense())
    x = np.ones((2, 3), np.float32)
    with Context(ONNX_REPLAY=0):
        GlobalCounters.reset()
        Tensor.realize(*runner({"x": x}).values())
        plain = GlobalCounters.kernel_count
    for _ in range(3):
        runner({"x": x})
    GlobalCounters.reset()
    outs = runner({"x": x + 1})
    assert GlobalCounters.kernel_count == plain, "the replay's kernels only: no copy kernel per output"
    again = runner({"x": x + 2})
    _check(outs, x + 1)
    _check(again, x + 2)
    assert outs["z"].shape == () and outs["y"].shape == (2, 4)


def _double(elem: int, shape):
    x = helper.make_tensor_value_info("x", elem, shape)
    y = helper.make_tensor_value_info("y", elem, shape)
    return _model([helper.make_node("Add", ["x", "x"], ["y"])], [x], [y])


@pytest.mark.parametrize(
    "elem, make",
    [
        (TensorProto.FLOAT, lambda i: (np.arange(12, dtype=np.float32).reshape(4, 3) * i).T),  # a transposed view
        (TensorProto.INT64, lambda i: np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::1] - i),
        (TensorProto.INT32, lambda i: np.full((3, 4), i, np.int32)),
        (TensorProto.FLOAT, lambda i: np.float32(i) * np.ones((3, 4), np.float32)[::-1]),  # negative strides
    ],
)
def test_input_arrays_of_any_layout_and_dtype_are_copied_in(elem, make):
    runner = OnnxRunner(_double(elem, [3, 4]))
    for i in range(4):  # plain, then through the replay's TinyJit
        x = make(i)
        out = runner({"x": x})
        ref = x + x
        x[...] = 7  # the caller's array after the call reaches no output
        np.testing.assert_array_equal(out["y"].numpy(), ref)
    scalar = OnnxRunner(_double(TensorProto.FLOAT, []))
    for i in range(3):
        np.testing.assert_array_equal(scalar({"x": np.array(i + 0.5, np.float32)})["y"].numpy(), 2 * i + 1.0)
    empty = OnnxRunner(_double(TensorProto.FLOAT, [0, 4]))
    assert empty({"x": np.zeros((0, 4), np.float32)})["y"].shape == (0, 4)
