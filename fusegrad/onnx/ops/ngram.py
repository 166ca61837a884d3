"""TfIdfVectorizer on integer token ids: each pooled n-gram's count, gathered with skips, as equality tests over
shifted slices of the input summed along the sequence."""

from __future__ import annotations

import numpy as np

from fusegrad import Tensor
from fusegrad.dtype import dtypes
from fusegrad.onnx.registry import T, check, op

_MODES = ("TF", "IDF", "TFIDF")


@check("TfIdfVectorizer")
def _check_tfidf(n) -> None:
    if n.a("pool_strings"):
        raise NotImplementedError(f"{n}: TfIdfVectorizer pool_strings: strings are not supported, only pool_int64s")
    if n.a("mode", "TF") not in _MODES:
        raise NotImplementedError(f"{n}: TfIdfVectorizer mode {n.a('mode')!r} is not one of {_MODES}")


def _pool(n) -> dict[int, np.ndarray]:
    """The pooled n-grams of each length: {length: (count, length) ids}, cut at ngram_counts' starts."""
    pool = np.asarray(n.a("pool_int64s") or [], np.int64)
    starts = list(n.a("ngram_counts") or [0])
    out = {}
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(pool)
        if end > start:
            out[i + 1] = pool[start:end].reshape(-1, i + 1)
    return out


def _counts(x: Tensor, grams: np.ndarray, skip: int) -> Tensor:
    """(..., len(grams)) times each gram appears in x's last axis with `skip` items between its elements."""
    length, gap, size = grams.shape[1], skip + 1, x.shape[-1]
    span = (length - 1) * gap
    if span >= size:
        return Tensor.zeros(*x.shape[:-1], len(grams), dtype=dtypes.float32)
    hit = None
    for j in range(length):
        part = x[..., j * gap : size - span + j * gap].unsqueeze(-2)  # (..., 1, positions)
        eq = part == Tensor(grams[:, j].reshape(-1, 1)).cast(x.dtype)
        hit = eq if hit is None else hit & eq
    return hit.cast(dtypes.float32).sum(-1)


@op("TfIdfVectorizer")
def tfidf_vectorizer(n, x):
    x = T(x)
    lo, hi, max_skip = n.a("min_gram_length"), n.a("max_gram_length"), n.a("max_skip_count", 0)
    indexes = np.asarray(n.a("ngram_indexes"), np.int64)
    weights = np.asarray(n.a("weights") or [1.0] * len(indexes), np.float32)
    pools, counts = _pool(n), []
    for length in sorted(pools):
        grams = pools[length]
        if lo <= length <= hi:
            # a unigram has no gaps, so it is counted once whatever max_skip_count is
            parts = [_counts(x, grams, s) for s in range(max_skip + 1 if length > 1 else 1)]
            total = parts[0]
            for p in parts[1:]:
                total = total + p
        else:
            total = Tensor.zeros(*x.shape[:-1], len(grams), dtype=dtypes.float32)
        counts.append(total)
    tf = counts[0].cat(*counts[1:], dim=-1) if len(counts) > 1 else counts[0]
    mode = n.a("mode", "TF")
    scaled = tf if mode == "TF" else (tf.minimum(1) if mode == "IDF" else tf) * Tensor(weights)
    # the pooled n-gram i lands at output coordinate ngram_indexes[i]
    place = np.zeros((len(indexes), int(indexes.max()) + 1), np.float32)
    place[np.arange(len(indexes)), indexes] = 1
    return scaled.matmul(Tensor(place))
