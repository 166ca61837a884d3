"""ONNX ops grouped by kind; importing this package registers every op in the table of registry.py."""

from fusegrad.onnx.ops import contrib, control, elementwise, indexing, misc, nn, quant, reduce, rnn  # noqa: F401
from fusegrad.onnx.ops import detection, mixers, ngram, sampling, sequence, shape  # noqa: F401
