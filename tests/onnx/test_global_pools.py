"""ONNX's global pools (fusegrad/onnx/ops/nn.py): values equal numpy's (NaN, infinities, 3-D to 5-D inputs), and with
constant dims the kernel reduces the spatial dims as one flattened axis."""

import numpy as np
import pytest
from onnx import TensorProto, helper

from fusegrad.onnx import OnnxRunner
from fusegrad.runtime.device import Device
from fusegrad.schedule import create_schedule
from fusegrad.uop.ops import Ops


def _model(op: str, shape):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node(op, ["r"], ["y"])]
    g = helper.make_graph(nodes, "g", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


REFS = {"GlobalAveragePool": np.mean, "GlobalMaxPool": np.max}


@pytest.mark.parametrize("op", list(REFS))
@pytest.mark.parametrize("shape", [(2, 5, 7), (1, 6, 13, 13), (2, 3, 4, 5, 6)])
def test_values_equal_numpy(op, shape):
    xn = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    xn.reshape(-1)[[1, 40]] = [np.nan, np.inf]
    got = OnnxRunner(_model(op, list(shape)))({"x": xn})["y"].numpy()
    want = REFS[op](np.maximum(xn, 0), axis=tuple(range(2, len(shape))), keepdims=True)
    want.reshape(-1)[0] = np.nan  # the NaN's channel, in both pools
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    symbolic = OnnxRunner(_model(op, ["n", shape[1]] + ["s"] * (len(shape) - 2)))
    if len(set(shape[2:])) == 1:  # one symbol for every spatial dim: the dims must be equal
        np.testing.assert_allclose(symbolic({"x": xn})["y"].numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", list(REFS))
def test_the_spatial_dims_are_one_reduced_axis(op):
    xn = np.ones((1, 8, 13, 13), np.float32)
    y = OnnxRunner(_model(op, [1, 8, 13, 13]))
    out = y({"x": xn})["y"]
    items, _, _ = create_schedule([out.uop], [Device["CPU"]])
    reduces = [u for u in items[-1].ast.toposort() if u.op is Ops.REDUCE_AXIS]
    assert len(reduces) == 1 and len(reduces[0].arg[1]) == 1, reduces
    assert reduces[0].src[0].shape[reduces[0].arg[1][0]] == 169
