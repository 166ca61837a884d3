"""LLaMA's dense feed-forward residual is a @function over float weights: traced once for every layer, with the
logits it gave before; quantized weights keep the plain path."""

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the test extra installs transformers")

from gguf_models import make_model, write_gguf  # noqa: E402

from fusegrad.models import llama  # noqa: E402
from fusegrad.models.llama import Llama  # noqa: E402


def logits(path) -> np.ndarray:
    model, _ = Llama.from_gguf(path, progress=False)
    return model.forward(np.arange(9) * 5 % 128, 0).numpy()


@pytest.mark.parametrize("qtype,traces", [(None, 1), pytest.param("Q8_0", 0, marks=pytest.mark.slow)])  # Q8_0: CI
def test_the_ffn_residual_is_traced_once_and_changes_no_logit(tmp_path, monkeypatch, qtype, traces):
    write_gguf(make_model("llama", num_hidden_layers=3), "llama", tmp_path / "m.gguf", qtype)
    llama._ffn_residual.traces.clear()
    traced = logits(tmp_path / "m.gguf")
    assert len(llama._ffn_residual.traces) == traces
    monkeypatch.setattr(llama, "_ffn_residual", llama._ffn_residual.fxn)
    np.testing.assert_allclose(traced, logits(tmp_path / "m.gguf"), atol=0, rtol=0)
    assert np.abs(traced).max() > 0.1
