"""ONNX op paths the backend suite leaves out, on hand-built models against numpy: Scan before opset 9 with
sequence_lens and a reversed input, TfIdfVectorizer's IDF and TFIDF modes on trigrams with skips, Gradient through
several ops, and the load-time errors for attribute values the opset-27 ops cannot run."""

import numpy as np
import onnx.parser
import pytest
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


def _tfidf_ref(x, pools, lo, hi, max_skip, indexes, weights, mode):
    """Counts by brute force over every start and skip, then IDF/TFIDF weighting and placement."""
    counts = []
    for length, grams in sorted(pools.items()):
        for g in grams:
            c = 0
            if lo <= length <= hi:
                for skip in range(max_skip + 1 if length > 1 else 1):
                    for i in range(len(x)):
                        idx = [i + j * (skip + 1) for j in range(length)]
                        c += idx[-1] < len(x) and all(x[k] == v for k, v in zip(idx, g))
            counts.append(c)
    tf = np.array(counts, np.float32)
    w = {"TF": tf, "IDF": np.minimum(tf, 1) * weights, "TFIDF": tf * weights}[mode]
    out = np.zeros(max(indexes) + 1, np.float32)
    out[indexes] = w
    return out


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
def test_tfidf_trigrams_with_skips(mode):
    pools = {1: [[3], [7]], 2: [[3, 7], [7, 7]], 3: [[3, 7, 3], [1, 3, 7]]}
    flat = [v for length in (1, 2, 3) for g in pools[length] for v in g]
    indexes, weights = [5, 0, 1, 3, 2, 4], [0.5, 2.0, 1.5, 3.0, 0.25, 1.0]
    node = helper.make_node(
        "TfIdfVectorizer", ["x"], ["y"], mode=mode, min_gram_length=1, max_gram_length=3, max_skip_count=2,
        ngram_counts=[0, 2, 6], ngram_indexes=indexes, pool_int64s=flat, weights=weights,
    )  # fmt: skip
    vi = helper.make_tensor_value_info
    g = helper.make_graph([node], "g", [vi("x", TensorProto.INT64, [12])], [vi("y", TensorProto.FLOAT, [6])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)])
    x = np.array([1, 3, 7, 3, 7, 7, 3, 1, 3, 7, 7, 3], np.int64)
    got = OnnxRunner(model)({"x": x})["y"].numpy()
    want = _tfidf_ref(x, pools, 1, 3, 2, indexes, np.array(weights, np.float32), mode)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_tfidf_strings_fail_at_load():
    node = helper.make_node(
        "TfIdfVectorizer", ["x"], ["y"], mode="TF", min_gram_length=1, max_gram_length=1, ngram_counts=[0],
        ngram_indexes=[0], pool_strings=["a"],
    )  # fmt: skip
    vi = helper.make_tensor_value_info
    g = helper.make_graph([node], "g", [vi("x", TensorProto.INT64, [3])], [vi("y", TensorProto.FLOAT, [1])])
    with pytest.raises(NotImplementedError, match="TfIdfVectorizer pool_strings"):
        OnnxRunner(helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)]))


def test_gradient_of_matmul_tanh_sum():
    """Gradient(xs=[x, w], y) of y = sum(tanh(x @ w)) against the closed form, and y itself unchanged."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Tanh", ["h"], ["t"]),
        helper.make_node("ReduceSum", ["t"], ["y"], keepdims=0),
        helper.make_node("Gradient", ["x", "w"], ["dx", "dw"], domain="ai.onnx.preview.training", xs=["x", "w"], y="y"),
    ]
    vi = helper.make_tensor_value_info
    g = helper.make_graph(
        nodes,
        "g",
        [vi("x", TensorProto.FLOAT, [3, 4]), vi("w", TensorProto.FLOAT, [4, 2])],
        [vi("y", TensorProto.FLOAT, []), vi("dx", TensorProto.FLOAT, [3, 4]), vi("dw", TensorProto.FLOAT, [4, 2])],
    )
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("ai.onnx.preview.training", 1)]
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
    out = OnnxRunner(helper.make_model(g, opset_imports=opsets))({"x": x, "w": w})
    t = np.tanh(x @ w)
    np.testing.assert_allclose(out["y"].numpy(), t.sum(), rtol=1e-5)
    np.testing.assert_allclose(out["dx"].numpy(), (1 - t * t) @ w.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["dw"].numpy(), x.T @ (1 - t * t), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "op, inputs, attrs, match",
    [
        ("LinearAttention", ["q", "k", "v"], {"q_num_heads": 1, "kv_num_heads": 1, "update_rule": "mamba"}, "mamba"),
        ("LinearAttention", ["q", "k", "v"], {"q_num_heads": 3, "kv_num_heads": 2}, "multiple of kv_num_heads"),
        ("CausalConvWithState", ["q", "k"], {"activation": "gelu"}, "activation 'gelu'"),
    ],
)
def test_opset27_attributes_fail_at_load(op, inputs, attrs, match):
    vi = helper.make_tensor_value_info
    ins = [vi(name, TensorProto.FLOAT, [1, 2, 4]) for name in inputs]
    node = helper.make_node(op, inputs, ["y"], **attrs)
    g = helper.make_graph([node], "g", ins, [vi("y", TensorProto.FLOAT, None)])
    with pytest.raises((NotImplementedError, ValueError), match=match):
        OnnxRunner(helper.make_model(g, opset_imports=[helper.make_opsetid("", 27)]))
