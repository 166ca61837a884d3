"""ONNX's backend conformance suite (node cases, the light real models, simple and pytorch-converted/-operator
models) run on fusegrad. The whole suite is slow; conftest.py keeps a fast sample unmarked and deselects the cases
tests/onnx/exclusions.py lists (each with its reason) and the CUDA copies of every case."""

import onnx.backend.test

from onnx_backend import FusegradBackend

backend_test = onnx.backend.test.BackendTest(FusegradBackend, __name__)
globals().update(backend_test.test_cases)
