"""ONNX ops grouped by kind; importing this package registers every op in the table of registry.py."""

from fusegrad.onnx.ops import elementwise, reduce, shape, indexing, nn, rnn, quant, control, contrib, misc, sequence  # noqa: F401
