"""The light real models (the onnx package's small-weight ResNet-50, Inception, DenseNet, ...) on fusegrad against
onnxruntime: every output within 1e-4."""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from fusegrad.onnx import OnnxRunner

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = sorted(f for f in os.listdir(LIGHT) if f.endswith(".onnx"))


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_light_model_matches_onnxruntime(name):
    path = os.path.join(LIGHT, name)
    model = onnx.load(path)
    inits = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(0)
    feeds = {
        v.name: rng.random([d.dim_value for d in v.type.tensor_type.shape.dim], dtype=np.float32)
        for v in model.graph.input
        if v.name not in inits
    }
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ref = sess.run(None, feeds)
    got = OnnxRunner(model)(feeds)
    assert len(got) == len(ref)
    for r, g in zip(ref, got.values()):
        np.testing.assert_allclose(g.numpy(), r, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_exported_bert_matches_onnxruntime(tmp_path):
    from bert_export import export_bert

    path = str(tmp_path / "bert.onnx")
    export_bert(path)
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 1000, (1, 32)).astype(np.int64), "attention_mask": np.ones((1, 32), np.int64)}
    feeds["attention_mask"][0, 20:] = 0  # padding positions exercise the additive mask
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = OnnxRunner(path)(feeds)["last_hidden_state"].numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
