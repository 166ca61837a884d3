"""OnnxRunner on small hand-built models: values against numpy, dynamic dims, shape folding, and clear errors for
bad inputs and bad files."""

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fusegrad import GlobalCounters, Tensor
from fusegrad.helpers import Context
from fusegrad.onnx import OnnxRunner
from fusegrad.onnx.__main__ import main


def _model(nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _mlp():
    """y = relu(x @ w + b).reshape(batch, 2, 2) with the target shape computed in the graph from Shape(x)."""
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4) / 10, "w")
    b = numpy_helper.from_array(np.array([-1, 0, 1, 2], dtype=np.float32), "b")
    tail = numpy_helper.from_array(np.array([2, 2], dtype=np.int64), "tail")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "one"], ["n"]),
        helper.make_node("Concat", ["n", "tail"], ["target"], axis=0),
        helper.make_node("Reshape", ["r", "target"], ["y"]),
    ]
    zero = numpy_helper.from_array(np.array([0], dtype=np.int64), "zero")
    one = numpy_helper.from_array(np.array([1], dtype=np.int64), "one")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, 2])
    return _model(nodes, [x], [y], [w, b, tail, zero, one])


def _mlp_ref(x):
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    return np.maximum(x @ w + np.array([-1, 0, 1, 2], np.float32), 0).reshape(len(x), 2, 2)


@pytest.mark.parametrize("batch", [1, 5])
def test_symbolic_batch_and_folded_shapes(batch):
    runner = OnnxRunner(_mlp().SerializeToString())
    x = np.random.default_rng(batch).standard_normal((batch, 3)).astype(np.float32)
    GlobalCounters.reset()
    out = runner({"x": x})["y"]
    np.testing.assert_allclose(out.numpy(), _mlp_ref(x), rtol=1e-6, atol=1e-6)
    # Shape → Slice → Concat → Reshape folded on the host: the math is one fused kernel (plus the input copy)
    assert GlobalCounters.kernel_count <= 2


def test_tensor_input_and_path(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(_mlp(), path)
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(OnnxRunner(str(path))({"x": Tensor(x)})["y"].numpy(), _mlp_ref(x), rtol=1e-6)


def test_bad_inputs_name_what_the_model_expects():
    runner = OnnxRunner(_mlp())
    with pytest.raises(ValueError, match=r"unknown input\(s\) \['z'\]; the model takes \['x'\]"):
        runner({"z": np.ones((1, 3), np.float32)})
    with pytest.raises(ValueError, match=r"missing input\(s\) \['x'\]"):
        runner({})
    with pytest.raises(ValueError, match=r"input 'x' has shape \(2, 4\), the model expects \('batch', 3\)"):
        runner({"x": np.ones((2, 4), np.float32)})
    with pytest.raises(ValueError, match=r"the model expects rank 2"):
        runner({"x": np.ones((3,), np.float32)})
    with pytest.raises(ValueError, match=r"input 'x' has dtype dtypes.float64, the model expects dtypes.float32"):
        runner({"x": np.ones((2, 3), np.float64)})


def test_symbolic_dim_bound_consistently():
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n"])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])
    runner = OnnxRunner(_model([helper.make_node("Add", ["a", "b"], ["y"])], [a, b], [y]))
    np.testing.assert_allclose(runner(a=np.ones(3, np.float32), b=np.ones(3, np.float32))["y"].numpy(), [2, 2, 2])
    with pytest.raises(ValueError, match=r"dim 'n' is 4 here but 3 in another input"):
        runner(a=np.ones(3, np.float32), b=np.ones(4, np.float32))


def test_unsupported_op_fails_at_load_naming_op_and_node():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    m = _model([helper.make_node("FancyOp", ["x"], ["y"], name="my_node", domain="custom.domain")], [x], [y])
    m.opset_import.append(helper.make_opsetid("custom.domain", 1))
    with pytest.raises(NotImplementedError, match=r"'FancyOp'.*'my_node'"):
        OnnxRunner(m)
    s = helper.make_tensor_value_info("s", TensorProto.STRING, [2])
    with pytest.raises(NotImplementedError, match=r"input 's'.*STRING"):
        OnnxRunner(_model([helper.make_node("Identity", ["s"], ["y"])], [s], [y]))


def test_truncated_and_malformed_protobuf():
    data = _mlp().SerializeToString()
    with pytest.raises(ValueError, match="not a valid ONNX protobuf|holds no ONNX graph"):
        OnnxRunner(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a valid ONNX protobuf|holds no ONNX graph"):
        OnnxRunner(b"\xff\xff\xff\xff garbage")
    with pytest.raises(ValueError, match="does not exist"):
        OnnxRunner("/nonexistent/model.onnx")


def test_cycle_and_undefined_name():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    loop = [helper.make_node("Add", ["x", "b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2")]
    with pytest.raises(ValueError, match="cycle"):
        OnnxRunner(_model(loop + [helper.make_node("Relu", ["b"], ["y"])], [x], [y]))
    with pytest.raises(ValueError, match="reads 'ghost', which is undefined"):
        OnnxRunner(_model([helper.make_node("Add", ["x", "ghost"], ["y"])], [x], [y]))


def test_short_initializer():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4], raw_data=np.ones(2, np.float32).tobytes())
    with pytest.raises(ValueError, match=r"tensor 'w' of shape \[4\] needs 16 B of data, has 8"):
        OnnxRunner(_model([helper.make_node("Add", ["x", "w"], ["y"])], [x], [y], [w]))


def _external_model(location: str):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", "16")):
        e = w.external_data.add()
        e.key, e.value = k, v
    return _model([helper.make_node("Add", ["x", "w"], ["y"])], [x], [y], [w])


def test_external_data(tmp_path):
    (tmp_path / "m").mkdir()
    np.arange(4, dtype=np.float32).tofile(tmp_path / "m" / "w.bin")
    np.arange(4, dtype=np.float32).tofile(tmp_path / "secret.bin")
    onnx.save(_external_model("w.bin"), tmp_path / "m" / "ok.onnx")
    out = OnnxRunner(str(tmp_path / "m" / "ok.onnx"))({"x": np.ones(4, np.float32)})["y"]
    np.testing.assert_allclose(out.numpy(), [1, 2, 3, 4])
    for bad in ("../secret.bin", os.fspath(tmp_path / "secret.bin")):
        onnx.save(_external_model(bad), tmp_path / "m" / "bad.onnx")
        with pytest.raises(ValueError, match="leaves the model folder"):
            OnnxRunner(str(tmp_path / "m" / "bad.onnx"))
    onnx.save(_external_model("missing.bin"), tmp_path / "m" / "gone.onnx")
    with pytest.raises(ValueError, match="does not exist"):
        OnnxRunner(str(tmp_path / "m" / "gone.onnx"))


def test_if_and_loop_subgraphs():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    c = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    then_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["t"])], "t", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])]
    )
    else_g = helper.make_graph(
        [helper.make_node("Exp", ["x"], ["e"])], "e", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3])]
    )
    m = _model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)], [x, c], [y])
    runner = OnnxRunner(m)
    v = np.array([0.5, -1, 2], np.float32)
    np.testing.assert_allclose(runner(x=v, c=np.array(True))["y"].numpy(), -v)
    np.testing.assert_allclose(runner(x=v, c=np.array(False))["y"].numpy(), np.exp(v), rtol=1e-6)


def test_cli(tmp_path, capsys):
    onnx.save(_mlp(), tmp_path / "mlp.onnx")
    np.save(tmp_path / "x.npy", np.ones((4, 3), np.float32))
    assert main([str(tmp_path / "mlp.onnx"), "--input", f"x={tmp_path / 'x.npy'}", "--bench", "2"]) == 0
    out = capsys.readouterr().out
    assert "y: shape=(4, 2, 2) dtype=dtypes.float32" in out and "median of 2 runs" in out
    assert main([str(tmp_path / "mlp.onnx"), "--input", f"q={tmp_path / 'x.npy'}"]) == 1
    assert "unknown input(s) ['q']" in capsys.readouterr().err
    assert main([str(tmp_path / "mlp.onnx")]) == 1  # 'batch' is free: the model needs the input given
    assert "give it with --input x=" in capsys.readouterr().err


def _transposed_weight_model():
    """y = x @ w.T with w an initializer that is also a graph input (so a caller may override it)."""
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])
    wi = helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
    nodes = [helper.make_node("Transpose", ["w"], ["wt"]), helper.make_node("MatMul", ["x", "wt"], ["y"])]
    return _model(nodes, [x, wi], [y], [w])


def test_constant_subgraphs_fold_at_load_and_overrides_still_count():
    runner = OnnxRunner(_transposed_weight_model())
    assert [s.node.op_type for s in runner.graph.steps] == ["MatMul"]  # the Transpose ran once, at load
    x = np.array([[1, 2, 3]], np.float32)
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(runner({"x": x})["y"].numpy(), x @ w.T)
    np.testing.assert_allclose(runner({"x": x, "w": -w})["y"].numpy(), x @ -w.T)


def test_runner_under_tinyjit():
    from fusegrad import TinyJit

    runner = OnnxRunner(_mlp())
    step = TinyJit(lambda x: runner({"x": x})["y"].realize())
    rng = np.random.default_rng(0)
    for _ in range(4):  # capture on the second call, replay after it
        x = rng.standard_normal((3, 3)).astype(np.float32)
        np.testing.assert_allclose(step(Tensor(x)).numpy(), _mlp_ref(x), rtol=1e-6, atol=1e-6)


def test_runner_under_tinyjit_captures_the_plain_calls_kernels():
    """The runner keeps no intermediate tensor alive after a call: TinyJit's capture realizes every lazy tensor left
    alive, which would add an unfused pass over the graph to each replay."""
    from fusegrad import TinyJit

    runner = OnnxRunner(_mlp())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with Context(ONNX_REPLAY=0):  # the plain call's kernels, not a replay's (tests/onnx/test_replay.py)
        runner({"x": x})["y"].realize()
        GlobalCounters.reset()
        runner({"x": x})["y"].realize()
        plain = GlobalCounters.kernel_count
    step = TinyJit(lambda t: runner({"x": t})["y"].realize())
    for _ in range(3):
        np.testing.assert_allclose(step(Tensor(x)).numpy(), _mlp_ref(x), rtol=1e-6, atol=1e-6)
    assert len(step.captured.launches) == plain, (len(step.captured.launches), plain)


def test_a_computed_output_read_twice_is_stored_once():
    """An output several nodes read (DenseNet's concat chain: each concat is read by the next one and by a layer) is
    stored when computed, so its readers load it instead of computing it again through the chain; one read once, or
    a view (a Reshape), stays lazy."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 48, 48])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 48, 48])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 2304])
    shape = numpy_helper.from_array(np.array([2, 2304], dtype=np.int64), "shape")
    nodes = [helper.make_node("Neg", ["x"], ["r0"])]
    for k in range(1, 4):  # c_k = Concat(c_{k-1}, Neg(c_{k-1})), c_0 = x
        prev = "x" if k == 1 else f"c{k - 1}"
        if k > 1:
            nodes.append(helper.make_node("Neg", [prev], [f"r{k - 1}"]))
        nodes.append(helper.make_node("Concat", [prev, f"r{k - 1}"], [f"c{k}"], axis=1))
    nodes.append(helper.make_node("Relu", ["c3"], ["y"]))
    nodes.append(helper.make_node("Reshape", ["x", "shape"], ["flat"]))  # read twice, a view
    nodes.append(helper.make_node("Add", ["flat", "flat"], ["z"]))
    runner = OnnxRunner(_model(nodes, [x], [y, z], [shape]))
    assert [(s.node.op_type, s.store) for s in runner.graph.steps if s.store] == [("Concat", True)] * 2
    xn = np.arange(2 * 48 * 48, dtype=np.float32).reshape(1, 2, 48, 48) - 2000
    ref = xn
    for _ in range(3):
        ref = np.concatenate([ref, -ref], axis=1)
    with Context(ONNX_REPLAY=0):  # the plain call's kernels, not a replay's
        Tensor.realize(*runner({"x": xn}).values())
        GlobalCounters.reset()
        out = runner({"x": xn})
        Tensor.realize(*out.values())
    np.testing.assert_array_equal(out["y"].numpy(), np.maximum(ref, 0))
    np.testing.assert_array_equal(out["z"].numpy(), 2 * xn.reshape(2, 2304))
    assert GlobalCounters.kernel_count == 6  # c1, c2 stored (a kernel per piece); c3 inside y's kernel; z


def test_a_residual_chain_stores_each_shared_sum():
    """ShuffleNet's units: h_k = Relu(Sum(f(h_{k-1}), h_{k-1})) is read by the next unit's f and its Sum; each is
    stored, or the k-th Sum would compute every unit before it again."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])
    nodes = []
    for k in range(1, 5):
        prev = "x" if k == 1 else f"h{k - 1}"
        nodes.append(helper.make_node("Sigmoid", [prev], [f"f{k}"]))
        nodes.append(helper.make_node("Sum", [f"f{k}", prev], [f"s{k}"]))
        nodes.append(helper.make_node("Relu", [f"s{k}"], ["y" if k == 4 else f"h{k}"]))
    runner = OnnxRunner(_model(nodes, [x], [y]))
    assert [s.node.op_type for s in runner.graph.steps if s.store] == ["Relu"] * 3
    xn = np.linspace(-3, 3, 64 * 64, dtype=np.float32).reshape(64, 64)
    ref = xn
    for _ in range(4):
        ref = np.maximum(1 / (1 + np.exp(-ref)) + ref, 0)
    with Context(ONNX_REPLAY=0):  # the plain call's kernels, not a replay's
        runner({"x": xn})["y"].realize()
        GlobalCounters.reset()
        np.testing.assert_allclose(runner({"x": xn})["y"].numpy(), ref, rtol=1e-6, atol=1e-6)
    assert GlobalCounters.kernel_count == 4


def test_det_against_numpy():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    runner = OnnxRunner(_model([helper.make_node("Det", ["x"], ["y"])], [x], [y]))
    a = np.random.default_rng(1).standard_normal((4, 5, 5)).astype(np.float32)
    a[1, 0] = 0  # a zero first column entry forces a row swap
    a[2, 3] = a[2, 1]  # a singular matrix
    a[3] = np.triu(a[3])
    np.testing.assert_allclose(runner({"x": a})["y"].numpy(), np.linalg.det(a.astype(np.float64)), rtol=1e-4, atol=1e-4)
