"""ONNX op paths the backend suite leaves out, on hand-built models against numpy: Scan before opset 9 with
sequence_lens and a reversed input."""

import numpy as np
import onnx.parser
from onnx import TensorProto, helper

from fusegrad.onnx import OnnxRunner


def _scan8_model(directions: list[int]):
    node = onnx.parser.parse_node(
        """
        y, z = Scan (lens, initial, x) <
            num_scan_inputs = 1,
            body = scan_body (float[2] sum_in, float[2] next) => (float[2] sum_out, float[2] scan_out)
            {
                sum_out = Add(sum_in, next)
                scan_out = Identity(sum_out)
            }
        >
        """
    )
    node.attribute.append(helper.make_attribute("directions", directions))
    vi = helper.make_tensor_value_info
    g = helper.make_graph(
        [node],
        "g",
        [
            vi("lens", TensorProto.INT64, [2]),
            vi("initial", TensorProto.FLOAT, [2, 2]),
            vi("x", TensorProto.FLOAT, [2, 3, 2]),
        ],
        [vi("y", TensorProto.FLOAT, [2, 2]), vi("z", TensorProto.FLOAT, [2, 3, 2])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 8)])


def _scan8_ref(lens, initial, x, reverse: bool):
    ys, zs = [], []
    for b, steps in enumerate(lens):
        seq = x[b, :steps][::-1] if reverse else x[b, :steps]
        sums = initial[b] + np.cumsum(seq, axis=0)
        ys.append(sums[-1] if steps else initial[b])
        zs.append(np.concatenate([sums, np.zeros((x.shape[1] - steps, 2), np.float32)]))
    return np.stack(ys), np.stack(zs)


def test_scan8_sequence_lens_and_directions():
    rng = np.random.default_rng(0)
    lens = np.array([3, 2], np.int64)
    initial = rng.standard_normal((2, 2)).astype(np.float32)
    x = rng.standard_normal((2, 3, 2)).astype(np.float32)
    for reverse in (False, True):
        out = OnnxRunner(_scan8_model([int(reverse)]))({"lens": lens, "initial": initial, "x": x})
        y, z = _scan8_ref(lens, initial, x, reverse)
        np.testing.assert_allclose(out["y"].numpy(), y, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(out["z"].numpy(), z, rtol=1e-6, atol=1e-6)
