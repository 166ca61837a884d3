"""RoiAlign, DeformConv, NonMaxSuppression and Unique on random inputs beyond the backend cases, against
onnxruntime, and the errors bad inputs give."""

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

from fusegrad.onnx import OnnxRunner

_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64}


def _model(op: str, feeds: dict[str, np.ndarray | None], outputs: list[str], opset: int, **attrs):
    """A one-node model over `feeds` (None: an omitted optional input); outputs named `y` are float, others int64."""
    names = [k if v is not None else "" for k, v in feeds.items()]
    node = helper.make_node(op, names, outputs, **attrs)
    ins = [helper.make_tensor_value_info(k, _TYPES[v.dtype], v.shape) for k, v in feeds.items() if v is not None]
    types = [TensorProto.FLOAT if o == "y" else TensorProto.INT64 for o in outputs]
    outs = [helper.make_tensor_value_info(o, t, None) for o, t in zip(outputs, types)]
    graph = helper.make_graph([node], "g", ins, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _both(op: str, feeds: dict, outputs: list[str], opset: int, **attrs) -> tuple[list, list]:
    model = _model(op, feeds, outputs, opset, **attrs)
    given = {k: v for k, v in feeds.items() if v is not None}
    ours = OnnxRunner(model)(given)
    ref = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, given)
    return [ours[o].numpy() for o in outputs], ref


def _rois(rng, count: int, size: float) -> np.ndarray:
    """Boxes [x1, y1, x2, y2] of random size, some reaching past the image."""
    lo = rng.uniform(-0.2 * size, 0.8 * size, (count, 2))
    return np.concatenate([lo, lo + rng.uniform(0.5, 0.7 * size, (count, 2))], 1).astype(np.float32)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ratio", [0, 2])
@pytest.mark.parametrize("opset,transform", [(16, "half_pixel"), (16, "output_half_pixel"), (10, None)])
def test_roi_align_matches_onnxruntime(mode, ratio, opset, transform):
    rng = np.random.default_rng(ratio * 7 + opset)
    x = rng.standard_normal((2, 3, 10, 12)).astype(np.float32)
    rois = _rois(rng, 7, 20.0)
    batch = rng.integers(0, 2, 7).astype(np.int64)
    attrs = dict(mode=mode, output_height=3, output_width=4, sampling_ratio=ratio, spatial_scale=0.5)
    if transform is not None:
        attrs["coordinate_transformation_mode"] = transform
    (ours,), (ref,) = _both("RoiAlign", {"x": x, "rois": rois, "b": batch}, ["y"], opset, **attrs)
    assert ours.shape == (7, 3, 3, 4)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_empty_roi_gives_zero(mode):
    # half_pixel keeps a zero-size ROI at zero size: adaptive sampling then takes no samples at all
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    feeds = {"x": x, "rois": np.array([[1, 1, 1, 1], [0, 1, 3, 4]], np.float32), "b": np.array([0, 0], np.int64)}
    (ours,), (ref,) = _both("RoiAlign", feeds, ["y"], 16, mode=mode, output_height=2, output_width=2)
    np.testing.assert_array_equal(ours[0], 0)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


def test_roi_align_batch_index_out_of_range():
    x = np.zeros((2, 1, 4, 4), np.float32)
    rois = np.array([[0, 0, 2, 2], [1, 1, 3, 3]], np.float32)
    model = _model("RoiAlign", {"x": x, "rois": rois, "b": np.array([0, 3])}, ["y"], 16)
    with pytest.raises(ValueError, match=r"batch_indices \[3\] are out of range for a batch of 2"):
        OnnxRunner(model)({"x": x, "rois": rois, "b": np.array([0, 3], np.int64)})


@pytest.mark.parametrize("group,offset_group,with_mask", [(1, 1, False), (2, 1, True), (1, 3, True), (3, 3, True)])
def test_deform_conv_matches_onnxruntime(group, offset_group, with_mask):
    rng = np.random.default_rng(group * 10 + offset_group)
    N, C, oC, H, W, k = 2, 6, 6, 9, 8, 3
    strides, pads, dilations = [2, 1], [1, 0, 2, 1], [1, 2]
    oh = (H + pads[0] + pads[2] - dilations[0] * (k - 1) - 1) // strides[0] + 1
    ow = (W + pads[1] + pads[3] - dilations[1] * (k - 1) - 1) // strides[1] + 1
    feeds = {
        "x": rng.standard_normal((N, C, H, W)).astype(np.float32),
        "w": rng.standard_normal((oC, C // group, k, k)).astype(np.float32),
        "offset": (rng.standard_normal((N, offset_group * k * k * 2, oh, ow)) * 2).astype(np.float32),
        "b": rng.standard_normal(oC).astype(np.float32),
        "mask": rng.uniform(0, 1, (N, offset_group * k * k, oh, ow)).astype(np.float32) if with_mask else None,
    }
    attrs = dict(group=group, offset_group=offset_group, strides=strides, pads=pads, dilations=dilations)
    (ours,), (ref,) = _both("DeformConv", feeds, ["y"], 19, **attrs)
    assert ours.shape == (N, oC, oh, ow)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)


def test_deform_conv_bad_offset_shape():
    x, w = np.zeros((1, 2, 5, 5), np.float32), np.zeros((2, 2, 3, 3), np.float32)
    offset = np.zeros((1, 9, 3, 3), np.float32)
    model = _model("DeformConv", {"x": x, "w": w, "offset": offset}, ["y"], 19)
    with pytest.raises(ValueError, match=r"offset has shape \(1, 9, 3, 3\), expected \(1, 18, 3, 3\)"):
        OnnxRunner(model)({"x": x, "w": w, "offset": offset})


@pytest.mark.parametrize("center_point_box", [0, 1])
@pytest.mark.parametrize("score_threshold", [None, 0.3])
def test_nms_matches_onnxruntime(center_point_box, score_threshold):
    rng = np.random.default_rng(center_point_box + 3)
    B, classes, S = 3, 4, 30
    lo = rng.uniform(0, 10, (B, S, 2))
    size = rng.uniform(1, 4, (B, S, 2))
    if center_point_box:
        boxes = np.concatenate([lo + size / 2, size], -1)
    else:  # corners in either order
        hi = lo + size
        flip = rng.uniform(size=(B, S, 1)) < 0.5
        boxes = np.concatenate([np.where(flip, hi, lo), np.where(flip, lo, hi)], -1)
    feeds = {
        "boxes": boxes.astype(np.float32),
        "scores": rng.uniform(0, 1, (B, classes, S)).astype(np.float32),
        "max_out": np.array([6], np.int64),
        "iou": np.array([0.3], np.float32),
        "score": None if score_threshold is None else np.array([score_threshold], np.float32),
    }
    (ours,), (ref,) = _both("NonMaxSuppression", feeds, ["sel"], 11, center_point_box=center_point_box)
    assert ours.dtype == np.int64 and len(ours) > B * classes  # several boxes per class survive
    np.testing.assert_array_equal(ours, ref)


def test_nms_without_limit_selects_nothing():
    feeds = {"boxes": np.zeros((1, 2, 4), np.float32), "scores": np.ones((1, 1, 2), np.float32)}
    (ours,), (ref,) = _both("NonMaxSuppression", feeds, ["sel"], 11)
    assert ours.shape == ref.shape == (0, 3)


def test_nms_bad_shapes():
    boxes, scores = np.zeros((1, 3, 4), np.float32), np.zeros((1, 2, 5), np.float32)
    model = _model("NonMaxSuppression", {"boxes": boxes, "scores": scores}, ["sel"], 11)
    with pytest.raises(ValueError, match=r"boxes \(1, 3, 4\) must be .* and scores \(1, 2, 5\)"):
        OnnxRunner(model)({"boxes": boxes, "scores": scores})


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("sorted_", [0, 1])
def test_unique_matches_onnxruntime(axis, sorted_):
    rng = np.random.default_rng(5)
    x = rng.integers(0, 3, (6, 5, 4)).astype(np.float32)
    x[3] = x[1]  # repeated slices along each axis, so axis cases find duplicates
    x[:, 4] = x[:, 0]
    x[..., 2] = x[..., 0]
    attrs = {"sorted": sorted_} if axis is None else {"sorted": sorted_, "axis": axis}
    ours, ref = _both("Unique", {"x": x}, ["y", "indices", "inverse", "counts"], 11, **attrs)
    assert len(ours[0].reshape(-1)) < x.size
    for a, b in zip(ours, ref):
        np.testing.assert_array_equal(a, b)
