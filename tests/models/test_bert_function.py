"""BERT's layer is a @function over its weights: traced once for every layer, with the states it gave before."""

import numpy as np
from fusegrad import Tensor
from fusegrad.models import bert
from fusegrad.models.bert import BertConfig, BertModel
from fusegrad.nn.state import get_state_dict


def states(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    Tensor.manual_seed(0)
    cfg = BertConfig(50, 32, 3, 4, 48, 16)
    model = BertModel(cfg)
    rng = np.random.default_rng(0)
    for _, t in sorted(get_state_dict(model).items()):
        t.assign(Tensor(rng.standard_normal(t.shape).astype(np.float32) * 0.3)).realize()
    return model(ids, mask).numpy()


def test_the_layer_is_traced_once_and_changes_no_state(monkeypatch):
    ids = np.random.default_rng(1).integers(0, 50, (2, 9))
    mask = np.ones((2, 9), np.int32)
    mask[1, 6:] = 0
    bert._bert_layer.traces.clear()
    traced = states(ids, mask)
    assert len(bert._bert_layer.traces) == 1
    monkeypatch.setattr(bert, "_bert_layer", bert._bert_layer.fxn)
    np.testing.assert_allclose(traced, states(ids, mask), atol=0, rtol=0)
    assert np.abs(traced).max() > 0.1
